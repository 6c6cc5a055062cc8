#include "errbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void errbuf_vset(char *err, size_t errlen, const char *fmt, va_list ap)
{
	if (err && errlen > 0)
		vsnprintf(err, errlen, fmt, ap);
}

void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	errbuf_vset(err, errlen, fmt, ap);
	va_end(ap);
}

void errbuf_rename_path(char *err, size_t errlen, const char *path, const char *as)
{
	size_t pl = strlen(path), al = strlen(as), n = 0;
	char *out = err && errlen && pl ? malloc(errlen) : NULL;
	if (!out)
		return;
	for (const char *p = err; *p && n + 1 < errlen;) {
		char next = p[pl];
		if (strncmp(p, path, pl) == 0 && (next == '/' || next == '\0' || next == ' ' ||
		                                  next == ':' || next == '\'' || next == ',')) {
			size_t w = al < errlen - 1 - n ? al : errlen - 1 - n;
			memcpy(out + n, as, w);
			n += w;
			p += pl;
		} else {
			out[n++] = *p++;
		}
	}
	out[n] = '\0';
	memcpy(err, out, n + 1);
	free(out);
}
