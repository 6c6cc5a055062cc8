/* Error text for the OCI layer: every failure names what went wrong (which
 * blob, which header, which rule) so that a user reading a log or a status
 * condition knows what to fix. Functions that can fail take a struct oci_err *
 * (may be NULL) next to their -errno return. */
#ifndef GKM_OCI_ERR_H
#define GKM_OCI_ERR_H

#include <stdarg.h>

struct oci_err {
	char msg[768];
};

/* Replace the message. */
void oci_errf(struct oci_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Put context in front of the existing message: "fmt: old". */
void oci_err_prefix(struct oci_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message, or a generic text for rc when none was set. Borrowed from e. */
const char *oci_err_str(const struct oci_err *e, int rc);

#endif
