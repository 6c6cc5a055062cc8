/* A blob being read from a registry or a layout directory, with its
 * digest and size checked while the bytes pass: the reader returns the
 * bytes as they come and reports end-of-blob (0) only once everything
 * arrived and matched the descriptor. A consumer that acts on bytes before
 * the end (an extractor) must write into a private place and make its work
 * visible only after oci_blob_read() returned 0.
 *
 * Not thread-safe; one reader is used by one thread. */
#ifndef GKM_OCI_BLOB_H
#define GKM_OCI_BLOB_H

#include <stdint.h>
#include <sys/types.h>

#include "oci_digest.h"
#include "oci_err.h"

struct oci_blob_reader;

struct oci_blob_source {
	/* Up to len raw bytes: >0, 0 at the end, or -errno with e filled. */
	ssize_t (*read)(void *ctx, void *buf, size_t len, struct oci_err *e);
	void (*close)(void *ctx);
	/* optional: told when the reader fails (rc and message in e, either
	 * may be changed) */
	int (*failed)(void *ctx, int rc, struct oci_err *e);
};

/* Wrap a source (ownership of ctx passes to the reader, released with
 * src->close). what names the blob in messages ("layer 0"). expect_size
 * < 0 means unknown. */
__attribute__((warn_unused_result)) int oci_blob_reader_new(const struct oci_blob_source *src,
                                                            void *ctx, const char *digest,
                                                            int64_t expect_size, const char *what,
                                                            struct oci_blob_reader **out);

/* >0 bytes read; 0 when the whole blob arrived and verified; <0 -errno with
 * the reason in oci_blob_error(): -EBADMSG for a digest mismatch, -EFBIG for
 * more bytes than the descriptor says, -EPIPE for fewer, other errors from
 * the source (-ETIMEDOUT, -ECONNRESET, -EIO...). Errors are sticky. */
ssize_t oci_blob_read(struct oci_blob_reader *r, void *buf, size_t len);
/* Read and verify whatever is left (after a consumer stopped early). */
__attribute__((warn_unused_result)) int oci_blob_drain(struct oci_blob_reader *r);
/* The message for the last error (borrowed from r). */
const char *oci_blob_error(const struct oci_blob_reader *r);
uint64_t oci_blob_bytes(const struct oci_blob_reader *r);
void oci_blob_close(struct oci_blob_reader *r);

/* Read the whole blob into memory (max bytes at most, -EFBIG beyond), verified.
 * *out is malloc'd and NUL-terminated; caller frees. The reader is closed. */
__attribute__((warn_unused_result)) int
oci_blob_slurp(struct oci_blob_reader *r, size_t max, char **out, size_t *len, struct oci_err *err);

/* read(2) on the fd in ctx ((void *)(intptr_t)fd), EINTR retried, -errno. */
ssize_t oci_fd_read(void *ctx, void *buf, size_t len);

/* A source reading a file descriptor (which the source closes). */
extern const struct oci_blob_source oci_blob_fd_source;

#endif
