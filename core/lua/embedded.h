/* Files compiled into the binary (lua/ and policies/), see core/embed.sh. */
#ifndef GKM_EMBEDDED_H
#define GKM_EMBEDDED_H

#include <stddef.h>

struct embedded_file {
	const char *name; /* repository path, e.g. "policies/compat.lua" */
	const char *data; /* not NUL-terminated; static storage */
	size_t size;
};

/* Terminated by an entry whose name is NULL. */
extern const struct embedded_file gkm_embedded[];

#endif
