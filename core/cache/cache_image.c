#include "fsutil.h"
#include "cache_image.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "extract.h"
#include "fstree.h"
#include "gzwrite.h"
#include "oci_auth.h"
#include "log.h"

#define WALK_MAX_DEPTH 64
#define LAYER_MANIFEST_MAX (16u << 20)

static const char *fmt_prefix(enum cache_format f)
{
	return f == CACHE_VLLM ? "vllm" : "triton";
}

const char *cache_format_name(enum cache_format f)
{
	return f == CACHE_AUTO ? "auto" : fmt_prefix(f);
}

int cache_meta_init(struct cache_meta *m, enum cache_format f)
{
	memset(m, 0, sizeof(*m));
	m->format = f;
	m->targets = cJSON_CreateArray();
	m->kernels = cJSON_CreateArray();
	m->vllm = cJSON_CreateObject();
	if (!m->targets || !m->kernels || !m->vllm) {
		cache_meta_clear(m);
		return -ENOMEM;
	}
	return 0;
}

void cache_meta_clear(struct cache_meta *m)
{
	if (!m)
		return;
	cJSON_Delete(m->targets);
	cJSON_Delete(m->kernels);
	cJSON_Delete(m->vllm);
	memset(m, 0, sizeof(*m));
}

static const char *jstr(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void add_target(struct cache_meta *m, cJSON *t)
{
	const cJSON *it;
	cJSON_ArrayForEach(it, m->targets)
	{
		if (cJSON_Compare(it, t, true)) {
			cJSON_Delete(t);
			return;
		}
	}
	if (!cJSON_AddItemToArray(m->targets, t))
		cJSON_Delete(t);
}

static void copy_field(cJSON *dst, const char *dkey, const cJSON *src, const char *skey)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, skey);
	if (v && !cJSON_IsNull(v)) {
		cJSON *c = cJSON_Duplicate(v, 1);
		if (c && !cJSON_AddItemToObject(dst, dkey, c))
			cJSON_Delete(c);
	}
}

/* Split "a/b/c" into at most n components (pointers into buf). */
static size_t split_path(char *buf, const char **parts, size_t n)
{
	size_t k = 0;
	for (char *p = buf; k < n;) {
		parts[k++] = p;
		char *slash = strchr(p, '/');
		if (!slash)
			break;
		*slash = '\0';
		p = slash + 1;
	}
	return k;
}

/* The vLLM manifest entry for hash h, created (and counted) on first sight. */
static cJSON *vllm_entry(struct cache_meta *m, const char *h)
{
	cJSON *e = cJSON_GetObjectItemCaseSensitive(m->vllm, h);
	if (e)
		return e;
	e = cJSON_CreateObject();
	if (!e || !cJSON_AddStringToObject(e, "vllmHash", h) ||
	    !cJSON_AddItemToObject(m->vllm, h, e)) {
		cJSON_Delete(e);
		return NULL;
	}
	m->entries++;
	return e;
}

static cJSON *entry_list(cJSON *e, const char *key)
{
	cJSON *a = cJSON_GetObjectItemCaseSensitive(e, key);
	if (!a)
		a = cJSON_AddArrayToObject(e, key);
	return a;
}

/* The "binary" record of rank/prefix within a vLLM entry. */
static cJSON *binary_record(cJSON *e, const char *rank, const char *prefix)
{
	cJSON *list = entry_list(e, "binary");
	const cJSON *it;
	cJSON_ArrayForEach(it, list)
	{
		const char *r = jstr(it, "rank"), *p = jstr(it, "prefix");
		if (r && p && strcmp(r, rank) == 0 && strcmp(p, prefix) == 0)
			return (cJSON *)it;
	}
	cJSON *b = cJSON_CreateObject();
	if (!b || !cJSON_AddStringToObject(b, "rank", rank) ||
	    !cJSON_AddStringToObject(b, "prefix", prefix) ||
	    !cJSON_AddArrayToObject(b, "artifact_names") || !cJSON_AddItemToArray(list, b)) {
		cJSON_Delete(b);
		return NULL;
	}
	return b;
}

static void add_kernel(struct cache_meta *m, const cJSON *j, const char *hash_dir,
                       const char *vllm_hash)
{
	const cJSON *target = cJSON_GetObjectItemCaseSensitive(j, "target");
	cJSON *t = cJSON_CreateObject();
	cJSON *k = cJSON_CreateObject();
	if (!t || !k)
		goto fail;
	copy_field(t, "backend", target, "backend");
	copy_field(t, "arch", target, "arch");
	copy_field(t, "warp_size", target, "warp_size");
	if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "ptx_version")))
		copy_field(t, "ptx_version", j, "ptx_version");
	copy_field(k, "hash", j, "hash");
	copy_field(k, "name", j, "name");
	if (hash_dir && !cJSON_AddStringToObject(k, "dir", hash_dir))
		goto fail;
	copy_field(k, "backend", target, "backend");
	copy_field(k, "arch", target, "arch");
	copy_field(k, "warp_size", target, "warp_size");
	static const char *const extra[] = {"ptx_version", "num_warps", "num_stages",
	                                    "num_ctas",    "debug",     "triton_version"};
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		copy_field(k, extra[i], j, extra[i]);
	cJSON *list = m->kernels;
	if (vllm_hash) {
		cJSON *e = vllm_entry(m, vllm_hash);
		list = e ? entry_list(e, "triton") : NULL;
		if (e && !jstr(e, "cacheFormat"))
			cJSON_AddStringToObject(e, "cacheFormat", "triton");
	} else if (m->format != CACHE_VLLM) {
		m->entries++;
	}
	if (!list || !cJSON_AddItemToArray(list, k))
		goto fail;
	add_target(m, t);
	return;
fail:
	cJSON_Delete(t);
	cJSON_Delete(k);
}

