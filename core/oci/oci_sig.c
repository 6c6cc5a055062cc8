#include "oci_sig.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keyless.h"
#include "log.h"
#include "textfmt.h"

void oci_sig_found_clear(struct oci_sig_found *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n; i++) {
		free((void *)f->c[i].data);
		free((void *)f->c[i].signature_b64);
		free((void *)f->c[i].source);
		free((void *)f->c[i].certificate_pem);
		free((void *)f->c[i].chain_pem);
		free((void *)f->c[i].rekor_bundle);
	}
	memset(f, 0, sizeof(*f));
}

void oci_sig_tag(const char *digest, const char *suffix, char *out, size_t cap)
{
	const char *colon = strchr(digest, ':');
	snprintf(out, cap, "%.*s-%s%s", colon ? (int)(colon - digest) : 0, digest,
	         colon ? colon + 1 : digest, suffix);
}

static int add_candidate(struct oci_sig_found *f, enum sig_kind kind, char *data, size_t len,
                         const char *sig, const char *source)
{
	if (f->n >= OCI_SIG_MAX_CANDIDATES) {
		free(data);
		return 0; /* enough to decide; the rest are ignored */
	}
	struct sig_candidate *c = &f->c[f->n];
	memset(c, 0, sizeof(*c));
	c->kind = kind;
	c->data = data;
	c->len = len;
	if ((sig && !(c->signature_b64 = strdup(sig))) || !(c->source = strdup(source))) {
		free(data);
		free((void *)c->signature_b64);
		free((void *)c->source);
		memset(c, 0, sizeof(*c));
		return -ENOMEM;
	}
	f->n++;
	if (kind == SIG_KIND_SIMPLE)
		f->n_simple++;
	else
		f->n_bundle++;
	return 0;
}

/* What cosign adds to a layer signed keyless: the certificate, its chain
 * and the Rekor bundle (each NULL when absent). */
static int keyless_annotations(struct sig_candidate *c, const struct oci_desc *l)
{
	const char *keys[] = {KEYLESS_ANN_CERTIFICATE, KEYLESS_ANN_CHAIN, KEYLESS_ANN_BUNDLE};
	const char **dst[] = {&c->certificate_pem, &c->chain_pem, &c->rekor_bundle};
	for (size_t i = 0; i < 3; i++) {
		const char *v = oci_desc_annotation(l, keys[i]);
		if (v && !(*dst[i] = strdup(v)))
			return -ENOMEM;
	}
	return 0;
}

/* The manifest at tag; -ENOENT when the tag does not exist. */
static int get_tagged(struct oci_repo *r, const char *tag, struct oci_fetched *f,
                      struct oci_err *err)
{
	struct oci_err e = {{0}};
	int rc = oci_repo_get_manifest(r, tag, f, &e);
	if (rc && rc != -ENOENT && err)
		*err = e;
	return rc;
}

static int collect_simple(struct oci_repo *r, const char *image_digest, struct oci_sig_found *out,
                          struct oci_err *err)
{
	char tag[160];
	struct oci_fetched f = {0};
	struct oci_manifest m = {0};
	oci_sig_tag(image_digest, ".sig", tag, sizeof(tag));
	int rc = get_tagged(r, tag, &f, err);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	if ((rc = oci_manifest_parse(f.data, f.len, f.media_type, &m, err))) {
		oci_err_prefix(err, "signature manifest %s", tag);
		goto out;
	}
	for (size_t i = 0; i < m.n_layers; i++) {
		const struct oci_desc *l = &m.layers[i];
		const char *sig = oci_desc_annotation(l, COSIGN_ANN_SIGNATURE);
		if (strcmp(l->media_type, COSIGN_MT_SIMPLESIGNING) != 0 || !sig)
			continue;
		char src[200], *data = NULL;
		size_t len = 0;
		snprintf(src, sizeof(src), "%s layer %zu", tag, i);
		if ((rc = oci_repo_get_blob(r, l, SIGNATURE_MAX_PAYLOAD, "signature payload", &data,
		                            &len, err)))
			goto out;
		size_t before = out->n;
		if ((rc = add_candidate(out, SIG_KIND_SIMPLE, data, len, sig, src)) ||
		    (out->n > before && (rc = keyless_annotations(&out->c[before], l))))
			goto out;
	}
out:
	oci_manifest_clear(&m);
	oci_fetched_clear(&f);
	return rc;
}

