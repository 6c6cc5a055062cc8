#include "oci_err.h"

#include <stdio.h>
#include <string.h>

void oci_errf(struct oci_err *e, const char *fmt, ...)
{
	if (!e)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
}

void oci_err_prefix(struct oci_err *e, const char *fmt, ...)
{
	if (!e)
		return;
	char head[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(head, sizeof(head), fmt, ap);
	va_end(ap);
	size_t cap = sizeof(e->msg);
	size_t hl = strlen(head);
	size_t ol = strnlen(e->msg, cap - 1);
	size_t sep = ol ? 2 : 0;
	if (hl + sep >= cap)
		hl = cap - 1 - sep;
	if (hl + sep + ol >= cap)
		ol = cap - 1 - hl - sep;
	memmove(e->msg + hl + sep, e->msg, ol);
	memcpy(e->msg, head, hl);
	if (sep)
		memcpy(e->msg + hl, ": ", 2);
	e->msg[hl + sep + ol] = '\0';
}

const char *oci_err_str(const struct oci_err *e, int rc)
{
	if (e && e->msg[0])
		return e->msg;
	return strerror(rc < 0 ? -rc : rc);
}
