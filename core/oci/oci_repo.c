#include "oci_repo.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oci_layout.h"
#include "progress.h"

struct oci_repo {
	struct oci_ref ref;
	char *name;
	struct oci_registry *reg; /* exactly one of reg and lay */
	struct oci_layout *lay;
	bool borrowed; /* reg is the caller's */
};

int oci_repo_open(const struct oci_ref *ref, const struct oci_registry_opts *opts, bool create,
                  struct oci_repo **out, struct oci_err *err)
{
	struct oci_repo *r = calloc(1, sizeof(*r));
	int rc = -ENOMEM;
	if (!r)
		return rc;
	if (oci_ref_copy(ref, &r->ref) || !(r->name = oci_ref_name(ref)))
		goto fail;
	if (ref->kind == OCI_REF_LAYOUT)
		rc = oci_layout_open(ref->dir, create, &r->lay, err);
	else
		rc = oci_registry_new(oci_ref_api_host(ref), opts, &r->reg, err);
	if (rc)
		goto fail;
	*out = r;
	return 0;
fail:
	oci_repo_free(r);
	return rc;
}

int oci_repo_open_on(const struct oci_ref *ref, struct oci_registry *client, struct oci_repo **out,
                     struct oci_err *err)
{
	if (ref->kind != OCI_REF_REGISTRY) {
		oci_errf(err, "%s: not a registry reference", ref->dir);
		return -EINVAL;
	}
	struct oci_repo *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->reg = client;
	r->borrowed = true;
	if (oci_ref_copy(ref, &r->ref) || !(r->name = oci_ref_name(ref))) {
		oci_repo_free(r);
		return -ENOMEM;
	}
	*out = r;
	return 0;
}

void oci_repo_free(struct oci_repo *r)
{
	if (!r)
		return;
	if (!r->borrowed)
		oci_registry_free(r->reg);
	oci_layout_free(r->lay);
	oci_ref_clear(&r->ref);
	free(r->name);
	free(r);
}

const struct oci_ref *oci_repo_ref(const struct oci_repo *r)
{
	return &r->ref;
}

const char *oci_repo_name(const struct oci_repo *r)
{
	return r->name;
}

int oci_repo_resolve(struct oci_repo *r, const char *reference, struct oci_desc *out,
                     struct oci_err *err)
{
	if (r->lay)
		return oci_layout_resolve(r->lay, reference, out, err);
	return oci_registry_resolve(r->reg, r->ref.repository, reference, out, err);
}

int oci_repo_get_manifest(struct oci_repo *r, const char *reference, struct oci_fetched *out,
                          struct oci_err *err)
{
	if (r->lay)
		return oci_layout_get_manifest(r->lay, reference, 4u << 20, out, err);
	return oci_registry_get_manifest(r->reg, r->ref.repository, reference, out, err);
}

int oci_repo_blob_open(struct oci_repo *r, const struct oci_desc *d, const char *what,
                       struct oci_blob_reader **out, struct oci_err *err)
{
	if (!oci_digest_valid(d->digest)) {
		oci_errf(err, "%s has an invalid digest '%s'", what ? what : "blob", d->digest);
		return -EINVAL;
	}
	if (r->lay)
		return oci_layout_blob_open(r->lay, d, what, out, err);
	return oci_registry_blob_open(r->reg, r->ref.repository, d, what, out, err);
}

int oci_repo_blob_readable(struct oci_repo *r, const struct oci_desc *d, struct oci_err *err)
{
	if (!oci_digest_valid(d->digest)) {
		oci_errf(err, "invalid blob digest '%s'", d->digest);
		return -EINVAL;
	}
	if (!r->lay)
		return oci_registry_blob_readable(r->reg, r->ref.repository, d, err);
	char *path = oci_layout_blob_path(r->lay, d->digest);
	int rc = !path ? -ENOMEM : access(path, R_OK) == 0 ? 0 : -errno;
	if (rc)
		oci_errf(err, "blob %s is not in %s: %s", d->digest, oci_repo_name(r),
		         strerror(-rc));
	free(path);
	return rc;
}

