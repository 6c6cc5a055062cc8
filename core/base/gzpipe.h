/* A gzip stream (gzwrite.h) compressed on a thread of its own: gzp_write()
 * copies the bytes into one of two buffers and returns while the thread
 * deflates the other, so the caller's reading and hashing run beside the
 * compression. The compressed stream is byte for byte what gzw_* write
 * from the same input. */
#ifndef GKM_GZPIPE_H
#define GKM_GZPIPE_H

#include <stddef.h>

#include "gzwrite.h"

struct gzp;

/* out is called on the compressing thread until gzp_finish() returns
 * (then on the caller's, for the stream's end), never on two at once. */
__attribute__((warn_unused_result)) int gzp_new(int level, gzw_out_fn out, void *ud,
                                                struct gzp **p);
/* 0, or the first error of out or of the compression (-errno). */
__attribute__((warn_unused_result)) int gzp_write(struct gzp *p, const void *buf, size_t len);
/* Compress what is left, stop the thread, write the stream's end. */
__attribute__((warn_unused_result)) int gzp_finish(struct gzp *p);
void gzp_free(struct gzp *p); /* NULL: no-op; stops the thread if it runs */

#endif