/* The bundle layers of one referrer manifest. */
static int collect_referrer(struct oci_repo *r, const char *image_digest, const char *digest,
                            const char *via, struct oci_sig_found *out, struct oci_err *err)
{
	struct oci_fetched f = {0};
	struct oci_manifest m = {0};
	int rc = oci_repo_get_manifest(r, digest, &f, err);
	if (rc)
		return rc;
	if (oci_detect_kind(f.data, f.len, f.media_type) != OCI_KIND_MANIFEST)
		goto out; /* not an artifact manifest: not ours */
	if ((rc = oci_manifest_parse(f.data, f.len, f.media_type, &m, err))) {
		oci_err_prefix(err, "referrer %s", digest);
		goto out;
	}
	bool is_bundle = (m.artifact_type && strcmp(m.artifact_type, SIGSTORE_MT_BUNDLE) == 0) ||
	                 strcmp(m.config.media_type, SIGSTORE_MT_BUNDLE) == 0;
	/* a referrer names its subject; one naming another image is ignored */
	if (!is_bundle || !m.subject || strcmp(m.subject->digest, image_digest) != 0)
		goto out;
	for (size_t i = 0; i < m.n_layers; i++) {
		const struct oci_desc *l = &m.layers[i];
		if (strcmp(l->media_type, SIGSTORE_MT_BUNDLE) != 0)
			continue;
		char src[240], *data = NULL;
		size_t len = 0;
		snprintf(src, sizeof(src), "bundle %.71s (%s) layer %zu", digest, via, i);
		if ((rc = oci_repo_get_blob(r, l, SIGNATURE_MAX_BUNDLE, "signature bundle", &data,
		                            &len, err)))
			goto out;
		if ((rc = add_candidate(out, SIG_KIND_BUNDLE, data, len, NULL, src)))
			goto out;
	}
out:
	oci_manifest_clear(&m);
	oci_fetched_clear(&f);
	return rc;
}

static int collect_bundles(struct oci_repo *r, const char *image_digest, struct oci_sig_found *out,
                           struct oci_err *err)
{
	struct oci_index ix = {0};
	struct oci_fetched f = {0};
	struct oci_err e = {{0}};
	const char *via = "referrers API";
	int rc = oci_repo_referrers(r, image_digest, SIGSTORE_MT_BUNDLE, &ix, &e);
	if (rc == 0) {
		out->referrers_api = true;
	} else if (rc == -EOPNOTSUPP) {
		char tag[160];
		oci_sig_tag(image_digest, "", tag, sizeof(tag));
		via = "fallback tag";
		rc = get_tagged(r, tag, &f, err);
		if (rc == -ENOENT)
			return 0;
		if (rc)
			return rc;
		if (oci_detect_kind(f.data, f.len, f.media_type) != OCI_KIND_INDEX) {
			oci_errf(err, "fallback tag %s is not an image index", tag);
			rc = -EBADMSG;
			goto out;
		}
		if ((rc = oci_index_parse(f.data, f.len, f.media_type, &ix, err))) {
			oci_err_prefix(err, "fallback index %s", tag);
			goto out;
		}
	} else {
		if (err)
			*err = e;
		return rc;
	}
	for (size_t i = 0; i < ix.n_manifests; i++) {
		const struct oci_desc *d = &ix.manifests[i];
		if (d->artifact_type && strcmp(d->artifact_type, SIGSTORE_MT_BUNDLE) != 0)
			continue;
		if ((rc = collect_referrer(r, image_digest, d->digest, via, out, err)))
			goto out;
	}
out:
	oci_fetched_clear(&f);
	oci_index_clear(&ix);
	return rc;
}

int oci_sig_collect(struct oci_repo *r, const char *image_digest, struct oci_sig_found *out,
                    struct oci_err *err)
{
	struct oci_sig_found f;
	memset(&f, 0, sizeof(f));
	int rc = collect_simple(r, image_digest, &f, err);
	if (rc == 0)
		rc = collect_bundles(r, image_digest, &f, err);
	if (rc) {
		oci_err_prefix(err, "looking for signatures of %s", image_digest);
		oci_sig_found_clear(&f);
		return rc;
	}
	*out = f;
	return 0;
}