/* cache_key_factors.json of a vLLM binary cache. */
static void add_key_factors(struct cache_meta *m, const cJSON *j, const char *h, const char *rank,
                            const char *prefix)
{
	cJSON *e = vllm_entry(m, h);
	cJSON *b = e ? binary_record(e, rank, prefix) : NULL;
	if (!b)
		return;
	cJSON_DeleteItemFromObjectCaseSensitive(e, "cacheFormat");
	cJSON_AddStringToObject(e, "cacheFormat", "binary");
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(j, "env");
	const char *device = env ? jstr(env, "VLLM_TARGET_DEVICE") : NULL;
	const char *cuda = env ? jstr(env, "VLLM_MAIN_CUDA_VERSION") : NULL;
	const char *save = env ? jstr(env, "VLLM_COMPILE_CACHE_SAVE_FORMAT") : NULL;
	copy_field(b, "code_hash", j, "code_hash");
	copy_field(b, "config_hash", j, "config_hash");
	copy_field(b, "compiler_hash", j, "compiler_hash");
	if (save)
		cJSON_AddStringToObject(b, "cache_save_format", save);
	if (device)
		cJSON_AddStringToObject(b, "target_device", device);
	if (env)
		copy_field(b, "env", j, "env");
	snprintf(m->vllm_format, sizeof(m->vllm_format), "%s", save ? save : "binary");
	if (!device)
		return;
	cJSON *t = cJSON_CreateObject();
	if (!t)
		return;
	bool rocm = strcmp(device, "rocm") == 0 || strcmp(device, "hip") == 0;
	cJSON_AddStringToObject(t, "backend", rocm ? "hip" : device);
	if (strcmp(device, "cuda") == 0 || rocm)
		cJSON_AddNumberToObject(t, "warp_size", rocm ? 64 : 32);
	if (cuda && strcmp(device, "cuda") == 0)
		cJSON_AddStringToObject(t, "cuda_version", cuda);
	add_target(m, t);
}

static void add_group(struct cache_meta *m, const cJSON *j)
{
	m->groups++;
	const cJSON *cp = cJSON_GetObjectItemCaseSensitive(j, "child_paths");
	const cJSON *it;
	bool absolute = false;
	cJSON_ArrayForEach(it, cp)
	{
		if (!cJSON_IsString(it) || it->valuestring[0] != '/')
			continue;
		if (!absolute && !m->abs_group_root[0]) {
			/* "/root/cache/<HASH>/<file>" -> "/root/cache" */
			char buf[sizeof(m->abs_group_root)];
			snprintf(buf, sizeof(buf), "%s", it->valuestring);
			for (int cut = 0; cut < 2; cut++) {
				char *slash = strrchr(buf, '/');
				if (slash && slash != buf)
					*slash = '\0';
			}
			memcpy(m->abs_group_root, buf, sizeof(buf));
		}
		absolute = true;
	}
	if (absolute)
		m->abs_groups++;
}

void cache_meta_add(struct cache_meta *m, const char *relpath, uint64_t size, const char *data,
                    size_t len)
{
	m->files++;
	m->bytes += size;
	const char *base = strrchr(relpath, '/');
	base = base ? base + 1 : relpath;
	char buf[PATH_MAX];
	const char *parts[8] = {0};
	snprintf(buf, sizeof(buf), "%s", relpath);
	size_t np = split_path(buf, parts, 8);
	const char *vllm_hash = NULL;
	if (m->format == CACHE_VLLM && np >= 3 && strcmp(parts[0], "torch_compile_cache") == 0) {
		vllm_hash = parts[1];
		if (!vllm_entry(m, vllm_hash))
			return;
		/* torch_compile_cache/<h>/<rank>/<prefix>/artifact_compile_range_* */
		if (np >= 5 && strncmp(parts[4], "artifact_compile_range_", 23) == 0) {
			cJSON *b = binary_record(vllm_entry(m, vllm_hash), parts[2], parts[3]);
			cJSON *names =
			    b ? cJSON_GetObjectItemCaseSensitive(b, "artifact_names") : NULL;
			bool seen = false;
			const cJSON *it;
			cJSON_ArrayForEach(it, names) seen |=
			    strcmp(it->valuestring, parts[4]) == 0;
			if (names && !seen) {
				cJSON_AddItemToArray(names, cJSON_CreateString(parts[4]));
				cJSON_DeleteItemFromObjectCaseSensitive(b, "artifact_count");
				cJSON_AddNumberToObject(b, "artifact_count",
				                        cJSON_GetArraySize(names));
			}
			if (np > 6 && strcmp(m->vllm_format, "binary") == 0)
				snprintf(m->vllm_format, sizeof(m->vllm_format), "unpacked");
		}
	}
	size_t bl = strlen(base);
	if (!data || bl < 5 || strcmp(base + bl - 5, ".json") != 0)
		return;
	cJSON *j = cJSON_ParseWithLength(data, len);
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return;
	}
	if (strncmp(base, "__grp__", 7) == 0) {
		add_group(m, j);
	} else if (jstr(j, "hash") &&
	           cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "target"))) {
		const char *dir = np >= 2 ? parts[np - 2] : NULL;
		add_kernel(m, j, dir, vllm_hash);
	} else if (vllm_hash && np >= 5 && strcmp(base, "cache_key_factors.json") == 0) {
		add_key_factors(m, j, vllm_hash, parts[2], parts[3]);
	}
	cJSON_Delete(j);
}

char *cache_summary_json(const struct cache_meta *m)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *t = cJSON_Duplicate(m->targets, 1);
	char *s = NULL;
	if (o && t && cJSON_AddItemToObject(o, "targets", t)) {
		t = NULL;
		s = cJSON_PrintUnformatted(o);
	}
	cJSON_Delete(t);
	cJSON_Delete(o);
	return s;
}

char *cache_manifest_json(const struct cache_meta *m)
{
	cJSON *o = cJSON_CreateObject();
	char *s = NULL;
	if (!o)
		return NULL;
	if (m->format == CACHE_VLLM) {
		cJSON *a = cJSON_AddArrayToObject(o, "vllm");
		const cJSON *it;
		cJSON_ArrayForEach(it, m->vllm)
		{
			cJSON *c = cJSON_Duplicate(it, 1);
			if (!a || !c || !cJSON_AddItemToArray(a, c)) {
				cJSON_Delete(c);
				goto out;
			}
		}
	} else {
		cJSON *k = cJSON_Duplicate(m->kernels, 1);
		if (!k || !cJSON_AddItemToObject(o, "triton", k)) {
			cJSON_Delete(k);
			goto out;
		}
	}
	s = cJSON_Print(o);
out:
	cJSON_Delete(o);
	return s;
}

static int set_label(cJSON *labels, const char *fmt, const char *key, const char *value)
{
	char k[128];
	snprintf(k, sizeof(k), "cache.%s.image/%s", fmt, key);
	cJSON_DeleteItemFromObjectCaseSensitive(labels, k);
	return cJSON_AddStringToObject(labels, k, value) ? 0 : -ENOMEM;
}

