#include "fsutil.h"
#include "oci_layout.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "oci_auth.h"

#define INDEX_MAX (16u << 20)
#define LAYOUT_FILE "{\"imageLayoutVersion\":\"1.0.0\"}"

struct oci_layout {
	char *dir;
};

static char *join(const char *a, const char *b)
{
	char *s = NULL;
	if (asprintf(&s, "%s/%s", a, b) < 0)
		return NULL;
	return s;
}

/* Write data to path atomically (tmp + fsync + rename). */
static int write_atomic(const char *dir, const char *name, const char *data, size_t len)
{
	char *path = join(dir, name);
	char *tmp = NULL;
	int fd = -1, rc = 0;
	if (!path || asprintf(&tmp, "%s.tmp.%d", path, (int)getpid()) < 0) {
		tmp = NULL;
		rc = -ENOMEM;
		goto out;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if ((rc = fsutil_write_all(fd, data, len)) < 0)
		goto out;
	if (fsync(fd) < 0 || close(fd) < 0) {
		fd = -1;
		rc = -errno;
		goto out;
	}
	fd = -1;
	if (rename(tmp, path) < 0)
		rc = -errno;
out:
	if (fd >= 0)
		close(fd);
	if (rc && tmp)
		unlink(tmp);
	free(tmp);
	free(path);
	return rc;
}

int oci_layout_open(const char *dir, bool create, struct oci_layout **out, struct oci_err *err)
{
	struct oci_layout *l = calloc(1, sizeof(*l));
	char *marker = NULL, *index = NULL, *blobs = NULL, *buf = NULL;
	size_t len = 0;
	int rc = -ENOMEM;
	if (!l || !(l->dir = strdup(dir)) || !(marker = join(dir, "oci-layout")) ||
	    !(index = join(dir, "index.json")) || !(blobs = join(dir, "blobs/sha256")))
		goto out;
	struct stat st;
	if (stat(marker, &st) < 0) {
		if (errno != ENOENT || !create) {
			rc = -errno;
			oci_errf(err, "%s is not an OCI image layout (no oci-layout file: %s)", dir,
			         strerror(errno));
			goto out;
		}
		if ((rc = fsutil_mkdirs(blobs, 0755))) {
			oci_errf(err, "cannot create layout %s: %s", dir, strerror(-rc));
			goto out;
		}
		if ((rc = write_atomic(dir, "oci-layout", LAYOUT_FILE, strlen(LAYOUT_FILE))))
			goto io;
	} else {
		rc = fsutil_read_file(marker, 4096, &buf, &len);
		if (rc || !strstr(buf, "imageLayoutVersion")) {
			oci_errf(err, "%s/oci-layout is unreadable or not a layout marker", dir);
			rc = rc ? rc : -EINVAL;
			goto out;
		}
		if (create && (rc = fsutil_mkdirs(blobs, 0755)))
			goto io;
	}
	if (access(index, F_OK) < 0) {
		static const char empty[] =
		    "{\"schemaVersion\":2,\"mediaType\":\"" OCI_MT_INDEX "\",\"manifests\":[]}";
		if (!create) {
			oci_errf(err, "%s has no index.json", dir);
			rc = -ENOENT;
			goto out;
		}
		if ((rc = write_atomic(dir, "index.json", empty, strlen(empty))))
			goto io;
	}
	*out = l;
	l = NULL;
	rc = 0;
	goto out;
io:
	oci_errf(err, "cannot write layout %s: %s", dir, strerror(-rc));
out:
	free(buf);
	free(marker);
	free(index);
	free(blobs);
	oci_layout_free(l);
	return rc;
}

void oci_layout_free(struct oci_layout *l)
{
	if (!l)
		return;
	free(l->dir);
	free(l);
}

char *oci_layout_blob_path(const struct oci_layout *l, const char *digest)
{
	const char *colon = strchr(digest, ':');
	char *s = NULL;
	if (!colon ||
	    asprintf(&s, "%s/blobs/%.*s/%s", l->dir, (int)(colon - digest), digest, colon + 1) < 0)
		return NULL;
	return s;
}

bool oci_layout_has_blob(struct oci_layout *l, const char *digest)
{
	if (!oci_digest_valid(digest))
		return false;
	char *p = oci_layout_blob_path(l, digest);
	bool ok = p && access(p, F_OK) == 0;
	free(p);
	return ok;
}

static int read_index(struct oci_layout *l, struct oci_index *ix, struct oci_err *err)
{
	char *path = join(l->dir, "index.json");
	char *buf = NULL;
	size_t len = 0;
	if (!path)
		return -ENOMEM;
	int rc = fsutil_read_file(path, INDEX_MAX, &buf, &len);
	if (rc) {
		oci_errf(err, "cannot read %s: %s", path, strerror(-rc));
	} else if ((rc = oci_index_parse(buf, len, OCI_MT_INDEX, ix, err))) {
		oci_err_prefix(err, "%s", path);
	}
	free(buf);
	free(path);
	return rc;
}

int oci_layout_blob_open(struct oci_layout *l, const struct oci_desc *d, const char *what,
                         struct oci_blob_reader **out, struct oci_err *err)
{
	if (!oci_digest_valid(d->digest)) {
		oci_errf(err, "invalid digest '%s'", d->digest);
		return -EINVAL;
	}
	char *p = oci_layout_blob_path(l, d->digest);
	if (!p)
		return -ENOMEM;
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		oci_errf(err, "%s %s is not in layout %s (%s)", what ? what : "blob", d->digest,
		         l->dir, strerror(errno));
		free(p);
		return rc;
	}
	free(p);
	return oci_blob_reader_new(&oci_blob_fd_source, (void *)(intptr_t)fd, d->digest, d->size,
	                           what, out);
}

