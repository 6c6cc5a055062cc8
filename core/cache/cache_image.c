#include "cache_image_impl.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "gzpipe.h"
#include "oci_auth.h"
#include "progress.h"
#include "textfmt.h"

/* ---- writing the layer ------------------------------------------------ */

struct layer_writer {
	struct walk_ctx w;
	const struct cache_build_opts *o;
	struct cache_meta *m;
	struct archive *a;
	int fd;
	struct gzp *gz;
	struct oci_hasher diff, comp;
	uint64_t tar_bytes, gz_bytes;
	int64_t newest;
	int io_errno;
	const char *prefix; /* "io.triton.cache" */
	cJSON *files;       /* res->files: the first o->list_files files, listed */
};

/* The compressed layer: hashed for its digest and written to the file, on
 * the compressing thread (gzpipe.h) while the walk goes on. */
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
	int rc = gzp_write(lw->gz, buf, len);
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
	progress_add(PROGRESS_PACKED, len, 0);
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
	int rc = ci_open_entry(&lw->w, e, &fd);
	if (rc)
		return rc;
	listed = list_start(lw, &h);
	size_t jlen = 0;
	char *json = ci_read_small_json(e, fd, &jlen);
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
		if (!(rc = ci_check_unchanged(&lw->w, e, fd)) &&
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
				rc = ci_check_unchanged(&lw->w, e, fd);
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
	rc = ci_check_unchanged(&lw->w, e, fd);
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
	int rc = ci_admit(w, e);
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
	if ((rc = write_file(lw, e, name)) == 0)
		progress_add(PROGRESS_PACKED, 0, 1);
	return rc;
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
	snprintf(prefix, sizeof(prefix), "io.%s.cache", ci_fmt_prefix(o->format));
	snprintf(mdir, sizeof(mdir), "io.%s.manifest", ci_fmt_prefix(o->format));
	snprintf(mname, sizeof(mname), "%s/manifest.json", mdir);
	lw.prefix = prefix;
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		oci_errf(err, "%s is not a directory", dir);
		return -ENOTDIR;
	}
	if ((rc = oci_hasher_init(&lw.diff, NULL)) || (rc = oci_hasher_init(&lw.comp, NULL)) ||
	    (rc = gzp_new(o->level, gz_out, &lw, &lw.gz)))
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
	    (rc = ci_walk_root(&lw.w, dir)) || (rc = ci_check_found(dir, whole, err)))
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
	if ((rc = gzp_finish(lw.gz))) {
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
	gzp_free(lw.gz);
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
	rfc3339_format(t, buf, cap);
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
	         ci_fmt_prefix(o->format));
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
	/* no fsync: the file is read back once for the push and removed, and
	 * the registry checks the blob against its digest */
	rc = write_layer(dir, &o, fd, res, err);
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