int cache_set_labels(const struct cache_meta *m, cJSON *labels)
{
	const char *f = fmt_prefix(m->format);
	char num[32];
	char *summary = cache_summary_json(m);
	int rc = -ENOMEM;
	if (!summary)
		return rc;
	snprintf(num, sizeof(num), "%" PRIu64, m->entries);
	if ((rc = set_label(labels, f, "entry-count", num)))
		goto out;
	snprintf(num, sizeof(num), "%" PRIu64, m->bytes);
	if ((rc = set_label(labels, f, "cache-size-bytes", num)))
		goto out;
	if ((rc = set_label(labels, f, "summary", summary)))
		goto out;
	if (m->format == CACHE_VLLM)
		rc =
		    set_label(labels, f, "format", m->vllm_format[0] ? m->vllm_format : "unpacked");
out:
	free(summary);
	return rc;
}

enum cache_format cache_detect_format(const char *dir)
{
	char p[PATH_MAX];
	struct stat st;
	snprintf(p, sizeof(p), "%s/torch_compile_cache", dir);
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode) ? CACHE_VLLM : CACHE_TRITON;
}

/* ---- walking a cache directory in a stable order --------------------- */

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

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* The names in directory fd, sorted. Counted against the entry cap as they
 * are read, so a directory of a million files stops at the cap. */
static int read_names(struct walk_ctx *w, int fd, const char *full, char ***out, size_t *nout)
{
	DIR *d = NULL;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int rc = fstree_opendir(fd, &d);
	if (rc) {
		oci_errf(w->err, "cannot read directory %s: %s", full, strerror(-rc));
		return rc;
	}
	const struct dirent *de;
	errno = 0;
	while ((de = readdir(d))) {
		if (fstree_dot(de->d_name))
			continue;
		if (w->rules && w->rules->max_files && ++w->entries > w->rules->max_files) {
			oci_errf(
			    w->err,
			    "%s holds more than %" PRIu64
			    " files and directories: over the capture's file cap (--max-files)",
			    w->root, w->rules->max_files);
			rc = -E2BIG;
			goto out;
		}
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 64;
			char **nn = realloc(names, ncap * sizeof(*nn));
			if (!nn) {
				rc = -ENOMEM;
				goto out;
			}
			names = nn;
			cap = ncap;
		}
		if (!(names[n] = strdup(de->d_name))) {
			rc = -ENOMEM;
			goto out;
		}
		n++;
		errno = 0;
	}
	if (errno) {
		rc = -errno;
		oci_errf(w->err, "cannot read directory %s: %s", full, strerror(errno));
		goto out;
	}
	qsort(names, n, sizeof(*names), cmp_names);
	*out = names;
	*nout = n;
	names = NULL;
	n = 0;
out:
	free_names(names, n);
	closedir(d);
	return rc;
}

static bool same_inode(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
	       (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT);
}

static int walk(struct walk_ctx *w, int dirfd, const char *full, const char *rel, int depth)
{
	char **names = NULL;
	size_t n = 0;
	if (depth > WALK_MAX_DEPTH) {
		oci_errf(w->err, "%s is nested deeper than %d directories", full, WALK_MAX_DEPTH);
		return -ELOOP;
	}
	int rc = read_names(w, dirfd, full, &names, &n);
	for (size_t i = 0; i < n && rc == 0; i++) {
		char cfull[PATH_MAX], crel[PATH_MAX];
		struct walk_entry e = {
		    .rel = crel, .full = cfull, .dirfd = dirfd, .name = names[i]};
		if ((size_t)snprintf(cfull, sizeof(cfull), "%s/%s", full, names[i]) >=
		        sizeof(cfull) ||
		    (size_t)snprintf(crel, sizeof(crel), "%s%s%s", rel, *rel ? "/" : "",
		                     names[i]) >= sizeof(crel)) {
			oci_errf(w->err, "path too long under %s", full);
			rc = -ENAMETOOLONG;
			break;
		}
		if (fstatat(dirfd, names[i], &e.st, AT_SYMLINK_NOFOLLOW) < 0) {
			rc = -errno;
			oci_errf(w->err, "cannot stat %s: %s", cfull, strerror(errno));
			break;
		}
		rc = w->visit(w, &e);
		if (rc > 0) {
			rc = 0;
			continue;
		}
		if (rc || !S_ISDIR(e.st.st_mode))
			continue;
		struct stat now;
		int cfd = openat(dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (cfd < 0 || fstat(cfd, &now) < 0 || !same_inode(&now, &e.st)) {
			rc = cfd < 0 ? -errno : -EAGAIN;
			oci_errf(w->err, "cannot open directory %s: %s", cfull,
			         cfd < 0 ? strerror(errno) : "it was replaced while being read");
		} else {
			rc = walk(w, cfd, cfull, crel, depth + 1);
		}
		if (cfd >= 0)
			close(cfd);
	}
	free_names(names, n);
	return rc;
}

/* Walk the tree at dir (the root itself may be reached through a link). */
static int walk_root(struct walk_ctx *w, const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		oci_errf(w->err, "%s is not a directory: %s", dir, strerror(errno));
		return rc;
	}
	w->root = dir;
	int rc = walk(w, fd, dir, "", 0);
	close(fd);
	return rc;
}

static const char *kind_of(mode_t m)
{
	return S_ISCHR(m)    ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
	       : S_ISFIFO(m) ? "a FIFO"
	       : S_ISSOCK(m) ? "a socket"
	                     : "not a regular file";
}

/* Open a regular file the walk met, making sure it is still that file. */
static int open_entry(struct walk_ctx *w, const struct walk_entry *e, int *out)
{
	struct stat now;
	int fd = openat(e->dirfd, e->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &now) < 0 || !same_inode(&now, &e->st)) {
		int rc = fd < 0 ? -errno : -EAGAIN;
		oci_errf(w->err, "cannot open %s: %s", e->full,
		         fd < 0 ? strerror(errno) : "it was replaced while being read");
		if (fd >= 0)
			close(fd);
		return rc;
	}
	*out = fd;
	return 0;
}

/* Untrusted walks: a file whose size or time moved while it was read is
 * being written; its bytes are not what any kernel compile produced. */
static int check_unchanged(struct walk_ctx *w, const struct walk_entry *e, int fd)
{
	struct stat now;
	if (!w->rules)
		return 0;
	if (fstat(fd, &now) < 0)
		return -errno;
	if (now.st_size == e->st.st_size && now.st_mtim.tv_sec == e->st.st_mtim.tv_sec &&
	    now.st_mtim.tv_nsec == e->st.st_mtim.tv_nsec)
		return 0;
	oci_errf(w->err,
	         "%s changed while it was captured (%jd bytes, then %jd): something is still "
	         "writing it; capture again once the writer has finished",
	         e->full, (intmax_t)e->st.st_size, (intmax_t)now.st_size);
	return -EAGAIN;
}