int oci_layout_resolve(struct oci_layout *l, const char *reference, struct oci_desc *out,
                       struct oci_err *err)
{
	struct oci_index ix = {0};
	int rc = read_index(l, &ix, err);
	if (rc)
		return rc;
	bool by_digest = strchr(reference, ':') != NULL;
	rc = -ENOENT;
	for (size_t i = ix.n_manifests; i-- > 0;) {
		const struct oci_desc *d = &ix.manifests[i];
		const char *name = oci_desc_annotation(d, OCI_ANN_REF_NAME);
		if (by_digest ? strcmp(d->digest, reference) == 0
		              : name && strcmp(name, reference) == 0) {
			rc = oci_desc_copy(d, out);
			goto out;
		}
	}
	if (by_digest && oci_layout_has_blob(l, reference)) {
		/* not listed (a child of an index, a referrer): describe it from its bytes */
		struct oci_fetched f = {0};
		struct oci_desc probe = {0};
		snprintf(probe.digest, sizeof(probe.digest), "%s", reference);
		probe.size = -1;
		struct oci_blob_reader *r = NULL;
		if ((rc = oci_layout_blob_open(l, &probe, "manifest", &r, err)))
			goto out;
		if ((rc = oci_blob_slurp(r, INDEX_MAX, &f.data, &f.len, err)))
			goto out;
		enum oci_kind k = oci_detect_kind(f.data, f.len, NULL);
		free(f.data);
		struct oci_desc d = {0};
		memcpy(d.digest, probe.digest, sizeof(d.digest));
		d.size = (int64_t)f.len;
		if (!(d.media_type =
		          strdup(k == OCI_KIND_INDEX ? OCI_MT_INDEX : OCI_MT_MANIFEST))) {
			rc = -ENOMEM;
			goto out;
		}
		*out = d;
		rc = 0;
		goto out;
	}
	oci_errf(err, "%s not found in layout %s", reference, l->dir);
out:
	oci_index_clear(&ix);
	return rc;
}

