#include "oci_registry_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- manifests ------------------------------------------------------- */

static int manifest_url(const struct oci_registry *r, char *url, size_t cap, const char *repo,
                        const char *reference)
{
	return reg_build_url(r, url, cap, "/%s/manifests/%s", repo, reference);
}

bool reg_is_digest_ref(const char *reference)
{
	return strchr(reference, ':') != NULL;
}

/* HEAD or GET a manifest; *out is the exchange when it answered 200. */
static int manifest_request(struct oci_registry *r, const char *method, const char *repo,
                            const char *reference, struct xfer **out, struct oci_err *err)
{
	char url[URL_MAX], scope[512];
	struct xfer *x = NULL;
	reg_pull_scope(scope, sizeof(scope), repo);
	int rc = manifest_url(r, url, sizeof(url), repo, reference);
	if (rc)
		return rc;
	struct req q = {
	    .method = method, .accept = OCI_MANIFEST_ACCEPT, .total_timeout = true, .up_fd = -1};
	if (strcmp(method, "GET") == 0)
		q.body_max = r->o.max_manifest_bytes;
	if ((rc = reg_request(r, &q, url, sizeof(url), scope, &x, err))) {
		if (rc == -EFBIG)
			oci_errf(err, "manifest %s of %s/%s is larger than the %zu bytes accepted",
			         reference, r->host, repo, r->o.max_manifest_bytes);
		return rc;
	}
	if (x->status == 404) {
		oci_errf(err, "%s/%s:%s not found", r->host, repo, reference);
		rc = -ENOENT;
	} else if (x->status != 200) {
		reg_describe_status(x, method, url, err);
		rc = reg_status_errno(x->status);
	}
	if (rc) {
		reg_xfer_free(x);
		return rc;
	}
	char *semi = strchr(x->content_type, ';');
	if (semi)
		*semi = '\0';
	*out = x;
	return 0;
}

int reg_resolve_at(struct oci_registry *r, const char *repo, const char *reference,
                   struct oci_desc *out, struct oci_err *err)
{
	struct xfer *x = NULL;
	int rc = manifest_request(r, "HEAD", repo, reference, &x, err);
	if (rc)
		return rc;
	if (!x->docker_digest[0] || !oci_digest_valid(x->docker_digest) || x->content_length < 0 ||
	    !x->content_type[0]) {
		/* no usable digest header: fetch and hash */
		struct oci_fetched f = {0};
		reg_xfer_free(x);
		x = NULL;
		if ((rc = reg_get_manifest_at(r, repo, reference, &f, err)))
			return rc;
		struct oci_desc d = {0};
		d.media_type = f.media_type;
		f.media_type = NULL;
		memcpy(d.digest, f.digest, sizeof(d.digest));
		d.size = (int64_t)f.len;
		oci_fetched_clear(&f);
		*out = d;
		return 0;
	}
	if (reg_is_digest_ref(reference) && strcmp(reference, x->docker_digest) != 0) {
		oci_errf(err, "registry %s says manifest %s has digest %s", r->host, reference,
		         x->docker_digest);
		rc = -EBADMSG;
		goto out;
	}
	struct oci_desc d = {0};
	if (!(d.media_type = strdup(x->content_type))) {
		rc = -ENOMEM;
		goto out;
	}
	memcpy(d.digest, x->docker_digest, strlen(x->docker_digest) + 1); /* valid, so it fits */
	d.size = x->content_length;
	*out = d;
out:
	reg_xfer_free(x);
	return rc;
}

int reg_get_manifest_at(struct oci_registry *r, const char *repo, const char *reference,
                        struct oci_fetched *out, struct oci_err *err)
{
	struct xfer *x = NULL;
	int rc = manifest_request(r, "GET", repo, reference, &x, err);
	if (rc)
		return rc;
	struct oci_fetched f = {0};
	/* Hash with the algorithm the reference or the header names. */
	const char *like = reg_is_digest_ref(reference) ? reference
	                   : x->docker_digest[0]        ? x->docker_digest
	                                                : NULL;
	struct oci_hasher h;
	if ((rc = oci_hasher_init(&h, like)))
		goto out;
	oci_hasher_update(&h, x->body ? x->body : "", x->body_len);
	rc = oci_hasher_final(&h, f.digest);
	oci_hasher_free(&h);
	if (rc)
		goto out;
	if (reg_is_digest_ref(reference) && strcmp(f.digest, reference) != 0) {
		oci_errf(err,
		         "manifest %s from %s/%s has content digest %s (the registry sent "
		         "other bytes than asked for)",
		         reference, r->host, repo, f.digest);
		rc = -EBADMSG;
		goto out;
	}
	if (x->docker_digest[0] && strcmp(f.digest, x->docker_digest) != 0) {
		oci_errf(err,
		         "registry %s sent Docker-Content-Digest %s for %s:%s but the manifest "
		         "it sent has digest %s",
		         r->host, x->docker_digest, repo, reference, f.digest);
		rc = -EBADMSG;
		goto out;
	}
	const char *mt = x->content_type;
	if (!*mt || strcmp(mt, "application/json") == 0 || strcmp(mt, "text/plain") == 0) {
		/* some registries and layouts do not say; look inside */
		enum oci_kind k = oci_detect_kind(x->body, x->body_len, NULL);
		mt = k == OCI_KIND_INDEX      ? OCI_MT_INDEX
		     : k == OCI_KIND_MANIFEST ? OCI_MT_MANIFEST
		                              : mt;
	}
	if (!(f.media_type = strdup(mt))) {
		rc = -ENOMEM;
		goto out;
	}
	if (!x->body && !(x->body = calloc(1, 1))) {
		oci_fetched_clear(&f);
		rc = -ENOMEM;
		goto out;
	}
	f.data = x->body;
	f.len = x->body_len;
	x->body = NULL;
	*out = f;
out:
	reg_xfer_free(x);
	return rc;
}