/* 1 when the captured file has the bytes of the base's file at its path. */
static int same_as_base(struct walk_ctx *w, const struct walk_entry *e)
{
	char path[PATH_MAX];
	struct stat bst;
	int rc = 0, bfd = -1, fd = -1;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", w->rules->unchanged_from, e->rel) >=
	        sizeof(path) ||
	    lstat(path, &bst) < 0 || !S_ISREG(bst.st_mode) || bst.st_size != e->st.st_size)
		return 0;
	if ((bfd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
	    (rc = open_entry(w, e, &fd)))
		goto out;
	char a[1 << 15], b[sizeof(a)];
	for (;;) {
		ssize_t na = read(fd, a, sizeof(a));
		ssize_t nb = na > 0 ? read(bfd, b, (size_t)na) : 0;
		if (na < 0 || nb != na) {
			rc = na < 0 ? -errno : 0;
			if (rc)
				oci_errf(w->err, "reading %s: %s", e->full, strerror(-rc));
			goto out;
		}
		if (na == 0) {
			rc = 1;
			goto out;
		}
		if (memcmp(a, b, (size_t)na) != 0)
			goto out;
	}
out:
	if (fd >= 0)
		close(fd);
	if (bfd >= 0)
		close(bfd);
	return rc;
}

/* FNV-1a over the entry's path, size and modification time, added up (the
 * order of the walk does not matter). */
