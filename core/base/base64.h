/* Base64 (RFC 4648) as the tools that write gkm's inputs read it back.
 *
 * Decoding follows Go's encoding/base64 exactly, since what cosign,
 * containers/image and sigstore-go accept is defined by it:
 *  - '\n' and '\r' are ignored anywhere, even inside the padding ("YQ=\n="),
 *    so text wrapped at 64 or 76 columns (what `base64` and `openssl base64`
 *    print, and what `cosign attach signature` stores as given) decodes;
 *  - any other byte outside the alphabet is refused, spaces and tabs included;
 *  - padded dialects require the padding ("YQ" is refused), and nothing but
 *    line breaks may follow it;
 *  - unused low bits of the last character are ignored ("YR==" is "a"), as
 *    Go's non-strict encodings do.
 *
 * Dialects:
 *  - BASE64_STD is Go's base64.StdEncoding: cosign and containers/image decode
 *    the simple-signing signature annotation with it, Docker the "auth" of a
 *    credentials file, encoding/json every []byte field.
 *  - BASE64_PROTOJSON is how protobuf's JSON mapping reads a bytes field, and
 *    so how sigstore-go and cosign v3 read a sigstore bundle (DSSE payload and
 *    signatures): the URL-safe alphabet when the text holds '-' or '_', else
 *    the standard one; padding required when the length (line breaks counted)
 *    is a multiple of 4, refused otherwise. */
#ifndef GKM_BASE64_H
#define GKM_BASE64_H

#include <stddef.h>

enum base64_dialect { BASE64_STD = 1, BASE64_PROTOJSON };

/* Decode len bytes of in (NUL bytes in it are refused like any other). On
 * success *out is malloc'd (NUL-terminated, the NUL not counted in *out_len;
 * caller frees). -EINVAL on bad input, with *bad_at (may be NULL) set to the
 * offset Go's decoder reports (its CorruptInputError); -ENOMEM. */
__attribute__((warn_unused_result)) int base64_decode(const char *in, size_t len,
                                                      enum base64_dialect d, unsigned char **out,
                                                      size_t *out_len, size_t *bad_at);

/* Standard alphabet, padded, one line. Caller frees *out. */
__attribute__((warn_unused_result)) int base64_encode(const void *in, size_t len, char **out);

#endif