int oci_registry_put_manifest(struct oci_registry *r, const char *repo, const char *reference,
                              const char *media_type, const char *data, size_t len,
                              char digest_out[OCI_DIGEST_MAX], bool *subject_ack,
                              struct oci_err *err)
{
	char url[URL_MAX], scope[512], dg[OCI_DIGEST_MAX];
	struct xfer *x = NULL;
	reg_push_scope(scope, sizeof(scope), repo);
	int rc = oci_digest_buf(data, len, dg);
	if (rc)
		return rc;
	if ((rc = manifest_url(r, url, sizeof(url), repo, reference)))
		return rc;
	struct req q = {.method = "PUT",
	                .content_type = media_type,
	                .up_fd = -1,
	                .up_mem = data,
	                .up_len = len,
	                .total_timeout = true};
	if ((rc = reg_request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	if (x->status != 201 && x->status != 200) {
		reg_describe_status(x, "PUT", url, err);
		oci_err_prefix(err, "manifest push refused");
		rc = reg_status_errno(x->status);
		goto out;
	}
	if (x->docker_digest[0] && strcmp(x->docker_digest, dg) != 0) {
		oci_errf(err, "registry stored manifest as %s but its bytes hash to %s",
		         x->docker_digest, dg);
		rc = -EBADMSG;
		goto out;
	}
	if (digest_out)
		memcpy(digest_out, dg, OCI_DIGEST_MAX);
	if (subject_ack)
		*subject_ack = x->oci_subject[0] != '\0';
out:
	reg_xfer_free(x);
	return rc;
}

int reg_referrers_at(struct oci_registry *r, const char *repo, const char *digest,
                     const char *artifact_type, struct oci_index *out, struct oci_err *err)
{
	char url[URL_MAX], scope[512];
	struct xfer *x = NULL;
	struct oci_index ix = {0};
	reg_pull_scope(scope, sizeof(scope), repo);
	int rc;
	if (artifact_type) {
		CURL *esc = curl_easy_init();
		char *at = esc ? curl_easy_escape(esc, artifact_type, 0) : NULL;
		rc = at ? reg_build_url(r, url, sizeof(url), "/%s/referrers/%s?artifactType=%s",
		                        repo, digest, at)
		        : -ENOMEM;
		curl_free(at);
		curl_easy_cleanup(esc);
	} else {
		rc = reg_build_url(r, url, sizeof(url), "/%s/referrers/%s", repo, digest);
	}
	if (rc)
		return rc;
	struct req q = {.method = "GET",
	                .accept = OCI_MT_INDEX,
	                .total_timeout = true,
	                .body_max = r->o.max_manifest_bytes,
	                .up_fd = -1};
	if ((rc = reg_request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	if (x->status == 404 || x->status == 405 || x->status == 400) {
		oci_errf(err, "registry %s has no referrers API (HTTP %ld)", r->host, x->status);
		rc = -EOPNOTSUPP;
		goto out;
	}
	if (x->status != 200) {
		reg_describe_status(x, "GET", url, err);
		rc = reg_status_errno(x->status);
		goto out;
	}
	char *semi = strchr(x->content_type, ';');
	if (semi)
		*semi = '\0';
	if (strcmp(x->content_type, OCI_MT_INDEX) != 0) {
		/* a catch-all route answering 200 with something else: no API */
		oci_errf(err, "registry %s answered the referrers API with '%s'", r->host,
		         x->content_type);
		rc = -EOPNOTSUPP;
		goto out;
	}
	if ((rc = oci_index_parse(x->body ? x->body : "", x->body_len, OCI_MT_INDEX, &ix, err))) {
		oci_err_prefix(err, "referrers of %s", digest);
		goto out;
	}
	if (artifact_type && !strstr(x->filters, "artifactType")) {
		size_t keep = 0;
		for (size_t i = 0; i < ix.n_manifests; i++) {
			const char *t = ix.manifests[i].artifact_type;
			if (t && strcmp(t, artifact_type) == 0)
				ix.manifests[keep++] = ix.manifests[i];
			else
				oci_desc_clear(&ix.manifests[i]);
		}
		ix.n_manifests = keep;
	}
	*out = ix;
	memset(&ix, 0, sizeof(ix));
out:
	oci_index_clear(&ix);
	reg_xfer_free(x);
	return rc;
}
