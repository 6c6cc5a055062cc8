/* The extractor's parts (private to core/store/extract*.c): the session,
 * the decoding source, and the calls one part makes into another (named
 * ex_*). extract.h is the interface; this is not.
 *
 *   extract.c        the session, path rules, a layer's tar loop, finishing
 *                    (symlinks re-checked, directory modes), the push model
 *   extract_decode.c the decoding source: gzip, zstd or plain, the decoder
 *                    thread and its ring, the caps, the padded end
 *   extract_write.c  writing entries: parents, files, directories, links,
 *                    whiteouts; the checks of each entry */
#ifndef GKM_EXTRACT_IMPL_H
#define GKM_EXTRACT_IMPL_H

#include <archive.h>
#include <archive_entry.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <zstd.h>

#include "extract.h"
#include "strmap.h"

#define IN_BUF (256u * 1024)
/* The decoder ring: 1 MiB in all. Inflating is the slower stage, so the
 * ring only has to absorb bursts of small files on the writing side; 4 MiB
 * extracted no faster and cost 3 MiB of RSS. */
#define RING_SLOTS 4
#define SLOT_BUF (256u * 1024)
#define PATH_BUF 4096
#define PUSH_BUF (1024u * 1024)
#define MAX_LINK_HOPS 40

struct dirattr {
	char *path;
	mode_t mode;
	struct timespec mtime;
	bool has_mtime;
	size_t seq;
};

struct extract {
	int root;
	struct extract_limits lim;
	struct extract_stats st;
	bool dead, finished;
	char err[1024];

	struct dirattr *dirs;
	size_t ndirs, capdirs;
	char **links; /* symlinks written, re-checked in extract_finish() */
	size_t nlinks, caplinks;

	struct strmap created; /* this layer's paths, only when a layer lies below */
	bool below;

	char ppath[PATH_BUF]; /* cached parent directory */
	int pfd;
	uint64_t last_end; /* stream offset where the last entry's data ends */
	int umask;         /* the process umask, or -1 if unknown (then always fchmod) */
};

enum comp { COMP_NONE, COMP_GZIP, COMP_ZSTD };

struct ring;

/* While a ring's decoder runs it alone uses the fields from fn to errmsg;
 * the parser reads them only once ring_take() has reported the end, or
 * after ring_stop(). */
struct source {
	struct extract *x;
	struct ring *ring; /* NULL for a plain tar, read on the parser's thread */
	extract_read_fn fn;
	void *ctx;
	enum comp comp;
	unsigned char *in;
	size_t in_pos, in_len;
	bool in_eof;
	struct inflate_state *gz;
	bool gz_done;
	ZSTD_DStream *zs;
	size_t zs_last;
	uint64_t compressed, tar, tar_cap, last_nonzero;
	bool read_failed; /* err came from the read callback */
	int err;
	char errmsg[256];
	/* the parser's own */
	bool failed;       /* src_read() reported err to libarchive */
	bool eof;          /* real data ended: tar is the real end */
	uint64_t pad_left; /* synthetic zeros still to hand out */
};

/* extract.c */
int ex_fail(struct extract *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *ex_shown(const char *name, char *buf, size_t len);
int ex_refuse(struct extract *x, int rc, const char *entry, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool ex_pathset_has(const struct strmap *ps, const char *p);
int ex_pathset_add(struct strmap *ps, const char *p);
void ex_drop_parent(struct extract *x);
const char *ex_split_base(char *path, char *parent, size_t plen);

/* extract_decode.c */
int ex_src_init(struct source *s, struct extract *x, extract_read_fn fn, void *ctx);
int ex_ring_start(struct source *s);
la_ssize_t ex_src_read(struct archive *a, void *cd, const void **buf);
void ex_src_free(struct source *s);
int ex_src_drain(struct source *s);

/* extract_write.c */
const char *ex_entry_str(const char *mbs, const char *utf8);
int ex_archive_failure(struct extract *x, struct archive *a, struct source *s, const char *entry);
int ex_do_entry(struct extract *x, struct archive *a, struct source *s, struct archive_entry *e);

#endif
