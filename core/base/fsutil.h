/* Small file-system helpers shared by the store, the views and standalone
 * mode. All return 0 or -errno. */
#ifndef GKM_FSUTIL_H
#define GKM_FSUTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Whole file (or stream: a pipe, /dev/stdin) into a NUL-terminated buffer
 * (caller frees); -EFBIG over max. */
__attribute__((warn_unused_result)) int fsutil_read_file(const char *path, size_t max, char **out,
                                                         size_t *len);
/* The same from an open descriptor, read from its current offset to EOF
 * (the descriptor stays open). */
__attribute__((warn_unused_result)) int fsutil_read_fd(int fd, size_t max, char **out, size_t *len);
/* Write a complete file: temporary file in the same directory, fsync,
 * rename over path, fsync the directory. Readers see the old or the new
 * content, never a part. */
__attribute__((warn_unused_result)) int fsutil_write_atomic(const char *path, const void *data,
                                                            size_t len, mode_t mode);
/* The same without either fsync: readers still see the old or the new
 * content, but a power loss may bring the old back (or leave an empty file
 * where there was none, or an empty one replacing it). Only for files whose
 * loss a reader refuses safely and a writer writes again. */
__attribute__((warn_unused_result)) int fsutil_write_replace(const char *path, const void *data,
                                                             size_t len, mode_t mode);
/* All of buf to fd, write(2) after write(2) (EINTR retried). */
__attribute__((warn_unused_result)) int fsutil_write_all(int fd, const void *buf, size_t len);
/* mkdir -p. */
__attribute__((warn_unused_result)) int fsutil_mkdirs(const char *path, mode_t mode);
/* Append one line (a '\n' is added) with a single write(2) under O_APPEND. */
__attribute__((warn_unused_result)) int fsutil_append_line(const char *path, const char *line);

/* Everything rd gives (a count, 0 at the end, -errno) into a NUL-terminated
 * buffer of at most max bytes, -EFBIG past it; hint: the size expected (0:
 * unknown). Caller frees *out. */
__attribute__((warn_unused_result)) int
fsutil_slurp(ssize_t (*rd)(void *ctx, void *buf, size_t len), void *ctx, size_t max, size_t hint,
             char **out, size_t *len);

#endif