int oci_repo_get_blob(struct oci_repo *r, const struct oci_desc *d, size_t max, const char *what,
                      char **out, size_t *len, struct oci_err *err)
{
	struct oci_blob_reader *rd = NULL;
	if (d->size > (int64_t)max) {
		oci_errf(err, "%s %s is %lld bytes, more than the %zu accepted",
		         what ? what : "blob", d->digest, (long long)d->size, max);
		return -EFBIG;
	}
	int rc = oci_repo_blob_open(r, d, what, &rd, err);
	if (rc)
		return rc;
	return oci_blob_slurp(rd, max, out, len, err);
}

int oci_repo_put_blob_file(struct oci_repo *r, const char *path, const struct oci_desc *d,
                           struct oci_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		oci_errf(err, "cannot open %s: %s", path, strerror(errno));
		return rc;
	}
	int rc;
	if (r->reg) {
		rc = oci_registry_push_blob(r->reg, r->ref.repository, fd, NULL, d, err);
		close(fd);
		return rc;
	}
	struct oci_blob_reader *rd = NULL;
	rc = oci_blob_reader_new(&oci_blob_fd_source, (void *)(intptr_t)fd, d->digest, d->size,
	                         "blob", &rd);
	if (rc)
		return rc;
	rc = oci_layout_put_blob_reader(r->lay, rd, d->digest, err);
	oci_blob_close(rd);
	return rc;
}

int oci_repo_put_blob_mem(struct oci_repo *r, const void *buf, size_t len, struct oci_err *err)
{
	if (r->lay)
		return oci_layout_put_blob_mem(r->lay, buf, len, NULL, err);
	struct oci_desc d = {0};
	int rc = oci_digest_buf(buf, len, d.digest);
	if (rc)
		return rc;
	d.size = (int64_t)len;
	return oci_registry_push_blob(r->reg, r->ref.repository, -1, buf, &d, err);
}

int oci_repo_put_manifest(struct oci_repo *r, const char *tag, const char *media_type,
                          const char *data, size_t len, const char *artifact_type,
                          char digest_out[OCI_DIGEST_MAX], bool *subject_ack, struct oci_err *err)
{
	if (subject_ack)
		*subject_ack = false;
	if (r->lay)
		return oci_layout_put_manifest(r->lay, tag, media_type, data, len, artifact_type,
		                               digest_out, err);
	char dg[OCI_DIGEST_MAX];
	int rc = oci_digest_buf(data, len, dg);
	if (rc)
		return rc;
	return oci_registry_put_manifest(r->reg, r->ref.repository, tag ? tag : dg, media_type,
	                                 data, len, digest_out, subject_ack, err);
}

int oci_repo_referrers(struct oci_repo *r, const char *digest, const char *artifact_type,
                       struct oci_index *out, struct oci_err *err)
{
	if (r->lay) {
		oci_errf(err, "layouts have no referrers API");
		return -EOPNOTSUPP;
	}
	return oci_registry_referrers(r->reg, r->ref.repository, digest, artifact_type, out, err);
}

void oci_image_clear(struct oci_image *img)
{
	if (!img)
		return;
	free(img->top_media_type);
	oci_desc_clear(&img->desc);
	oci_fetched_clear(&img->raw);
	oci_manifest_clear(&img->manifest);
	free(img->config_raw);
	oci_config_clear(&img->config);
	memset(img, 0, sizeof(*img));
}

static int parse_platform(const char *platform, char *os, char *arch, char *variant, size_t cap,
                          struct oci_err *err)
{
	if (!platform) {
		snprintf(os, cap, "linux");
		snprintf(arch, cap, "%s", oci_host_arch());
		variant[0] = '\0';
		return 0;
	}
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", platform);
	char *a = strchr(buf, '/');
	char *v = a ? strchr(a + 1, '/') : NULL;
	if (!a || a == buf || !a[1] || (v && !v[1])) {
		oci_errf(err, "invalid platform '%s' (want os/arch[/variant])", platform);
		return -EINVAL;
	}
	*a = '\0';
	if (v)
		*v = '\0';
	const char *parts[3] = {buf, a + 1, v ? v + 1 : ""};
	char *dst[3] = {os, arch, variant};
	for (int i = 0; i < 3; i++) {
		size_t n = strlen(parts[i]);
		if (n >= cap) {
			oci_errf(err, "invalid platform '%s' (too long)", platform);
			return -EINVAL;
		}
		memcpy(dst[i], parts[i], n + 1);
	}
	return 0;
}

