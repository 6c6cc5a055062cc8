/* Interned strings: one reference-counted copy of each distinct string, for
 * values repeated across many records (the digests, states, messages and
 * GPU sets that a thousand nodes report alike). Two interned strings of one
 * table are equal exactly when their pointers are. One thread. */
#ifndef GKM_INTERN_H
#define GKM_INTERN_H

#include <stddef.h>

#include "strmap.h"

struct intern {
	struct strmap map;
	size_t bytes; /* of the distinct strings */
};

#define INTERN_INIT                                                                                \
	{                                                                                          \
		STRMAP_INIT, 0                                                                     \
	}

/* The interned copy of s with one more reference (release it with
 * intern_put), or NULL when out of memory. */
const char *intern_get(struct intern *t, const char *s);
/* One more reference to an interned string (NULL: no-op); returns s. */
const char *intern_ref(const char *s);
/* Drop a reference from intern_get/intern_ref; the last one frees it. NULL: no-op. */
void intern_put(struct intern *t, const char *s);
/* Distinct strings held. */
size_t intern_count(const struct intern *t);
/* Release the table; every string must have been put already. */
void intern_clear(struct intern *t);

#endif