static uint64_t stamp_mix(uint64_t stamp, const struct walk_entry *e)
{
	uint64_t h = 1469598103934665603ull;
	int64_t v[3] = {(int64_t)e->st.st_size, (int64_t)e->st.st_mtim.tv_sec,
	                (int64_t)e->st.st_mtim.tv_nsec};
	for (const char *p = e->rel; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	for (size_t i = 0; i < sizeof(v); i++)
		h = (h ^ ((const unsigned char *)v)[i]) * 1099511628211ull;
	return stamp + h;
}

/* What a cache image may carry: 0 package, 1 leave out (unchanged from the
 * base), -errno refused (err says which path and why). */
static int admit(struct walk_ctx *w, struct walk_entry *e)
{
	const struct cache_walk_rules *r = w->rules;
	mode_t m = e->st.st_mode;
	if (S_ISLNK(m)) {
		ssize_t n = readlinkat(e->dirfd, e->name, e->link, sizeof(e->link) - 1);
		if (n < 0) {
			int rc = -errno;
			oci_errf(w->err, "cannot read link %s: %s", e->full, strerror(errno));
			return rc;
		}
		e->link[n] = '\0';
		if (r) {
			oci_errf(
			    w->err,
			    "cannot capture %s: a symlink (to '%s'); a capture takes only regular "
			    "files",
			    e->full, e->link);
			return -EPERM;
		}
		if (!extract_symlink_inside(e->rel, e->link)) {
			oci_errf(w->err,
			         "cannot package %s: symlink to '%s' leaves the cache directory",
			         e->full, e->link);
			return -EPERM;
		}
		return 0;
	}
	if (!S_ISREG(m) && !S_ISDIR(m)) {
		if (r && S_ISCHR(m) && e->st.st_rdev == 0)
			oci_errf(w->err,
			         "cannot capture %s: it was deleted from the base cache, and a "
			         "capture only adds files",
			         e->full);
		else
			oci_errf(w->err,
			         "cannot %s %s: %s, not a regular file, directory or symlink",
			         r ? "capture" : "package", e->full, kind_of(m));
		return -EPERM;
	}
	if (!r)
		return 0;
	if (m & (S_ISUID | S_ISGID)) {
		oci_errf(w->err, "cannot capture %s: it has the set-user-ID or set-group-ID bit",
		         e->full);
		return -EPERM;
	}
	if (S_ISDIR(m))
		return 0;
	if (e->st.st_nlink > 1) {
		oci_errf(w->err,
		         "cannot capture %s: it has %ju names (hard links); a capture takes files "
		         "with one name",
		         e->full, (uintmax_t)e->st.st_nlink);
		return -EPERM;
	}
	if (r->unchanged_from) {
		int same = same_as_base(w, e);
		if (same)
			return same;
	}
	w->bytes += (uint64_t)e->st.st_size;
	w->stamp = stamp_mix(w->stamp, e);
	if (r->max_bytes && w->bytes > r->max_bytes) {
		oci_errf(w->err,
		         "%s (%jd bytes) takes the capture over its byte cap of %" PRIu64
		         " (--max-bytes)",
		         e->full, (intmax_t)e->st.st_size, r->max_bytes);
		return -EFBIG;
	}
	return 0;
}

static bool is_json_name(const char *name)
{
	size_t nl = strlen(name);
	return nl >= 5 && strcmp(name + nl - 5, ".json") == 0;
}

/* A small JSON file's bytes, read from fd, for the metadata scan; NULL when
 * it is not one (or cannot be read: the caller streams it then). */
static char *read_small_json(const struct walk_entry *e, int fd, size_t *len)
{
	if (!is_json_name(e->name) || e->st.st_size > (off_t)CACHE_JSON_MAX)
		return NULL;
	char *buf = NULL;
	if (fsutil_read_fd(fd, CACHE_JSON_MAX, &buf, len))
		return NULL;
	return buf;
}

struct scan_ctx {
	struct walk_ctx w;
	struct cache_meta *m;
};

static int scan_visit(struct walk_ctx *w, struct walk_entry *e)
{
	struct scan_ctx *s = (struct scan_ctx *)w;
	int rc = admit(w, e);
	if (rc || !S_ISREG(e->st.st_mode))
		return rc;
	size_t len = 0;
	char *data = NULL;
	if (is_json_name(e->name) && e->st.st_size <= (off_t)CACHE_JSON_MAX) {
		int fd = -1;
		if ((rc = open_entry(w, e, &fd)))
			return rc;
		data = read_small_json(e, fd, &len);
		rc = check_unchanged(w, e, fd);
		close(fd);
	}
	if (rc == 0)
		cache_meta_add(s->m, e->rel, (uint64_t)e->st.st_size, data, len);
	free(data);
	return rc;
}

static int check_found(const char *dir, const struct cache_meta *m, struct oci_err *err)
{
	if (m->format == CACHE_VLLM && m->entries == 0) {
		oci_errf(err, "%s holds no vLLM cache (no torch_compile_cache/<hash>/ directories)",
		         dir);
		return -EINVAL;
	}
	if (m->format == CACHE_TRITON && m->entries == 0) {
		oci_errf(err,
		         "%s holds no Triton cache (no kernel metadata <hash>/<kernel>.json with a "
		         "target)",
		         dir);
		return -EINVAL;
	}
	return 0;
}

int cache_scan_dir(const char *dir, enum cache_format f, const struct cache_walk_rules *rules,
                   bool allow_empty, struct cache_meta *m, struct oci_err *err)
{
	if (f == CACHE_AUTO)
		f = cache_detect_format(dir);
	int rc = cache_meta_init(m, f);
	if (rc)
		return rc;
	struct scan_ctx s = {.w = {.visit = scan_visit, .err = err, .rules = rules}, .m = m};
	if ((rc = walk_root(&s.w, dir)) || (!allow_empty && (rc = check_found(dir, m, err))))
		cache_meta_clear(m);
	else
		m->stamp = s.w.stamp;
	return rc;
}
/* ---- writing the layer ------------------------------------------------ */

struct layer_writer {
	struct walk_ctx w;
	const struct cache_build_opts *o;
	struct cache_meta *m;
	struct archive *a;
	int fd;
	struct gzw *gz;
	struct oci_hasher diff, comp;
	uint64_t tar_bytes, gz_bytes;
	int64_t newest;
	int io_errno;
	const char *prefix; /* "io.triton.cache" */
	cJSON *files;       /* res->files: the first o->list_files files, listed */
};

/* The compressed layer: hashed for its digest and written to the file. */
static int gz_out(void *ud, const void *buf, size_t len)
{
	struct layer_writer *lw = ud;
	oci_hasher_update(&lw->comp, buf, len);
	lw->gz_bytes += len;
	return fsutil_write_all(lw->fd, buf, len);
}

static la_ssize_t tar_out(struct archive *a, void *ud, const void *buf, size_t len)
{
	struct layer_writer *lw = ud;
	oci_hasher_update(&lw->diff, buf, len);
	lw->tar_bytes += len;
	int rc = gzw_write(lw->gz, buf, len);
	if (rc) {
		lw->io_errno = -rc;
		archive_set_error(a, -rc, "writing the layer: %s", strerror(-rc));
		return -1;
	}
	return (la_ssize_t)len;
}

static int64_t clamp_mtime(struct layer_writer *lw, int64_t t)
{
	if (lw->o->source_date_epoch >= 0 && t > lw->o->source_date_epoch)
		t = lw->o->source_date_epoch;
	if (t > lw->newest)
		lw->newest = t;
	return t;
}

static int put_header(struct layer_writer *lw, const char *name, mode_t type, mode_t perm,
                      int64_t mtime, int64_t size, const char *link)
{
	struct archive_entry *e = archive_entry_new();
	if (!e)
		return -ENOMEM;
	archive_entry_set_pathname(e, name);
	archive_entry_set_filetype(e, type);
	archive_entry_set_perm(e, perm & 0777); /* no setuid/setgid/sticky in a cache */
	archive_entry_set_mtime(e, clamp_mtime(lw, mtime), 0);
	archive_entry_set_uid(e, 0);
	archive_entry_set_gid(e, 0);
	if (type == AE_IFREG)
		archive_entry_set_size(e, size);
	if (link)
		archive_entry_set_symlink(e, link);
	int r = archive_write_header(lw->a, e);
	archive_entry_free(e);
	if (r != ARCHIVE_OK) {
		oci_errf(lw->w.err, "writing tar header for %s: %s", name,
		         archive_error_string(lw->a));
		return -EIO;
	}
	return 0;
}

static int put_data(struct layer_writer *lw, const char *name, const void *buf, size_t len)
{
	if (len && archive_write_data(lw->a, buf, len) != (la_ssize_t)len) {
		oci_errf(lw->w.err, "writing %s into the layer: %s", name,
		         archive_error_string(lw->a));
		return -EIO;
	}
	return 0;
}

/* Group file with absolute child paths -> the bare names newer Triton writes. */
static char *rewrite_group(const char *data, size_t len, size_t *outlen)
{
	cJSON *j = cJSON_ParseWithLength(data, len);
	cJSON *cp = j ? cJSON_GetObjectItemCaseSensitive(j, "child_paths") : NULL;
	bool changed = false;
	cJSON *it;
	cJSON_ArrayForEach(it, cp)
	{
		if (!cJSON_IsString(it) || it->valuestring[0] != '/')
			continue;
		const char *base = strrchr(it->valuestring, '/') + 1;
		cJSON_SetValuestring(it, base);
		changed = true;
	}
	char *s = changed ? cJSON_PrintUnformatted(j) : NULL;
	cJSON_Delete(j);
	if (s)
		*outlen = strlen(s);
	return s;
}

/* Start the digest of a file the layer lists (opts.list_files); false when
 * it is not one of those. */
static bool list_start(struct layer_writer *lw, struct oci_hasher *h)
{
	return lw->files && (size_t)cJSON_GetArraySize(lw->files) < lw->o->list_files &&
	       oci_hasher_init(h, NULL) == 0;
}

static int list_end(struct layer_writer *lw, struct oci_hasher *h, const char *name)
{
	char d[OCI_DIGEST_MAX];
	cJSON *f = NULL;
	int rc = oci_hasher_final(h, d);
	if (rc == 0 &&
	    (!(f = cJSON_CreateObject()) || !cJSON_AddStringToObject(f, "path", name) ||
	     !cJSON_AddStringToObject(f, "digest", d) || !cJSON_AddItemToArray(lw->files, f))) {
		cJSON_Delete(f);
		rc = -ENOMEM;
	}
	return rc;
}

static int write_file(struct layer_writer *lw, const struct walk_entry *e, const char *name)
{
	int fd = -1;
	struct oci_hasher h = {0};
	bool listed = false;
	int rc = open_entry(&lw->w, e, &fd);
	if (rc)
		return rc;
	listed = list_start(lw, &h);
	size_t jlen = 0;
	char *json = read_small_json(e, fd, &jlen);
	if (json && lw->o->rewrite_group_paths && strncmp(e->name, "__grp__", 7) == 0) {
		size_t nl = 0;
		char *nj = rewrite_group(json, jlen, &nl);
		if (nj) {
			free(json);
			json = nj;
			jlen = nl;
		}
	}
	if (json) {
		cache_meta_add(lw->m, e->rel, jlen, json, jlen);
		if (!(rc = check_unchanged(&lw->w, e, fd)) &&
		    !(rc = put_header(lw, name, AE_IFREG, e->st.st_mode, e->st.st_mtime,
		                      (int64_t)jlen, NULL)))
			rc = put_data(lw, name, json, jlen);
		if (listed)
			oci_hasher_update(&h, json, jlen);
		free(json);
		goto out;
	}
	if (lseek(fd, 0, SEEK_SET) < 0) {
		rc = -errno;
		oci_errf(lw->w.err, "reading %s: %s", e->full, strerror(errno));
		goto out;
	}
	cache_meta_add(lw->m, e->rel, (uint64_t)e->st.st_size, NULL, 0);
	if ((rc = put_header(lw, name, AE_IFREG, e->st.st_mode, e->st.st_mtime, e->st.st_size,
	                     NULL)))
		goto out;
	char buf[1 << 16];
	int64_t left = e->st.st_size;
	while (left > 0) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			if (n == 0 && lw->w.rules)
				rc = check_unchanged(&lw->w, e, fd);
			if (rc == 0 || rc == -EIO)
				oci_errf(lw->w.err, "reading %s: %s", e->full,
				         n < 0 ? strerror(errno) : "file shrank while packaging");
			rc = rc ? rc : -EIO;
			goto out;
		}
		if (n > left)
			n = (ssize_t)left; /* a file that grows: package what stat saw */
		if ((rc = put_data(lw, name, buf, (size_t)n)))
			goto out;
		if (listed)
			oci_hasher_update(&h, buf, (size_t)n);
		left -= n;
	}
	rc = check_unchanged(&lw->w, e, fd);