/* A config for the .sig manifest listing the payload digests, as cosign writes. */
static char *sig_config(const struct oci_manifest *m)
{
	cJSON *c = cJSON_CreateObject();
	cJSON *rootfs = NULL, *ids = NULL;
	char *s = NULL;
	if (!c || !cJSON_AddStringToObject(c, "architecture", "") ||
	    !cJSON_AddStringToObject(c, "os", "") || !cJSON_AddObjectToObject(c, "config") ||
	    !(rootfs = cJSON_AddObjectToObject(c, "rootfs")) ||
	    !cJSON_AddStringToObject(rootfs, "type", "layers") ||
	    !(ids = cJSON_AddArrayToObject(rootfs, "diff_ids")))
		goto out;
	for (size_t i = 0; i < m->n_layers; i++)
		if (!cJSON_AddItemToArray(ids, cJSON_CreateString(m->layers[i].digest)))
			goto out;
	s = cJSON_PrintUnformatted(c);
out:
	cJSON_Delete(c);
	return s;
}

/* Store config + manifest m under tag. */
static int put_with_config(struct oci_repo *r, struct oci_manifest *m, const char *config,
                           const char *config_mt, const char *tag, char digest_out[OCI_DIGEST_MAX],
                           bool *subject_ack, struct oci_err *err)
{
	char *mj = NULL;
	size_t mlen = 0;
	int rc = oci_repo_put_blob_mem(r, config, strlen(config), err);
	if (rc)
		return rc;
	oci_desc_clear(&m->config);
	if ((rc = oci_desc_for_bytes(config_mt, config, strlen(config), &m->config)) ||
	    (rc = oci_manifest_build(m, &mj, &mlen)))
		return rc;
	rc = oci_repo_put_manifest(r, tag, m->media_type, mj, mlen, m->artifact_type, digest_out,
	                           subject_ack, err);
	free(mj);
	return rc;
}

/* Append a layer descriptor for data (already stored) to m. */
static int append_layer(struct oci_manifest *m, const char *mt, const char *data, size_t len,
                        const char *ann_key, const char *ann_value)
{
	struct oci_desc *grown = realloc(m->layers, (m->n_layers + 1) * sizeof(*grown));
	if (!grown)
		return -ENOMEM;
	m->layers = grown;
	struct oci_desc *d = &m->layers[m->n_layers];
	memset(d, 0, sizeof(*d));
	int rc = oci_desc_for_bytes(mt, data, len, d);
	if (rc)
		return rc;
	m->n_layers++;
	if (ann_key && (!(d->annotations = cJSON_CreateObject()) ||
	                !cJSON_AddStringToObject(d->annotations, ann_key, ann_value)))
		return -ENOMEM;
	return 0;
}

int oci_sig_push_simple(struct oci_repo *r, const char *image_digest, const char *payload,
                        size_t len, const char *signature_b64, struct oci_err *err)
{
	char tag[160];
	struct oci_fetched f = {0};
	struct oci_manifest m = {0};
	char *config = NULL;
	oci_sig_tag(image_digest, ".sig", tag, sizeof(tag));
	int rc = get_tagged(r, tag, &f, err);
	if (rc == 0) {
		if ((rc = oci_manifest_parse(f.data, f.len, f.media_type, &m, err))) {
			oci_err_prefix(err, "existing signature manifest %s", tag);
			goto out;
		}
		/* the same signature again changes nothing */
		for (size_t i = 0; i < m.n_layers; i++) {
			const char *s = oci_desc_annotation(&m.layers[i], COSIGN_ANN_SIGNATURE);
			if (s && strcmp(s, signature_b64) == 0)
				goto out;
		}
	} else if (rc == -ENOENT) {
		rc = -ENOMEM;
		if (!(m.media_type = strdup(OCI_MT_MANIFEST)))
			goto out;
	} else {
		goto out;
	}
	if ((rc = oci_repo_put_blob_mem(r, payload, len, err)) ||
	    (rc = append_layer(&m, COSIGN_MT_SIMPLESIGNING, payload, len, COSIGN_ANN_SIGNATURE,
	                       signature_b64)))
		goto out;
	rc = -ENOMEM;
	if (!(config = sig_config(&m)))
		goto out;
	rc = put_with_config(r, &m, config, OCI_MT_CONFIG, tag, NULL, NULL, err);
out:
	free(config);
	oci_manifest_clear(&m);
	oci_fetched_clear(&f);
	return rc;
}