int oci_layout_get_manifest(struct oci_layout *l, const char *reference, size_t max,
                            struct oci_fetched *out, struct oci_err *err)
{
	struct oci_desc d = {0};
	struct oci_fetched f = {0};
	struct oci_blob_reader *r = NULL;
	int rc = oci_layout_resolve(l, reference, &d, err);
	if (rc)
		return rc;
	if (d.size > (int64_t)max) {
		oci_errf(err, "manifest %s is %lld bytes, more than the %zu accepted", d.digest,
		         (long long)d.size, max);
		rc = -EFBIG;
		goto out;
	}
	if ((rc = oci_layout_blob_open(l, &d, "manifest", &r, err)))
		goto out;
	if ((rc = oci_blob_slurp(r, max, &f.data, &f.len, err)))
		goto out;
	memcpy(f.digest, d.digest, sizeof(f.digest));
	f.media_type = d.media_type;
	d.media_type = NULL;
	*out = f;
out:
	oci_desc_clear(&d);
	return rc;
}

int oci_layout_tmpfile(struct oci_layout *l, int *fd, char **path)
{
	char *p = NULL;
	if (asprintf(&p, "%s/blobs/.tmp-XXXXXX", l->dir) < 0)
		return -ENOMEM;
	int f = mkostemp(p, O_CLOEXEC);
	if (f < 0) {
		int rc = -errno;
		free(p);
		return rc;
	}
	fchmod(f, 0644);
	*fd = f;
	*path = p;
	return 0;
}

int oci_layout_commit_blob(struct oci_layout *l, const char *tmp_path, const char *digest,
                           struct oci_err *err)
{
	char *dst = oci_layout_blob_path(l, digest);
	char *dir = NULL;
	int rc = 0;
	if (!dst)
		return -ENOMEM;
	dir = strdup(dst);
	if (!dir) {
		rc = -ENOMEM;
		goto out;
	}
	*strrchr(dir, '/') = '\0';
	if ((rc = fsutil_mkdirs(dir, 0755)))
		goto fail;
	int fd = open(tmp_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0) {
		rc = -errno;
		if (fd >= 0)
			close(fd);
		goto fail;
	}
	close(fd);
	if (rename(tmp_path, dst) < 0) {
		rc = -errno;
		goto fail;
	}
	goto out;
fail:
	oci_errf(err, "cannot store blob %s in %s: %s", digest, l->dir, strerror(-rc));
	unlink(tmp_path);
out:
	free(dir);
	free(dst);
	return rc;
}

int oci_layout_put_blob_reader(struct oci_layout *l, struct oci_blob_reader *r, const char *digest,
                               struct oci_err *err)
{
	if (oci_layout_has_blob(l, digest)) {
		/* already stored: still read the source to its verified end */
		int drc = oci_blob_drain(r);
		if (drc < 0)
			oci_errf(err, "%s", oci_blob_error(r));
		return drc;
	}
	int fd = -1;
	char *tmp = NULL;
	char buf[1 << 16];
	int rc = oci_layout_tmpfile(l, &fd, &tmp);
	if (rc) {
		oci_errf(err, "cannot create a file in %s/blobs: %s", l->dir, strerror(-rc));
		return rc;
	}
	for (;;) {
		ssize_t n = oci_blob_read(r, buf, sizeof(buf));
		if (n < 0) {
			oci_errf(err, "%s", oci_blob_error(r));
			rc = (int)n;
			goto fail;
		}
		if (n == 0)
			break;
		if ((rc = fsutil_write_all(fd, buf, (size_t)n)) < 0) {
			oci_errf(err, "writing blob %s into %s: %s", digest, l->dir, strerror(-rc));
			goto fail;
		}
	}
	close(fd);
	fd = -1;
	rc = oci_layout_commit_blob(l, tmp, digest, err);
	free(tmp);
	return rc;
fail:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	free(tmp);
	return rc;
}

