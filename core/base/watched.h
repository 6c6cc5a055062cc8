/* Content fingerprints of the files the webhook watches (certificate, key,
 * trusted keys, configuration, policies), polled from the loop to notice
 * changes however they are made: edited in place, replaced by rename, or
 * swapped under a Kubernetes volume's "..data" symlink. */
#ifndef GKM_WATCHED_H
#define GKM_WATCHED_H

#include <stddef.h>

#define WATCHED_MAX_FILES 256
#define WATCHED_MAX_FILE (1u << 20)

/* One file of a watched source, read whole. */
struct watched_file {
	char name[256]; /* base name */
	char *data;     /* NUL-terminated */
	size_t len;
};

struct watched_files {
	struct watched_file *f; /* sorted by name */
	size_t n;
	char digest[65]; /* sha256 hex over names and contents */
};

/* Read path: a regular file, or every regular file directly in a directory
 * whose name does not start with '.' (symlinks followed, so a mounted
 * ConfigMap or Secret reads as its keys). At most WATCHED_MAX_FILES files of
 * WATCHED_MAX_FILE bytes. 0, or -errno with err naming the file and problem.
 * Caller releases out with watched_files_clear(). */
__attribute__((warn_unused_result)) int watched_read(const char *path, struct watched_files *out,
                                                     char *err, size_t errlen);
void watched_files_clear(struct watched_files *w);

/* Only the digest (the files are read and dropped). */
__attribute__((warn_unused_result)) int watched_digest(const char *path, char out[65], char *err,
                                                       size_t errlen);

/* sha256 hex of a buffer. 0 or -ENOMEM. */
__attribute__((warn_unused_result)) int watched_hash(const void *buf, size_t len, char out[65]);

#endif