out:
	if (rc == 0 && listed)
		rc = list_end(lw, &h, name);
	oci_hasher_free(&h);
	close(fd);
	return rc;
}

static int layer_visit(struct walk_ctx *w, struct walk_entry *e)
{
	struct layer_writer *lw = (struct layer_writer *)w;
	char name[PATH_MAX];
	int rc = admit(w, e);
	if (rc)
		return rc;
	if ((size_t)snprintf(name, sizeof(name), "%s/%s", lw->prefix, e->rel) >= sizeof(name)) {
		oci_errf(w->err, "path too long: %s", e->rel);
		return -ENAMETOOLONG;
	}
	if (S_ISDIR(e->st.st_mode))
		return put_header(lw, name, AE_IFDIR, e->st.st_mode, e->st.st_mtime, 0, NULL);
	if (S_ISLNK(e->st.st_mode))
		return put_header(lw, name, AE_IFLNK, 0777, e->st.st_mtime, 0, e->link);
	return write_file(lw, e, name);
}

/* Write the layer of dir into fd; fill res (digests, sizes, meta, the
 * image's creation time: SOURCE_DATE_EPOCH or the newest mtime). */
static int write_layer(const char *dir, const struct cache_build_opts *o, int fd,
                       struct cache_build_result *res, struct oci_err *err)
{
	struct layer_writer lw = {.w = {.visit = layer_visit, .err = err, .rules = o->rules},
	                          .o = o,
	                          .fd = fd,
	                          .m = &res->meta,
	                          .files = res->files};
	char prefix[64], mdir[64], mname[96];
	char *manifest = NULL;
	struct stat st;
	int rc;
	snprintf(prefix, sizeof(prefix), "io.%s.cache", fmt_prefix(o->format));
	snprintf(mdir, sizeof(mdir), "io.%s.manifest", fmt_prefix(o->format));
	snprintf(mname, sizeof(mname), "%s/manifest.json", mdir);
	lw.prefix = prefix;
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		oci_errf(err, "%s is not a directory", dir);
		return -ENOTDIR;
	}
	if ((rc = oci_hasher_init(&lw.diff, NULL)) || (rc = oci_hasher_init(&lw.comp, NULL)) ||
	    (rc = gzw_new(o->level, gz_out, &lw, &lw.gz)))
		goto out;
	rc = -ENOMEM;
	if (!(lw.a = archive_write_new()))
		goto out;
	if (archive_write_set_format_pax_restricted(lw.a) != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(lw.a, 1) != ARCHIVE_OK ||
	    archive_write_open2(lw.a, &lw, NULL, tar_out, NULL, NULL) != ARCHIVE_OK) {
		oci_errf(err, "cannot start the tar stream: %s", archive_error_string(lw.a));
		rc = -EIO;
		goto out;
	}
	/* a layer on a base describes the whole tree it makes */
	const struct cache_meta *whole = o->image_meta ? o->image_meta : lw.m;
	if ((rc = put_header(&lw, prefix, AE_IFDIR, st.st_mode, st.st_mtime, 0, NULL)) ||
	    (rc = walk_root(&lw.w, dir)) || (rc = check_found(dir, whole, err)))
		goto out;
	lw.m->stamp = lw.w.stamp;
	rc = -ENOMEM;
	if (!(manifest = cache_manifest_json(whole)))
		goto out;
	int64_t when = o->source_date_epoch >= 0 ? o->source_date_epoch : lw.newest;
	if ((rc = put_header(&lw, mdir, AE_IFDIR, 0755, when, 0, NULL)) ||
	    (rc = put_header(&lw, mname, AE_IFREG, 0644, when, (int64_t)strlen(manifest), NULL)) ||
	    (rc = put_data(&lw, mname, manifest, strlen(manifest))))
		goto out;
	if (archive_write_close(lw.a) != ARCHIVE_OK) {
		oci_errf(err, "finishing the tar stream: %s", archive_error_string(lw.a));
		rc = -EIO;
		goto out;
	}
	if ((rc = gzw_finish(lw.gz))) {
		oci_errf(err, "compressing the layer: %s", strerror(-rc));
		goto out;
	}
	if ((rc = oci_hasher_final(&lw.diff, res->diff_id)) ||
	    (rc = oci_hasher_final(&lw.comp, res->layer_digest)))
		goto out;
	res->layer_size = lw.gz_bytes;
	res->tar_size = lw.tar_bytes;
	res->created = when;
	rc = 0;
out:
	if (rc && lw.io_errno && !err->msg[0])
		oci_errf(err, "writing the layer: %s", strerror(lw.io_errno));
	if (lw.a)
		archive_write_free(lw.a);
	oci_hasher_free(&lw.diff);
	oci_hasher_free(&lw.comp);
	gzw_free(lw.gz);
	free(manifest);
	return rc;
}

