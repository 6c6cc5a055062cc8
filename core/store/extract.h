/* Safe, streaming extraction of OCI image layers (tar, tar+gzip, tar+zstd)
 * into a destination directory.
 *
 * One extraction session covers every layer of an image: layers are applied
 * in order with OCI whiteouts (`.wh.<name>` removes <name> from lower layers,
 * `.wh..wh..opq` empties its directory of what lower layers put there).
 *
 * Nothing in a layer is trusted. An entry is refused, and the whole
 * extraction fails, when it has
 *   - an absolute path, a `..` component, an empty or over-long name (an
 *     entry named "/" is the root directory, as umoci writes it; only a
 *     directory may name the root);
 *   - a path that passes through a symlink (nothing is ever written through
 *     a link: every file is created from a directory fd with O_NOFOLLOW and
 *     O_EXCL, every parent is opened with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS);
 *   - a symlink whose target is absolute or resolves outside the tree (checked
 *     when the entry is read, and again over the finished tree in
 *     extract_finish(), so links made in any order cannot chain outside);
 *   - a hard link whose target is absolute, has `..`, or is not in the tree;
 *   - a type other than regular file, directory, symlink or hard link
 *     (character and block devices, FIFOs, sockets);
 *   - a setuid or setgid bit (refused, not stripped: a cache has no use for
 *     them, and silently changing a mode would hide a tampered image);
 *   - more bytes than the per-entry cap, or a tree over the total byte or
 *     entry count caps, or a stream whose uncompressed/compressed ratio
 *     passes the ratio cap (decompression bombs).
 * The error message names the entry and the rule, e.g.
 *   refused entry 'a/../../etc/passwd': path escapes the tree
 *
 * Modes (permission bits and the sticky bit) and mtimes are kept; owners are
 * not (files belong to the extracting user). Directory modes and mtimes are
 * applied in extract_finish(), after their contents are written.
 *
 * Compression is detected from the stream's magic bytes and decoded here
 * (gzip, zstd, none); libarchive parses the uncompressed tar stream. A layer
 * that ends without the tar end-of-archive blocks (some writers omit them) is
 * accepted when its last entry's data is complete; an entry cut short is an
 * error. Memory stays bounded whatever the layer size: no whole-layer or
 * whole-entry buffers.
 *
 * Not thread-safe: one session is used by one thread at a time. */
#ifndef GKM_EXTRACT_H
#define GKM_EXTRACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct extract_limits {
	uint64_t max_total_bytes; /* sum of regular-file sizes over all layers */
	uint64_t max_entries;     /* entries (of any type) over all layers */
	uint64_t max_entry_bytes; /* one regular file */
	uint32_t max_ratio;       /* uncompressed bytes / compressed bytes, per layer */
	uint64_t ratio_grace;     /* the ratio is only checked past this many uncompressed bytes */
};

/* Defaults: 64 GiB total, 1,000,000 entries, 16 GiB per entry, ratio 200
 * checked past 32 MiB. */
void extract_limits_default(struct extract_limits *out);

struct extract_stats {
	uint64_t bytes; /* regular-file bytes written */
	uint64_t files; /* regular files (hard links count once) */
	uint64_t dirs;
	uint64_t symlinks;
	uint64_t hardlinks;
	uint64_t whiteouts;        /* whiteout entries applied */
	uint64_t entries;          /* tar entries read */
	uint64_t compressed_bytes; /* bytes taken from the read callbacks */
	uint64_t tar_bytes;        /* uncompressed tar stream bytes */
	uint32_t layers;
};

/* Pull-model source: fill buf with up to len bytes; return the count (> 0),
 * 0 at end of stream, or -errno (the extraction then fails with that code).
 * The caller verifies the blob digest in this callback; a layer is only
 * "complete" when the callback returned 0, i.e. the whole blob was seen.
 * For a compressed layer the callback is called from a decoding thread that
 * extract_layer() starts and joins (never two calls at once). */
typedef ssize_t (*extract_read_fn)(void *ctx, void *buf, size_t len);

struct extract;

/* Start a session writing under dirfd (borrowed, must stay open until
 * extract_free(); the directory should be empty and private to this session).
 * limits may be NULL for the defaults. Caller frees with extract_free(). */
__attribute__((warn_unused_result)) int extract_new(int dirfd, const struct extract_limits *limits,
                                                    struct extract **out);

/* Apply one layer read from fn/ctx. Returns 0, or -errno with a message in
 * extract_error(): -EPERM refused entry (message names it and the rule),
 * -EFBIG a size, count or ratio cap, -EBADMSG malformed or truncated
 * stream, -EPROTONOSUPPORT unknown compression, or the callback's own error.
 * After a failure the session is dead: every later call fails with -ECANCELED
 * and the caller discards the directory. */
__attribute__((warn_unused_result)) int extract_layer(struct extract *x, extract_read_fn fn,
                                                      void *ctx);

/* extract_layer() reading from fd (borrowed) to its end. */
__attribute__((warn_unused_result)) int extract_layer_fd(struct extract *x, int fd);

/* extract_layer() reading the file at path. */
__attribute__((warn_unused_result)) int extract_layer_file(struct extract *x, const char *path);

/* Push-model source, for producers that get bytes in callbacks (libcurl's
 * write function): extraction runs on a helper thread that pulls from a
 * bounded buffer. extract_push_write() copies len bytes in, blocking while
 * the buffer is full; it returns 0, or the extraction's -errno as soon as it
 * has failed (stop sending then). extract_push_end() marks end of stream
 * (eof true) or abandons it (eof false: the layer fails with -ECANCELED),
 * waits for the thread and returns what extract_layer() returned. Every
 * push_begin must be matched by one push_end, which frees p. */
struct extract_push;
__attribute__((warn_unused_result)) int extract_push_begin(struct extract *x,
                                                           struct extract_push **out);
__attribute__((warn_unused_result)) int extract_push_write(struct extract_push *p, const void *buf,
                                                           size_t len);
__attribute__((warn_unused_result)) int extract_push_end(struct extract_push *p, bool eof);

/* After the last layer: re-check every symlink in the finished tree, then
 * apply directory modes and mtimes. Returns 0 or -errno (extract_error()).
 * Nothing is synced to disk here; the content store does that. */
__attribute__((warn_unused_result)) int extract_finish(struct extract *x);

/* Counters so far; never fails. */
void extract_get_stats(const struct extract *x, struct extract_stats *out);

/* The message of the last failure ("" if none). Borrowed; valid until the
 * next call on x or extract_free(). */
const char *extract_error(const struct extract *x);

/* Frees the session (not the files it wrote). NULL is a no-op. */
void extract_free(struct extract *x);

/* Path rule shared with the fuzz target and the tests: normalise a tar
 * entry name (strip leading "./", collapse "//" and "/./", drop a trailing
 * "/") into out (outlen bytes). Returns 0, or -EPERM with the rule that
 * failed in *rule (a static string): absolute path, `..`, empty name,
 * NUL or over-long name. "." itself (the root) normalises to "". */
__attribute__((warn_unused_result)) int extract_clean_path(const char *name, char *out,
                                                           size_t outlen, const char **rule);

/* Whether a symlink at normalised path link_path with the given target stays
 * inside the tree by lexical resolution (no filesystem access). */
bool extract_symlink_inside(const char *link_path, const char *target);

#endif
