/* Error messages into a caller's buffer (char *err, size_t errlen): how
 * gkm's functions that can fail say why. */
#ifndef GKM_ERRBUF_H
#define GKM_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>

/* Format into err; a NULL err or zero errlen is fine (nothing written). */
void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with a va_list, for functions that format on a caller's behalf. */
void errbuf_vset(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Name a directory as the reader knows it: every occurrence of path in err
 * that is a whole path or its prefix up to a '/' becomes as (a message of
 * a process that reached the directory through a descriptor, such as
 * /proc/self/fd/3, tells where it really is). Cut at errlen. */
void errbuf_rename_path(char *err, size_t errlen, const char *path, const char *as);

#endif
