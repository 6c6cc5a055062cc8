/* A gzip stream for image layers: the data goes through isa-l's deflate in
 * chunks of GZW_CHUNK bytes, and a chunk that compression barely shrinks
 * (packed binaries, already-compressed files) is written as a stored block
 * instead. Every inflater reads stored blocks at memory-copy speed, where
 * Huffman-coded literals cost it several times more: the layer is no
 * larger, and nodes extract it faster. */
#ifndef GKM_GZWRITE_H
#define GKM_GZWRITE_H

#include <stddef.h>
#include <stdint.h>

#define GZW_CHUNK 65535u /* the most one stored block holds */

/* Where the compressed bytes go: 0 or -errno (which gzw_* then return). */
typedef int (*gzw_out_fn)(void *ud, const void *buf, size_t len);

struct gzw;

/* level: isa-l's 0..3 (others: 1). */
__attribute__((warn_unused_result)) int gzw_new(int level, gzw_out_fn out, void *ud,
                                                struct gzw **w);
__attribute__((warn_unused_result)) int gzw_write(struct gzw *w, const void *buf, size_t len);
/* The last chunk, the final block and the trailer (CRC-32, size). */
__attribute__((warn_unused_result)) int gzw_finish(struct gzw *w);
/* Chunks written stored, of all chunks (after gzw_finish). */
void gzw_counts(const struct gzw *w, uint64_t *stored, uint64_t *chunks);
void gzw_free(struct gzw *w); /* NULL: no-op */

#endif
