#include "image_check.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "errbuf.h"
#include "oci_repo.h"
#include "oci_sig.h"

const char *image_sig_kind_name(enum sig_kind k)
{
	return k == SIG_KIND_BUNDLE ? "bundle" : "simple";
}

bool image_verdict_accepted(const struct image_verdict *v)
{
	for (size_t i = 0; i < v->n; i++)
		if (v->sig[i].verified)
			return true;
	return false;
}

static int failed(struct image_check_result *out, int rc, const char *what, const char *detail)
{
	out->error = rc == -ENOENT ? IMAGE_CHECK_NOT_FOUND : IMAGE_CHECK_UNAVAILABLE;
	snprintf(out->message, sizeof(out->message), "%s: %s", what, detail);
	return rc;
}

/* Verify every candidate on its own, so the policy sees each signature's
 * kind and outcome (it may accept some kinds and not others). Verified
 * signatures are kept first when there are more than fit. */
static void verify_each(const struct sig_keyset *ks, const char *digest,
                        const struct oci_sig_found *f, struct image_verdict *v)
{
	struct image_sig rejected[IMAGE_CHECK_MAX_SIGS];
	size_t nrej = 0;
	v->found = f->n;
	for (size_t i = 0; i < f->n; i++) {
		const struct sig_candidate *c = &f->c[i];
		struct image_sig s = {.kind = c->kind};
		struct sig_verdict one;
		int rc = sig_verify_one(ks, digest, c, &one);
		if (rc == 0) {
			s.verified = true;
			snprintf(s.key, sizeof(s.key), "%s", one.key_fingerprint);
			snprintf(s.identity, sizeof(s.identity), "%s", one.identity);
			snprintf(s.issuer, sizeof(s.issuer), "%s", one.issuer);
			snprintf(s.rule, sizeof(s.rule), "%s", one.rule);
			if (v->n < IMAGE_CHECK_MAX_SIGS)
				v->sig[v->n++] = s;
			continue;
		}
		errbuf_set(s.reason, sizeof(s.reason), "%s%s%s", c->source ? c->source : "",
		           c->source ? ": " : "", one.reason[0] ? one.reason : "does not verify");
		if (nrej < IMAGE_CHECK_MAX_SIGS)
			rejected[nrej++] = s;
	}
	for (size_t i = 0; i < nrej && v->n < IMAGE_CHECK_MAX_SIGS; i++)
		v->sig[v->n++] = rejected[i];
}

/* The trees and the identity the image's config labels declare
 * (core/cache/cache_env.h). */
static void read_trees(struct oci_repo *repo, struct image_check_result *out)
{
	struct oci_image img;
	struct oci_err e = {{0}};
	memset(&img, 0, sizeof(img));
	if (oci_repo_fetch_image(repo, out->digest, NULL, &img, &e) == 0) {
		const cJSON *labels = oci_config_labels(&img.config);
		const char *id = cache_env_identity(labels);
		out->verdict.ntrees =
		    cache_env_trees(labels, out->verdict.trees, CACHE_ENV_TREES_MAX);
		if (id && strlen(id) < sizeof(out->verdict.identity))
			memcpy(out->verdict.identity, id, strlen(id) + 1);
		out->verdict.trees_known = true;
	}
	oci_image_clear(&img);
}

int image_check_run(const struct oci_ref *ref, const char *digest, const struct sig_keyset *ks,
                    const struct oci_registry_opts *opts, struct image_check_result *out)
{
	struct oci_repo *repo = NULL;
	struct oci_err e = {{0}};
	struct oci_sig_found found;
	int rc;
	memset(out, 0, sizeof(*out));
	memset(&found, 0, sizeof(found));
	if (ref->kind != OCI_REF_REGISTRY)
		return failed(out, -EINVAL, "image", "not a registry reference");
	if (!digest)
		digest = ref->digest;
	if ((rc = oci_repo_open(ref, opts, false, &repo, &e)) != 0)
		return failed(out, rc, "registry", oci_err_str(&e, rc));
	/* by tag: what it names now; by digest: that the image exists */
	struct oci_desc d = {0};
	const char *want = digest ? digest : ref->tag ? ref->tag : OCI_REF_DEFAULT_TAG;
	if ((rc = oci_repo_resolve(repo, want, &d, &e)) != 0) {
		failed(out, rc, rc == -ENOENT ? "not found" : "asking the registry",
		       oci_err_str(&e, rc));
		goto out;
	}
	snprintf(out->digest, sizeof(out->digest), "%s", digest ? digest : d.digest);
	out->resolved = !digest;
	oci_desc_clear(&d);
	read_trees(repo, out);
	if (ks) {
		if ((rc = oci_sig_collect(repo, out->digest, &found, &e)) != 0) {
			failed(out, rc == -ENOENT ? -EIO : rc, "signatures", oci_err_str(&e, rc));
			rc = rc == -ENOENT ? -EIO : rc;
			goto out;
		}
		verify_each(ks, out->digest, &found, &out->verdict);
		out->verified = true;
	}
	rc = 0;
out:
	oci_sig_found_clear(&found);
	oci_repo_free(repo);
	return rc;
}