/* Add desc to the fallback index tagged sha256-<hex> (creating it). */
static int update_fallback(struct oci_repo *r, const char *subject_digest,
                           const struct oci_desc *desc, struct oci_err *err)
{
	char tag[160];
	struct oci_fetched f = {0};
	struct oci_index ix = {0};
	char *out = NULL;
	size_t olen = 0;
	oci_sig_tag(subject_digest, "", tag, sizeof(tag));
	int rc = get_tagged(r, tag, &f, err);
	if (rc == 0) {
		if ((rc = oci_index_parse(f.data, f.len, f.media_type, &ix, err))) {
			oci_err_prefix(err, "existing fallback tag %s", tag);
			goto out;
		}
		for (size_t i = 0; i < ix.n_manifests; i++)
			if (strcmp(ix.manifests[i].digest, desc->digest) == 0)
				goto out; /* already listed */
	} else if (rc != -ENOENT) {
		goto out;
	}
	rc = -ENOMEM;
	struct oci_desc *grown = realloc(ix.manifests, (ix.n_manifests + 1) * sizeof(*grown));
	if (!grown)
		goto out;
	ix.manifests = grown;
	if ((rc = oci_desc_copy(desc, &ix.manifests[ix.n_manifests])))
		goto out;
	ix.n_manifests++;
	free(ix.media_type);
	rc = -ENOMEM;
	if (!(ix.media_type = strdup(OCI_MT_INDEX)))
		goto out;
	if ((rc = oci_index_build(&ix, &out, &olen)))
		goto out;
	rc = oci_repo_put_manifest(r, tag, OCI_MT_INDEX, out, olen, NULL, NULL, NULL, err);
out:
	free(out);
	oci_index_clear(&ix);
	oci_fetched_clear(&f);
	return rc;
}

int oci_sig_push_bundle(struct oci_repo *r, const struct oci_desc *image, const char *bundle,
                        size_t len, bool *indexed, struct oci_err *err)
{
	struct oci_manifest m = {0};
	struct oci_desc self = {0};
	char dg[OCI_DIGEST_MAX], created[32];
	bool ack = false;
	int rc = -ENOMEM;
	rfc3339_now(created, sizeof(created));
	if (!(m.media_type = strdup(OCI_MT_MANIFEST)) ||
	    !(m.artifact_type = strdup(SIGSTORE_MT_BUNDLE)) ||
	    !(m.subject = calloc(1, sizeof(*m.subject))))
		goto out;
	memcpy(m.subject->digest, image->digest, sizeof(m.subject->digest));
	m.subject->size = image->size;
	if (!(m.subject->media_type = strdup(image->media_type)))
		goto out;
	if (!(m.annotations = cJSON_CreateObject()) ||
	    !cJSON_AddStringToObject(m.annotations, "dev.sigstore.bundle.content",
	                             "dsse-envelope") ||
	    !cJSON_AddStringToObject(m.annotations, "dev.sigstore.bundle.predicateType",
	                             "https://sigstore.dev/cosign/sign/v1") ||
	    !cJSON_AddStringToObject(m.annotations, OCI_ANN_CREATED, created))
		goto out;
	if ((rc = oci_repo_put_blob_mem(r, bundle, len, err)) ||
	    (rc = append_layer(&m, SIGSTORE_MT_BUNDLE, bundle, len, NULL, NULL)))
		goto out;
	if ((rc = put_with_config(r, &m, OCI_EMPTY_JSON, OCI_MT_EMPTY, NULL, dg, &ack, err)))
		goto out;
	if (indexed)
		*indexed = ack;
	if (ack)
		goto out;
	/* describe the referrer for the fallback index */
	char *mj = NULL;
	size_t mlen = 0;
	if ((rc = oci_manifest_build(&m, &mj, &mlen)))
		goto out;
	rc = oci_desc_for_bytes(OCI_MT_MANIFEST, mj, mlen, &self);
	free(mj);
	if (rc)
		goto out;
	rc = -ENOMEM;
	if (!(self.artifact_type = strdup(SIGSTORE_MT_BUNDLE)) ||
	    !(self.annotations = cJSON_Duplicate(m.annotations, 1)))
		goto out;
	rc = update_fallback(r, image->digest, &self, err);
out:
	oci_desc_clear(&self);
	oci_manifest_clear(&m);
	return rc;
}