void cache_build_opts_init(struct cache_build_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->format = CACHE_AUTO;
	o->source_date_epoch = -1;
	o->level = 1;
}

static void iso_time(int64_t t, char *buf, size_t cap)
{
	time_t tt = (time_t)t;
	struct tm tm;
	gmtime_r(&tt, &tm);
	strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Replace (or add) key in o with item (consumed). */
static bool put_item(cJSON *o, const char *key, cJSON *item)
{
	if (!item)
		return false;
	cJSON_DeleteItemFromObjectCaseSensitive(o, key);
	if (cJSON_AddItemToObject(o, key, item))
		return true;
	cJSON_Delete(item);
	return false;
}

/* The object o[key], made an empty one of that type when missing or not one. */
static cJSON *object_item(cJSON *o, const char *key, bool array)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (array ? cJSON_IsArray(v) : cJSON_IsObject(v))
		return v;
	return put_item(o, key, array ? cJSON_CreateArray() : cJSON_CreateObject())
	           ? cJSON_GetObjectItemCaseSensitive(o, key)
	           : NULL;
}

/* The image config: a new one, or the base's with the layer added. */
static char *build_config(const struct cache_build_opts *o, const struct cache_build_result *res,
                          const char *created)
{
	char os[64] = "linux", arch[64];
	snprintf(arch, sizeof(arch), "%s", oci_host_arch());
	if (o->platform) {
		const char *slash = strchr(o->platform, '/');
		if (slash && (size_t)(slash - o->platform) < sizeof(os)) {
			snprintf(os, sizeof(os), "%.*s", (int)(slash - o->platform), o->platform);
			snprintf(arch, sizeof(arch), "%s", slash + 1);
		}
	}
	char *s = NULL;
	char by[96];
	snprintf(by, sizeof(by), "gkm cache %s --format %s", o->base ? "capture" : "build",
	         fmt_prefix(o->format));
	cJSON *c = o->base ? cJSON_Duplicate(o->base->config.root, 1) : cJSON_CreateObject();
	cJSON *cfg, *labels, *rootfs, *ids, *hist, *h = NULL;
	if (!c || !put_item(c, "created", cJSON_CreateString(created)))
		goto out;
	if (!o->base && (!cJSON_AddStringToObject(c, "architecture", arch) ||
	                 !cJSON_AddStringToObject(c, "os", os)))
		goto out;
	if (!(cfg = object_item(c, "config", false)) ||
	    !(labels = object_item(cfg, "Labels", false)))
		goto out;
	const cJSON *it;
	cJSON_ArrayForEach(it, o->extra_labels)
	{
		if (!put_item(labels, it->string, cJSON_Duplicate(it, 1)))
			goto out;
	}
	if (cache_set_labels(o->image_meta ? o->image_meta : &res->meta, labels))
		goto out;
	if (!(rootfs = object_item(c, "rootfs", false)) ||
	    !put_item(rootfs, "type", cJSON_CreateString("layers")) ||
	    !(ids = object_item(rootfs, "diff_ids", true)) ||
	    !cJSON_AddItemToArray(ids, cJSON_CreateString(res->diff_id)) ||
	    !(hist = object_item(c, "history", true)) || !(h = cJSON_CreateObject()) ||
	    !cJSON_AddStringToObject(h, "created", created) ||
	    !cJSON_AddStringToObject(h, "created_by", by) || !cJSON_AddItemToArray(hist, h))
		goto out;
	h = NULL;
	s = cJSON_PrintUnformatted(c);
out:
	cJSON_Delete(h);
	cJSON_Delete(c);
	return s;
}

void cache_build_result_clear(struct cache_build_result *res)
{
	if (res->layer_path) {
		unlink(res->layer_path);
		free(res->layer_path);
		res->layer_path = NULL;
	}
	cache_meta_clear(&res->meta);
	cJSON_Delete(res->files);
	res->files = NULL;
}

int cache_build_layer(const char *dir, const struct cache_build_opts *opts,
                      struct cache_build_result *res, struct oci_err *err)
{
	struct cache_build_opts o = *opts;
	int fd = -1, rc;
	memset(res, 0, sizeof(*res));
	if (o.format == CACHE_AUTO)
		o.format = cache_detect_format(dir);
	if ((rc = cache_meta_init(&res->meta, o.format)))
		return rc;
	if (o.list_files && !(res->files = cJSON_CreateArray())) {
		rc = -ENOMEM;
		goto out;
	}
	const char *tmpdir = getenv("TMPDIR");
	if (asprintf(&res->layer_path, "%s/gkm-layer-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp") <
	    0) {
		res->layer_path = NULL;
		rc = -ENOMEM;
		goto out;
	}
	if ((fd = mkostemp(res->layer_path, O_CLOEXEC)) < 0) {
		rc = -errno;
		oci_errf(err, "cannot create a temporary file for the layer: %s", strerror(errno));
		free(res->layer_path);
		res->layer_path = NULL;
		goto out;
	}
	if ((rc = write_layer(dir, &o, fd, res, err)))
		goto out;
	if (fsync(fd) < 0) {
		rc = -errno;
		oci_errf(err, "writing the layer: %s", strerror(errno));
	}
out:
	if (fd >= 0)
		close(fd);
	if (rc)
		cache_build_result_clear(res);
	return rc;
}

