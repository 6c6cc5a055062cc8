/* The cache image code's parts (private to cache_image.c, cache_meta.c and
 * cache_walk.c), and the calls one makes into another (named ci_*).
 * cache_image.h is the interface; this is not.
 *
 *   cache_meta.c  what a cache holds: the metadata of its files, the
 *                 manifest and labels made from it, and reading it back
 *                 out of a layer
 *   cache_walk.c  walking a cache directory in a stable order, what a
 *                 cache image may carry, the scan of a directory
 *   cache_image.c writing the layer, the image config, the build and push */
#ifndef GKM_CACHE_IMAGE_IMPL_H
#define GKM_CACHE_IMAGE_IMPL_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "cache_image.h"
#include "oci_err.h"

/* One entry met by the walk: opened, when it is, through dirfd and name
 * only, never by a path a writer could redirect through a link. */
struct walk_entry {
	const char *rel; /* path below the root */
	const char *full;
	int dirfd;
	const char *name;
	struct stat st;
	char link[PATH_MAX]; /* a symlink's target (trusted walks only) */
};

struct walk_ctx {
	/* called for every entry below the root, parents first: 0 go on (into
	 * a directory), 1 leave the entry out, -errno stop */
	int (*visit)(struct walk_ctx *w, struct walk_entry *e);
	struct oci_err *err;
	const struct cache_walk_rules *rules; /* NULL: trusted */
	const char *root;
	uint64_t entries, bytes, stamp;
};

/* cache_meta.c */
const char *ci_fmt_prefix(enum cache_format f);

/* cache_walk.c */
int ci_walk_root(struct walk_ctx *w, const char *dir);
int ci_open_entry(struct walk_ctx *w, const struct walk_entry *e, int *out);
int ci_check_unchanged(struct walk_ctx *w, const struct walk_entry *e, int fd);
int ci_admit(struct walk_ctx *w, struct walk_entry *e);
char *ci_read_small_json(const struct walk_entry *e, int fd, size_t *len);
int ci_check_found(const char *dir, const struct cache_meta *m, struct oci_err *err);

#endif