int oci_layout_put_blob_mem(struct oci_layout *l, const void *buf, size_t len,
                            char digest_out[OCI_DIGEST_MAX], struct oci_err *err)
{
	char dg[OCI_DIGEST_MAX];
	int rc = oci_digest_buf(buf, len, dg);
	if (rc)
		return rc;
	if (!oci_layout_has_blob(l, dg)) {
		char *rel = NULL;
		if (asprintf(&rel, "blobs/sha256/%s", oci_digest_hex(dg)) < 0)
			return -ENOMEM;
		rc = write_atomic(l->dir, rel, buf, len);
		free(rel);
		if (rc) {
			oci_errf(err, "cannot write blob %s into %s: %s", dg, l->dir,
			         strerror(-rc));
			return rc;
		}
	}
	if (digest_out)
		memcpy(digest_out, dg, OCI_DIGEST_MAX);
	return 0;
}

int oci_layout_put_manifest(struct oci_layout *l, const char *tag, const char *media_type,
                            const char *data, size_t len, const char *artifact_type,
                            char digest_out[OCI_DIGEST_MAX], struct oci_err *err)
{
	char dg[OCI_DIGEST_MAX];
	struct oci_index ix = {0};
	char *out = NULL, *lockp = NULL;
	size_t olen = 0;
	int lfd = -1;
	int rc = oci_layout_put_blob_mem(l, data, len, dg, err);
	if (rc)
		return rc;
	/* serialise index.json updates between processes */
	if (!(lockp = join(l->dir, "index.json.lock")))
		return -ENOMEM;
	lfd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (lfd < 0 || flock(lfd, LOCK_EX) < 0) {
		rc = -errno;
		oci_errf(err, "cannot lock %s: %s", lockp, strerror(errno));
		goto out;
	}
	if ((rc = read_index(l, &ix, err)))
		goto out;
	/* drop entries this one replaces: same tag, or the same untagged digest */
	size_t keep = 0;
	for (size_t i = 0; i < ix.n_manifests; i++) {
		const struct oci_desc *d = &ix.manifests[i];
		const char *name = oci_desc_annotation(d, OCI_ANN_REF_NAME);
		bool drop =
		    tag ? (name && strcmp(name, tag) == 0) : (!name && strcmp(d->digest, dg) == 0);
		if (drop)
			oci_desc_clear(&ix.manifests[i]);
		else
			ix.manifests[keep++] = ix.manifests[i];
	}
	ix.n_manifests = keep;
	struct oci_desc *grown = realloc(ix.manifests, (keep + 1) * sizeof(*grown));
	if (!grown) {
		rc = -ENOMEM;
		goto out;
	}
	ix.manifests = grown;
	struct oci_desc *d = &ix.manifests[keep];
	memset(d, 0, sizeof(*d));
	memcpy(d->digest, dg, sizeof(d->digest));
	d->size = (int64_t)len;
	if (!(d->media_type = strdup(media_type)) ||
	    (artifact_type && !(d->artifact_type = strdup(artifact_type)))) {
		ix.n_manifests = keep + 1;
		rc = -ENOMEM;
		goto out;
	}
	if (tag) {
		if (!(d->annotations = cJSON_CreateObject()) ||
		    !cJSON_AddStringToObject(d->annotations, OCI_ANN_REF_NAME, tag)) {
			ix.n_manifests = keep + 1;
			rc = -ENOMEM;
			goto out;
		}
	}
	ix.n_manifests = keep + 1;
	free(ix.media_type);
	if (!(ix.media_type = strdup(OCI_MT_INDEX))) {
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = oci_index_build(&ix, &out, &olen)))
		goto out;
	if ((rc = write_atomic(l->dir, "index.json", out, olen))) {
		oci_errf(err, "cannot write %s/index.json: %s", l->dir, strerror(-rc));
		goto out;
	}
	if (digest_out)
		memcpy(digest_out, dg, OCI_DIGEST_MAX);
out:
	if (lfd >= 0)
		close(lfd);
	free(lockp);
	free(out);
	oci_index_clear(&ix);
	return rc;
}