int oci_repo_fetch_image(struct oci_repo *r, const char *reference, const char *platform,
                         struct oci_image *out, struct oci_err *err)
{
	struct oci_image img = {0};
	struct oci_index ix = {0};
	char os[64], arch[64], variant[64];
	int rc = parse_platform(platform, os, arch, variant, sizeof(os), err);
	if (rc)
		return rc;
	if ((rc = oci_repo_get_manifest(r, reference, &img.raw, err)))
		goto out;
	memcpy(img.top_digest, img.raw.digest, sizeof(img.top_digest));
	rc = -ENOMEM;
	if (!(img.top_media_type = strdup(img.raw.media_type ? img.raw.media_type : "")))
		goto out;
	enum oci_kind k = oci_kind_of(img.raw.media_type);
	if (k == OCI_KIND_UNKNOWN)
		k = oci_detect_kind(img.raw.data, img.raw.len, img.raw.media_type);
	if (k == OCI_KIND_INDEX) {
		size_t which = 0;
		if ((rc = oci_index_parse(img.raw.data, img.raw.len, img.raw.media_type, &ix, err)))
			goto out;
		if ((rc =
		         oci_index_select(&ix, os, arch, variant[0] ? variant : NULL, &which, err)))
			goto out;
		const struct oci_desc *child = &ix.manifests[which];
		oci_fetched_clear(&img.raw);
		if ((rc = oci_repo_get_manifest(r, child->digest, &img.raw, err)))
			goto out;
		k = OCI_KIND_MANIFEST;
	} else if (k != OCI_KIND_MANIFEST) {
		oci_errf(err,
		         "%s is of unsupported media type '%s' (not an image manifest or index)",
		         reference, img.raw.media_type ? img.raw.media_type : "(none)");
		rc = -EPROTONOSUPPORT;
		goto out;
	}
	if ((rc = oci_manifest_parse(img.raw.data, img.raw.len, img.raw.media_type, &img.manifest,
	                             err)))
		goto out;
	memcpy(img.desc.digest, img.raw.digest, sizeof(img.desc.digest));
	img.desc.size = (int64_t)img.raw.len;
	rc = -ENOMEM;
	if (!(img.desc.media_type = strdup(img.manifest.media_type)))
		goto out;
	const struct oci_desc *cd = &img.manifest.config;
	if ((rc = oci_repo_get_blob(r, cd, OCI_MAX_CONFIG_BYTES, "image config", &img.config_raw,
	                            &img.config_len, err)))
		goto out;
	if (strcmp(cd->media_type, OCI_MT_CONFIG) == 0 ||
	    strcmp(cd->media_type, DOCKER_MT_CONFIG) == 0) {
		if ((rc = oci_config_parse(img.config_raw, img.config_len, &img.config, err)))
			goto out;
	} else if (!(img.config.root = cJSON_CreateObject())) {
		rc = -ENOMEM; /* an artifact: its config is not an image config */
		goto out;
	}
	*out = img;
	memset(&img, 0, sizeof(img));
	rc = 0;
out:
	oci_index_clear(&ix);
	oci_image_clear(&img);
	return rc;
}

