/* The node's content store: one extracted copy of each image, keyed by the
 * image manifest digest, shared by every cache that names that digest.
 *
 * Layout under the root (default /var/lib/gkm/store), all one filesystem:
 *   sha256/<hex>/                 the extracted tree (what views point to)
 *   meta/sha256-<hex>.json        size accounting, written atomically
 *   locks/sha256-<hex>.lock       flock(2) per digest, held while pulling,
 *                                 committing or removing that digest
 *   tmp/sha256-<hex>.<random>/    extraction in progress
 *   tmp/trash.<random>/           an entry being deleted
 *
 * An entry appears by rename(2) of a complete, synced temp tree, so a half
 * extracted tree is never visible under sha256/. An entry is present when its
 * tree and its metadata both exist (metadata is written before the rename).
 * store_open() removes what a crash left: temp and trash dirs nobody holds a
 * lock for, metadata without a tree, and trees without metadata.
 *
 * Concurrency: any number of processes and threads may use one root. Two
 * pulls of the same digest serialise on its lock; the second then finds the
 * entry present (-EEXIST from store_begin()). GC and removal skip a digest
 * whose lock is held. A struct store is safe to share between threads.
 *
 * Digests are "sha256:" followed by 64 lowercase hex digits; anything else
 * is -EINVAL. */
#ifndef GKM_STORE_H
#define GKM_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "extract.h"

#define STORE_DEFAULT_ROOT "/var/lib/gkm/store"
#define STORE_DIGEST_MAX 72 /* "sha256:" + 64 hex + NUL, rounded */

struct store;

struct store_entry_info {
	char digest[STORE_DIGEST_MAX];
	uint64_t bytes; /* regular-file bytes */
	uint64_t files; /* regular files */
	uint64_t dirs;  /* directories, not counting the root */
	uint64_t symlinks;
	uint64_t layers;
	int64_t created;   /* unix seconds of the commit */
	int64_t last_used; /* unix seconds: the commit, or the last store_touch() */
};

/* Open (creating the directories if needed) the store at root (NULL for
 * STORE_DEFAULT_ROOT) and clean crash leftovers. Caller frees with
 * store_close(). -errno on failure (-ENOTDIR, -EACCES, ...). */
__attribute__((warn_unused_result)) int store_open(const char *root, struct store **out);
void store_close(struct store *s);

/* The root path. Borrowed until store_close(). */
const char *store_root(const struct store *s);

/* Whether d is a well-formed "sha256:<64 lowercase hex>" digest. */
bool store_digest_valid(const char *d);

/* Present entry: 0 and *out filled; -ENOENT if absent; -EINVAL bad digest;
 * -EIO if the metadata file is unreadable or malformed. out may be NULL. */
__attribute__((warn_unused_result)) int store_lookup(struct store *s, const char *digest,
                                                     struct store_entry_info *out);

/* Absolute path of the entry's tree (whether or not it exists) into buf.
 * 0, -EINVAL, or -ENAMETOOLONG. */
__attribute__((warn_unused_result)) int store_entry_path(const struct store *s, const char *digest,
                                                         char *buf, size_t len);

/* Record that the entry was used now (its last_used; the metadata file's
 * modification time, so that it survives restarts). -ENOENT if absent. */
__attribute__((warn_unused_result)) int store_touch(struct store *s, const char *digest);

/* ---- adding an entry ---- */

struct store_txn;

enum store_begin_flags {
	STORE_NOWAIT = 1 << 0, /* -EWOULDBLOCK instead of waiting for another pull */
};

/* Take the digest's lock (waiting unless STORE_NOWAIT) and make a temp dir.
 * -EEXIST if the entry is already present (nothing to do: store_lookup()).
 * limits (NULL for defaults) bound the extraction. On success the caller
 * extracts every layer through store_txn_extract() then calls store_commit()
 * or store_abort(), exactly one of them. */
__attribute__((warn_unused_result)) int store_begin(struct store *s, const char *digest,
                                                    const struct extract_limits *limits,
                                                    unsigned flags, struct store_txn **out);

/* The extraction session writing into the temp dir: borrowed, valid until
 * commit or abort. Use extract_layer()/extract_push_*() on it, once per layer
 * in order. Do not call extract_finish() or extract_free() on it. */
struct extract *store_txn_extract(struct store_txn *t);

/* Finish extraction (extract_finish()), sync the tree to disk, write the
 * metadata, rename the tree into place, release the lock and free t.
 * 0 and *out (may be NULL) filled; on any failure the temp tree is removed,
 * t is freed too, and -errno is returned with the reason in *errbuf
 * (errbuf may be NULL; extraction refusals keep their message). */
__attribute__((warn_unused_result)) int
store_commit(struct store_txn *t, struct store_entry_info *out, char *errbuf, size_t errlen);

/* Discard the temp tree, release the lock and free t. NULL is a no-op. */
void store_abort(struct store_txn *t);

/* ---- listing and removal ---- */

/* Call fn for every present entry (order unspecified). fn returns 0 to go
 * on, anything else stops the walk and is returned. */
typedef int (*store_each_fn)(void *ctx, const struct store_entry_info *e);
__attribute__((warn_unused_result)) int store_each(struct store *s, store_each_fn fn, void *ctx);

/* Remove one entry unless its lock is held (-EBUSY). The tree is first
 * renamed out of sha256/ (so it disappears at once), then deleted.
 * -ENOENT if absent. */
__attribute__((warn_unused_result)) int store_remove(struct store *s, const char *digest);

/* Keep-guard for GC: return true if the entry must stay (some cache names
 * it, or a pod uses it). Called without any store lock held. */
typedef bool (*store_keep_fn)(void *ctx, const char *digest);

struct store_gc_stats {
	uint64_t kept; /* guard said keep, or younger than min_age_s */
	uint64_t busy; /* lock held by a pull or another removal */
	uint64_t removed;
	uint64_t bytes_removed; /* from the metadata of removed entries */
	uint64_t failed;        /* removal errors (logged) */
};

/* Remove every entry the guard does not keep and that was committed at
 * least min_age_s seconds ago (so a fresh pull whose view is not written yet
 * survives). keep may be NULL (then only the age protects). 0 and *out
 * filled (out may be NULL), or -errno if the store could not be listed. */
__attribute__((warn_unused_result)) int store_gc(struct store *s, store_keep_fn keep, void *ctx,
                                                 int64_t min_age_s, struct store_gc_stats *out);

#endif