int cache_build_push(const struct cache_build_opts *opts, struct cache_build_result *res,
                     struct oci_repo *repo, const char *tag, struct oci_err *err)
{
	struct cache_build_opts o = *opts;
	struct oci_manifest m = {0};
	struct oci_desc layer = {0};
	char *config = NULL, *mjson = NULL;
	size_t mlen = 0, nbase = o.base ? o.base->manifest.n_layers : 0;
	int rc = -ENOMEM;
	o.format = res->meta.format;
	char when[32];
	iso_time(res->created, when, sizeof(when));
	if (!(config = build_config(&o, res, when)))
		goto out;
	memcpy(layer.digest, res->layer_digest, sizeof(layer.digest));
	layer.size = (int64_t)res->layer_size;
	if (!(layer.media_type = strdup(OCI_MT_LAYER_GZIP)) ||
	    !(m.media_type = strdup(OCI_MT_MANIFEST)) ||
	    !(m.layers = calloc(nbase + 1, sizeof(*m.layers))))
		goto out;
	for (size_t i = 0; i < nbase; i++) {
		char what[32];
		snprintf(what, sizeof(what), "base layer %zu", i);
		if ((rc = oci_desc_copy(&o.base->manifest.layers[i], &m.layers[i])))
			goto out;
		m.n_layers++;
		if ((rc = oci_repo_copy_blob(o.base_repo, repo, &m.layers[i], what, err))) {
			oci_err_prefix(err, "storing the base's layers");
			goto out;
		}
	}
	if ((rc = oci_repo_put_blob_file(repo, res->layer_path, &layer, err))) {
		oci_err_prefix(err, "storing the layer");
		goto out;
	}
	if ((rc = oci_repo_put_blob_mem(repo, config, strlen(config), err))) {
		oci_err_prefix(err, "storing the config");
		goto out;
	}
	rc = -ENOMEM;
	if ((rc = oci_desc_for_bytes(OCI_MT_CONFIG, config, strlen(config), &m.config)))
		goto out;
	rc = -ENOMEM;
	m.layers[m.n_layers++] = layer;
	memset(&layer, 0, sizeof(layer));
	if (!(m.annotations = cJSON_CreateObject()) ||
	    !cJSON_AddStringToObject(m.annotations, OCI_ANN_CREATED, when))
		goto out;
	if ((rc = oci_manifest_build(&m, &mjson, &mlen)))
		goto out;
	/* the manifest last: until it is stored, nothing names the new blobs */
	if ((rc = oci_repo_put_manifest(repo, tag, OCI_MT_MANIFEST, mjson, mlen, NULL, res->digest,
	                                NULL, err))) {
		oci_err_prefix(err, "storing the manifest");
		goto out;
	}
out:
	oci_desc_clear(&layer);
	oci_manifest_clear(&m);
	free(config);
	free(mjson);
	return rc;
}

int cache_build(const char *dir, const struct cache_build_opts *o, struct oci_repo *repo,
                const char *tag, struct cache_build_result *res, struct oci_err *err)
{
	int rc = cache_build_layer(dir, o, res, err);
	if (rc == 0 && (rc = cache_build_push(o, res, repo, tag, err)))
		cache_build_result_clear(res);
	return rc;
}
/* ---- reading a cache layer ------------------------------------------- */

struct layer_src {
	struct oci_blob_reader *r;
	char buf[1 << 16];
	int err;
};

static la_ssize_t layer_read(struct archive *a, void *ud, const void **buf)
{
	struct layer_src *s = ud;
	ssize_t n = oci_blob_read(s->r, s->buf, sizeof(s->buf));
	if (n < 0) {
		s->err = (int)n;
		archive_set_error(a, EIO, "%s", oci_blob_error(s->r));
		return -1;
	}
	*buf = s->buf;
	return n;
}

static int read_entry_data(struct archive *a, size_t max, char **out, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	for (;;) {
		if (n + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		la_ssize_t k = archive_read_data(a, buf + n, cap - n - 1);
		if (k < 0) {
			free(buf);
			return -EIO;
		}
		if (k == 0)
			break;
		n += (size_t)k;
		if (n > max) {
			free(buf);
			return -EFBIG;
		}
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

int cache_scan_layer(struct oci_blob_reader *r, struct cache_meta *m, char **manifest_out,
                     struct oci_err *err)
{
	struct layer_src src = {.r = r};
	struct archive *a = archive_read_new();
	char *manifest = NULL;
	int rc = 0;
	if (!a)
		return -ENOMEM;
	archive_read_support_filter_gzip(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_none(a);
	archive_read_support_format_tar(a);
	if (archive_read_open(a, &src, NULL, layer_read, NULL) != ARCHIVE_OK) {
		oci_errf(err, "cannot read the layer: %s", archive_error_string(a));
		rc = src.err ? src.err : -EBADMSG;
		goto out;
	}
	for (;;) {
		struct archive_entry *e = NULL;
		int h = archive_read_next_header(a, &e);
		if (h == ARCHIVE_EOF)
			break;
		if (h != ARCHIVE_OK && h != ARCHIVE_WARN) {
			if (src.err) {
				oci_errf(err, "%s", oci_blob_error(r));
				rc = src.err;
				goto out;
			}
			/* Layers written without end-of-archive blocks end here once
			 * the last entry is complete: fine if the blob verified. */
			int d = oci_blob_drain(r);
			if (d == 0 && oci_blob_bytes(r) > 0)
				break;
			oci_errf(err, "malformed layer: %s", archive_error_string(a));
			rc = d < 0 ? d : -EBADMSG;
			goto out;
		}
		const char *p = archive_entry_pathname(e);
		while (p && p[0] == '.' && p[1] == '/')
			p += 2;
		if (!p || archive_entry_filetype(e) != AE_IFREG)
			continue;
		if (m->format == CACHE_AUTO) {
			if (strncmp(p, "io.vllm.", 8) == 0)
				m->format = CACHE_VLLM;
			else if (strncmp(p, "io.triton.", 10) == 0)
				m->format = CACHE_TRITON;
		}
		char cprefix[32], mpath[48];
		snprintf(cprefix, sizeof(cprefix), "io.%s.cache/", fmt_prefix(m->format));
		snprintf(mpath, sizeof(mpath), "io.%s.manifest/manifest.json",
		         fmt_prefix(m->format));
		size_t cpl = strlen(cprefix);
		int64_t size = archive_entry_size(e);
		if (strcmp(p, mpath) == 0 && !manifest) {
			size_t len = 0;
			if ((rc = read_entry_data(a, LAYER_MANIFEST_MAX, &manifest, &len))) {
				oci_errf(err, "reading %s from the layer: %s", mpath,
				         rc == -EFBIG ? "too large" : archive_error_string(a));
				goto out;
			}
			continue;
		}
		if (strncmp(p, cprefix, cpl) != 0)
			continue;
		size_t nl = strlen(p);
		char *data = NULL;
		size_t len = 0;
		if (nl > 5 && strcmp(p + nl - 5, ".json") == 0 && size <= (int64_t)CACHE_JSON_MAX &&
		    (rc = read_entry_data(a, CACHE_JSON_MAX, &data, &len))) {
			oci_errf(err, "reading %s from the layer: %s", p, archive_error_string(a));
			goto out;
		}
		cache_meta_add(m, p + cpl, size > 0 ? (uint64_t)size : 0, data, len);
		free(data);
	}
	if ((rc = oci_blob_drain(r))) {
		oci_errf(err, "%s", oci_blob_error(r));
		goto out;
	}
	if (manifest_out) {
		*manifest_out = manifest;
		manifest = NULL;
	}
out:
	free(manifest);
	archive_read_free(a);
	return rc;
}