/* Copy one blob from src to dst unless dst has it. */
int oci_repo_copy_blob(struct oci_repo *src, struct oci_repo *dst, const struct oci_desc *d,
                       const char *what, struct oci_err *err)
{
	struct oci_blob_reader *rd = NULL;
	int rc;
	if (dst->lay) {
		if (oci_layout_has_blob(dst->lay, d->digest)) {
			progress_add(PROGRESS_PRESENT, (uint64_t)d->size, 0);
			return 0;
		}
		if ((rc = oci_repo_blob_open(src, d, what, &rd, err)))
			return rc;
		rc = oci_layout_put_blob_reader(dst->lay, rd, d->digest, err);
		oci_blob_close(rd);
		return rc;
	}
	bool exists = false;
	if ((rc = oci_registry_blob_exists(dst->reg, dst->ref.repository, d->digest, &exists, err)))
		return rc;
	if (exists) {
		progress_add(PROGRESS_PRESENT, (uint64_t)d->size, 0);
		return 0;
	}
	if (src->lay) {
		char *path = oci_layout_blob_path(src->lay, d->digest);
		if (!path)
			return -ENOMEM;
		rc = oci_repo_put_blob_file(dst, path, d, err);
		free(path);
		return rc;
	}
	/* registry to registry: through a temporary file, verified on the way */
	const char *tmpdir = getenv("TMPDIR");
	char *path = NULL;
	if (asprintf(&path, "%s/gkm-blob-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp") < 0)
		return -ENOMEM;
	int fd = mkostemp(path, O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		free(path);
		return rc;
	}
	unlink(path);
	free(path);
	if ((rc = oci_repo_blob_open(src, d, what, &rd, err)))
		goto out;
	char buf[1 << 16];
	for (;;) {
		ssize_t n = oci_blob_read(rd, buf, sizeof(buf));
		if (n < 0) {
			oci_errf(err, "%s", oci_blob_error(rd));
			rc = (int)n;
			goto out;
		}
		if (n == 0)
			break;
		if (write(fd, buf, (size_t)n) != n) {
			rc = -EIO;
			oci_errf(err, "writing a temporary copy of %s: %s", d->digest,
			         strerror(errno));
			goto out;
		}
	}
	rc = oci_registry_push_blob(dst->reg, dst->ref.repository, fd, NULL, d, err);
out:
	oci_blob_close(rd);
	close(fd);
	return rc;
}

static int copy_manifest(struct oci_repo *src, const char *reference, struct oci_repo *dst,
                         const char *tag, int depth, char digest_out[OCI_DIGEST_MAX],
                         struct oci_err *err)
{
	struct oci_fetched f = {0};
	struct oci_manifest m = {0};
	struct oci_index ix = {0};
	int rc = oci_repo_get_manifest(src, reference, &f, err);
	if (rc)
		return rc;
	enum oci_kind k = oci_kind_of(f.media_type);
	if (k == OCI_KIND_UNKNOWN)
		k = oci_detect_kind(f.data, f.len, f.media_type);
	if (k == OCI_KIND_INDEX && depth == 0) {
		if ((rc = oci_index_parse(f.data, f.len, f.media_type, &ix, err)))
			goto out;
		for (size_t i = 0; i < ix.n_manifests; i++)
			if ((rc = copy_manifest(src, ix.manifests[i].digest, dst, NULL, depth + 1,
			                        NULL, err)))
				goto out;
	} else if (k == OCI_KIND_MANIFEST) {
		if ((rc = oci_manifest_parse(f.data, f.len, f.media_type, &m, err)))
			goto out;
		progress_add_total((uint64_t)m.config.size);
		for (size_t i = 0; i < m.n_layers; i++)
			progress_add_total((uint64_t)m.layers[i].size);
		if ((rc = oci_repo_copy_blob(src, dst, &m.config, "config", err)))
			goto out;
		for (size_t i = 0; i < m.n_layers; i++) {
			char what[32];
			snprintf(what, sizeof(what), "layer %zu", i);
			if ((rc = oci_repo_copy_blob(src, dst, &m.layers[i], what, err)))
				goto out;
		}
	} else {
		oci_errf(err, "cannot copy %s: unsupported media type '%s'", reference,
		         f.media_type ? f.media_type : "(none)");
		rc = -EPROTONOSUPPORT;
		goto out;
	}
	rc = oci_repo_put_manifest(dst, tag, f.media_type, f.data, f.len,
	                           m.artifact_type ? m.artifact_type : ix.artifact_type, digest_out,
	                           NULL, err);
out:
	oci_manifest_clear(&m);
	oci_index_clear(&ix);
	oci_fetched_clear(&f);
	return rc;
}

int oci_repo_copy_image(struct oci_repo *src, const char *src_reference, struct oci_repo *dst,
                        const char *dst_tag, char digest_out[OCI_DIGEST_MAX], struct oci_err *err)
{
	return copy_manifest(src, src_reference, dst, dst_tag, 0, digest_out, err);
}
