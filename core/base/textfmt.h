/* Text forms shared by every layer: RFC 3339 times (as Kubernetes, OCI and
 * sigstore write them), quantities of bytes and lowercase hex. */
#ifndef GKM_TEXTFMT_H
#define GKM_TEXTFMT_H

#include <stddef.h>
#include <stdint.h>

/* Long enough for "YYYY-MM-DDTHH:MM:SSZ" and its NUL. */
#define RFC3339_MAX 32

/* t (seconds since the epoch) as "YYYY-MM-DDTHH:MM:SSZ"; "" when it does
 * not fit or t is out of range. */
void rfc3339_format(int64_t t, char *buf, size_t cap);
/* Now, as rfc3339_format writes it. */
void rfc3339_now(char *buf, size_t cap);
/* "YYYY-MM-DDTHH:MM:SS", optional fraction, then "Z" or "+HH:MM"/"-HH:MM",
 * and nothing after: 0 with *out the seconds since the epoch, else -EINVAL. */
int rfc3339_parse(const char *s, int64_t *out);

/* A Kubernetes quantity of bytes ("10Gi", "512Mi", "1G", "1000"): 0 and
 * *out, or -EINVAL (no fractions, no exponents, nothing after the unit). */
__attribute__((warn_unused_result)) int quantity_parse_bytes(const char *s, uint64_t *out);

/* The n bytes of b as 2n lowercase hex digits and a NUL in out. */
void hex_encode(const unsigned char *b, size_t n, char *out);

#endif
