#include "oci_pull.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "oci_mirrors.h"
#include "oci_sig.h"

int oci_pull_verify(struct oci_repo *repo, const char *image_digest, const struct sig_keyset *keys,
                    struct sig_verdict *verdict, struct oci_err *err)
{
	struct oci_sig_found found;
	memset(&found, 0, sizeof(found));
	int rc = oci_sig_collect(repo, image_digest, &found, err);
	if (rc == 0) {
		rc = sig_verify(keys, image_digest, found.c, found.n, verdict);
		if (rc == -ENODATA)
			oci_errf(err, "image %s is not signed", image_digest);
		else if (rc)
			oci_errf(err, "no signature of %s verifies with a trusted key: %s",
			         image_digest, verdict->reason);
	}
	oci_sig_found_clear(&found);
	return rc;
}

/* One layer: this thread downloads and hashes, the extractor's threads
 * inflate (one) and write files (another): three stages that overlap on a
 * node with the cores for them.
 * The extractor only sees end-of-stream once the digest has verified. */
static int extract_one(struct extract *x, struct oci_blob_reader *r, const char *what,
                       struct oci_err *e)
{
	enum { BUF = 1 << 17 };
	struct extract_push *p = NULL;
	char *buf = malloc(BUF);
	int rc = buf ? extract_push_begin(x, &p) : -ENOMEM;
	if (rc) {
		free(buf);
		oci_errf(e, "%s: cannot start extraction: %s", what, strerror(-rc));
		return rc;
	}
	ssize_t n;
	int wrc = 0;
	while ((n = oci_blob_read(r, buf, BUF)) > 0)
		if ((wrc = extract_push_write(p, buf, (size_t)n)))
			break;
	free(buf);
	rc = extract_push_end(p, n == 0 && wrc == 0);
	if (rc == 0 && n < 0)
		rc = (int)n;
	if (rc) {
		/* A tampered blob usually breaks the decompressor or the tar
		 * parser before its end: read the rest, and when the digest does
		 * not match, that is the problem to report. */
		char xe[512];
		snprintf(xe, sizeof(xe), "%s", extract_error(x));
		int brc = n < 0 ? (int)n : oci_blob_drain(r);
		oci_errf(e, "%s: %s", what, brc < 0 ? oci_blob_error(r) : xe);
		if (brc < 0)
			rc = brc;
	}
	return rc;
}

int oci_pull_extract(struct oci_repo *repo, const struct oci_image *img, struct extract *x,
                     struct oci_err *err)
{
	for (size_t i = 0; i < img->manifest.n_layers; i++) {
		const struct oci_desc *l = &img->manifest.layers[i];
		if (oci_layer_compression(l->media_type) == OCI_COMP_UNKNOWN) {
			oci_errf(err,
			         "layer %zu has media type '%s', which is not a tar layer gkm can "
			         "extract",
			         i, l->media_type);
			return -EPROTONOSUPPORT;
		}
		struct oci_blob_reader *r = NULL;
		char what[32];
		snprintf(what, sizeof(what), "layer %zu", i);
		int rc = oci_repo_blob_open(repo, l, what, &r, err);
		if (rc)
			return rc;
		rc = extract_one(x, r, what, err);
		oci_blob_close(r);
		if (rc)
			return rc;
	}
	return 0;
}

int oci_pull_into_store(struct store *st, struct oci_repo *repo, const struct oci_image *img,
                        const struct extract_limits *limits, struct store_entry_info *info,
                        bool *present, struct oci_err *err)
{
	const char *digest = img->desc.digest;
	struct store_txn *txn = NULL;
	char errbuf[512] = "";
	int rc;
	*present = false;
	bool begun = false;
	/* a mirror's layer that proved wrong is passed over: once more, from the
	 * next source (the origin at the latest) */
	for (int tries = 0;; tries++) {
		if ((rc = store_begin(st, digest, limits, 0, &txn))) {
			begun = false;
			break;
		}
		begun = true;
		if ((rc = oci_pull_extract(repo, img, store_txn_extract(txn), err)) == 0)
			break;
		store_abort(txn);
		if (rc != -ESTALE || tries >= OCI_MIRRORS_MAX)
			break;
		log_warn("pull retried from the next source", "digest", digest, "error",
		         oci_err_str(err, rc));
	}
	if (rc == -EEXIST) { /* another pull finished it while we waited */
		*present = true;
		if ((rc = store_lookup(st, digest, info)))
			oci_errf(err, "store entry %s: %s", digest, strerror(-rc));
		return rc;
	}
	if (rc) {
		if (!begun)
			oci_errf(err, "store: %s", strerror(-rc));
		return rc;
	}
	if ((rc = store_commit(txn, info, errbuf, sizeof(errbuf))))
		oci_errf(err, "%s", errbuf[0] ? errbuf : strerror(-rc));
	return rc;
}

int oci_pull_to_store(struct store *st, const struct oci_ref *ref, const struct oci_pull_opts *o,
                      struct oci_image *img_out, char *digest_out, struct store_entry_info *info,
                      bool *already_present, struct oci_err *err)
{
	struct oci_repo *repo = NULL;
	struct oci_image img;
	struct sig_verdict verdict;
	bool present = false;
	int rc;
	memset(&img, 0, sizeof(img));
	if ((rc = o->client ? oci_repo_open_on(ref, o->client, &repo, err)
	                    : oci_repo_open(ref, o->registry, false, &repo, err)))
		goto out;
	if ((rc = oci_repo_fetch_image(repo, oci_ref_reference(ref), o->platform, &img, err)))
		goto out;
	if (o->require_signature && (!o->keys || sig_keyset_count(o->keys) == 0)) {
		oci_errf(err, "signature verification is on, but no trusted key is configured "
		              "(--trust-dir, --key): nothing can be verified, so nothing is used");
		rc = -ENOKEY;
		goto out;
	}
	if (o->keys && sig_keyset_count(o->keys) > 0) {
		if ((rc = oci_pull_verify(repo, img.top_digest, o->keys, &verdict, err)))
			goto out;
		log_info("signature verified", "digest", img.top_digest, "by", verdict.reason);
		if (o->verdict)
			*o->verdict = verdict;
	}
	const char *digest = img.desc.digest;
	if (store_lookup(st, digest, info) == 0) {
		/* another reference brought these bytes: this one must serve every
		 * layer too (its manifest and config it served already), or a
		 * source that proved only a manifest would get the content */
		for (size_t i = 0; i < img.manifest.n_layers && rc == 0; i++) {
			if ((rc = oci_repo_blob_readable(repo, &img.manifest.layers[i], err))) {
				char *name = oci_ref_format(ref);
				oci_err_prefix(err, "%s does not serve layer %zu", name ? name : "",
				               i);
				free(name);
			}
		}
		present = true;
		goto done;
	}
	if (o->before_layers && (rc = o->before_layers(&img, o->before_layers_ud, err)))
		goto out;
	rc = oci_pull_into_store(st, repo, &img, o->limits, info, &present, err);
done:
	if (rc)
		goto out;
	if (digest_out)
		snprintf(digest_out, OCI_DIGEST_MAX, "%s", digest);
	if (already_present)
		*already_present = present;
	if (img_out) {
		*img_out = img;
		memset(&img, 0, sizeof(img));
	}
out:
	oci_image_clear(&img);
	oci_repo_free(repo);
	return rc;
}
