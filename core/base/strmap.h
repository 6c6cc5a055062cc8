/* A hash map from strings to pointers (open addressing, linear probing).
 *
 * Keys are borrowed: each must stay valid and unchanged while it is in the
 * map (typically it lives inside its value). Values are the caller's. One
 * thread; no put or del while iterating. */
#ifndef GKM_STRMAP_H
#define GKM_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct strmap_slot {
	const char *key; /* NULL: free */
	void *val;
	uint32_t hash;
};

struct strmap {
	struct strmap_slot *slots;
	size_t cap, len;
};

#define STRMAP_INIT                                                                                \
	{                                                                                          \
		NULL, 0, 0                                                                         \
	}

uint32_t strmap_hash(const char *s);
/* The value of key, or NULL. */
void *strmap_get(const struct strmap *m, const char *key);
/* Set key -> val (val not NULL), replacing the key and value of an equal
 * key. 0 or -ENOMEM (the map is unchanged). */
__attribute__((warn_unused_result)) int strmap_put(struct strmap *m, const char *key, void *val);
/* Remove key; its value, or NULL when absent. */
void *strmap_del(struct strmap *m, const char *key);
/* Iterate: *pos starts at 0; false at the end. */
bool strmap_next(const struct strmap *m, size_t *pos, const char **key, void **val);
/* Release the table (not the keys or values); the map is empty after. */
void strmap_clear(struct strmap *m);

#endif
