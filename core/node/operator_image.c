/* The digest a cache's image stands for (resolved by the operator when
 * asked) and the operator's own signature check of it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "cache_view.h"
#include "log.h"
#include "oci_pull.h"
#include "oci_repo.h"
#include "operator_impl.h"
#include "pull_secret.h"
#include "trust.h"
#include "workers.h"

/* ---- digests ---- */

/* What a registry job of a cache (a resolution, a signature check) carries. */
struct image_job {
	struct operator_ *op;
	char key[320], image[600], err[512];
	struct oci_ref ref;             /* image, parsed (a copy of the cache's) */
	int rc;                         /* preset when image does not parse: err says why */
	struct pull_secret_ref secrets; /* the cache's: its registry is read with them */
};

/* Fill j for a job of c; false when out of memory. */
static bool image_job_init(struct image_job *j, struct operator_ *op, const struct ocache *c)
{
	if (!c->ref_rc && oci_ref_copy(&c->ref, &j->ref) != 0)
		return false;
	j->op = op;
	snprintf(j->key, sizeof(j->key), "%s", c->key);
	snprintf(j->image, sizeof(j->image), "%s", c->image);
	j->rc = c->ref_rc;
	snprintf(j->err, sizeof(j->err), "%s", c->ref_err);
	pull_secret_ref_of(c->obj, NULL, op->o.global_credentials, &j->secrets);
	return true;
}

struct resolve_job {
	struct image_job job;
	char digest[144];
};

/* Open the repository of a registry job of a cache, with the credentials
 * of the pull Secrets the cache names (else the operator's). */
static int open_repo(const struct image_job *j, struct oci_repo **repo, struct oci_err *e)
{
	struct operator_ *op = j->op;
	const struct pull_secret_ref *secrets = &j->secrets;
	const struct oci_ref *ref = &j->ref;
	struct pull_secret ps;
	struct oci_registry_opts opts;
	char err[512];
	int rc =
	    pull_secret_opts(op->os, secrets, ref->kind == OCI_REF_REGISTRY ? ref->registry : NULL,
	                     op->o.registry, &ps, &opts, err, sizeof(err));
	if (rc)
		oci_errf(e, "%s", err);
	else
		rc = oci_repo_open(ref, &opts, false, repo, e);
	pull_secret_clear(&ps);
	return rc;
}

static void resolve_work(void *ud)
{
	struct resolve_job *j = ud;
	struct oci_repo *repo = NULL;
	struct oci_desc d;
	struct oci_err e;
	memset(&d, 0, sizeof(d));
	memset(&e, 0, sizeof(e));
	if (j->job.rc) /* spec.image does not parse: j->job.err says why */
		return;
	j->job.rc = open_repo(&j->job, &repo, &e);
	if (!j->job.rc)
		j->job.rc = oci_repo_resolve(repo, oci_ref_reference(&j->job.ref), &d, &e);
	if (j->job.rc)
		snprintf(j->job.err, sizeof(j->job.err), "%s", oci_err_str(&e, j->job.rc));
	else
		snprintf(j->digest, sizeof(j->digest), "%s", d.digest);
	oci_desc_clear(&d);
	oci_repo_free(repo);
}

static void resolve_done(struct loop *l, void *ud)
{
	struct resolve_job *j = ud;
	(void)l;
	struct ocache *c = operator_find_cache(j->job.op, j->job.key, false);
	if (c && !j->job.op->stopping) {
		c->resolving = false;
		snprintf(c->resolved_for, sizeof(c->resolved_for), "%s", j->job.image);
		snprintf(c->resolved, sizeof(c->resolved), "%s", j->job.rc ? "" : j->digest);
		snprintf(c->resolve_error, sizeof(c->resolve_error), "%s",
		         j->job.rc ? j->job.err : "");
		if (j->job.rc) {
			operator_count_error("resolve");
			log_warn("cannot resolve the image digest", "cache", j->job.key, "image",
			         j->job.image, "error", j->job.err);
		}
		operator_mark(j->job.op, j->job.key);
		operator_forget_if_gone(j->job.op, c);
	}
	oci_ref_clear(&j->job.ref);
	free(j);
}

static void start_resolve(struct operator_ *op, struct ocache *c)
{
	struct resolve_job *j = calloc(1, sizeof(*j));
	if (!j || !image_job_init(&j->job, op, c)) {
		free(j);
		return;
	}
	c->resolving = true;
	if (workers_submit(op->workers, resolve_work, resolve_done, j) != 0) {
		c->resolving = false;
		oci_ref_clear(&j->job.ref);
		free(j);
	}
}

/* The digest status.resolvedDigest holds for image, or "": a digest is kept
 * with the image it was resolved from (status.resolvedImage); one recorded
 * before that field existed counts when the status was written for this
 * generation of the spec. */
static const char *recorded_digest(const struct ocache *c, const char *image)
{
	const char *d = obj_str(c->obj, "status.resolvedDigest");
	if (!cache_view_valid_digest(d))
		return "";
	const char *from = obj_str(c->obj, "status.resolvedImage");
	if (*from)
		return strcmp(from, image) ? "" : d;
	const cJSON *gen = cJSON_GetObjectItemCaseSensitive(
	                cJSON_GetObjectItemCaseSensitive(c->obj, "metadata"), "generation"),
	            *cond;
	cJSON_ArrayForEach(cond,
	                   cJSON_GetObjectItemCaseSensitive(
	                       cJSON_GetObjectItemCaseSensitive(c->obj, "status"), "conditions"))
	{
		const cJSON *og = cJSON_GetObjectItemCaseSensitive(cond, "observedGeneration");
		if (!strcmp(obj_str(cond, "type"), "Ready") && cJSON_IsNumber(og) &&
		    cJSON_IsNumber(gen) && og->valuedouble == gen->valuedouble)
			return d;
	}
	return "";
}

/* The digest for c: the webhook's annotation; the digest spec.image names;
 * the operator's own resolution (--resolve-digests; started here when
 * needed); else the digest the status records for this image, so that an
 * operator started without --resolve-digests (the webhook turned on after
 * the caches were made) keeps their digests. "" when there is none. */
const char *operator_digest_for(struct operator_ *op, struct ocache *c)
{
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(c->obj, "metadata"), "annotations");
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(ann, "gkm.io/resolvedDigest");
	if (cJSON_IsString(d))
		return d->valuestring;
	const char *image = c->image;
	if (!c->ref_rc && c->ref.digest && cache_view_valid_digest(c->ref.digest))
		return c->ref.digest;
	if (op->o.resolve_digests && !strcmp(c->resolved_for, image) && *c->resolved)
		return c->resolved;
	if (op->o.resolve_digests && strcmp(c->resolved_for, image) != 0 && !c->resolving)
		start_resolve(op, c);
	/* while a resolution runs, or after it failed: what was resolved before */
	return recorded_digest(c, image);
}

/* ---- signatures ---- */

struct verify_job {
	struct image_job job;
	char digest[144];
	struct sig_verdict v;
	struct trust *trust; /* referenced */
};

static void verify_work(void *ud)
{
	struct verify_job *j = ud;
	struct oci_repo *repo = NULL;
	struct oci_err e;
	memset(&e, 0, sizeof(e));
	memset(&j->v, 0, sizeof(j->v));
	if (j->job.rc) /* spec.image does not parse: j->job.err says why */
		return;
	j->job.rc = open_repo(&j->job, &repo, &e);
	if (!j->job.rc)
		j->job.rc = oci_pull_verify(repo, j->digest, j->trust->keys, &j->v, &e);
	if (j->job.rc)
		snprintf(j->job.err, sizeof(j->job.err), "%s", oci_err_str(&e, j->job.rc));
	oci_repo_free(repo);
}

static void verify_done(struct loop *l, void *ud)
{
	struct verify_job *j = ud;
	struct operator_ *op = j->job.op;
	(void)l;
	struct ocache *c = operator_find_cache(op, j->job.key, false);
	if (c && !op->stopping) {
		c->verifying = false;
		/* a result for an image or digest the cache no longer names, or
		 * under keys no longer trusted, is dropped */
		if (!strcmp(c->verified_image, j->job.image) &&
		    !strcmp(c->verified_digest, j->digest) && j->trust == op->o.trust) {
			switch (j->job.rc) {
			case 0:
				c->verdict = VERDICT_VERIFIED;
				break;
			case -ENODATA:
				c->verdict = VERDICT_UNSIGNED;
				break;
			case -EKEYREJECTED:
			case -ENOKEY:
				c->verdict = VERDICT_UNTRUSTED;
				break;
			default: /* the registry: try again later */
				c->verdict = VERDICT_ERROR;
				c->verify_not_before =
				    loop_now_ms() + backoff_ms(c->verify_failures++, 1000,
				                               REFUSED_BACKOFF_MAX_MS, &op->seed);
				operator_count_error("verify");
			}
			if (c->verdict != VERDICT_ERROR)
				c->verify_failures = 0;
			snprintf(c->verdict_msg, sizeof(c->verdict_msg), "%s",
			         j->job.rc ? j->job.err : j->v.reason);
			if (j->job.rc)
				log_warn("signature not verified", "cache", j->job.key, "image",
				         j->job.image, "digest", j->digest, "error", j->job.err);
			else
				log_info("signature verified", "cache", j->job.key, "digest",
				         j->digest, "by", j->v.reason);
		}
		operator_mark(op, j->job.key);
		operator_forget_if_gone(op, c);
	}
	trust_unref(j->trust);
	oci_ref_clear(&j->job.ref);
	free(j);
}

static const char *verdict_name(enum verdict v)
{
	static const char *const names[] = {"pending", "verified", "unsigned", "untrusted",
	                                    "error"};
	return names[v];
}

static void start_verify(struct operator_ *op, struct ocache *c, const char *digest)
{
	struct verify_job *j = calloc(1, sizeof(*j));
	if (!j || !image_job_init(&j->job, op, c)) {
		free(j);
		return;
	}
	snprintf(j->digest, sizeof(j->digest), "%s", digest);
	j->trust = trust_ref(op->o.trust);
	c->verifying = true;
	if (workers_submit(op->workers, verify_work, verify_done, j) != 0) {
		c->verifying = false;
		trust_unref(j->trust);
		oci_ref_clear(&j->job.ref);
		free(j);
	}
}

/* With trusted keys: the operator's verdict on c's signature at digest, read
 * through c's own image reference (its repository's signatures; nothing
 * another cache or an annotation says). A check starts here when there is
 * no verdict for this image and digest; NULL without keys. */
cJSON *operator_verification_of(struct operator_ *op, struct ocache *c, const char *digest)
{
	if (!op->o.trust || op->o.trust->nkeys == 0 || !cache_view_valid_digest(digest))
		return NULL;
	const char *image = c->image;
	if (strcmp(c->verified_image, image) || strcmp(c->verified_digest, digest)) {
		snprintf(c->verified_image, sizeof(c->verified_image), "%s", image);
		snprintf(c->verified_digest, sizeof(c->verified_digest), "%s", digest);
		c->verdict = VERDICT_NONE;
		c->verdict_msg[0] = '\0';
		c->verify_failures = 0;
		c->verify_not_before = 0;
	}
	bool again = c->verdict == VERDICT_NONE ||
	             (c->verdict == VERDICT_ERROR && loop_now_ms() >= c->verify_not_before);
	if (again && !c->verifying)
		start_verify(op, c, digest);
	cJSON *v = cJSON_CreateObject();
	cJSON_AddStringToObject(v, "state", verdict_name(c->verdict));
	cJSON_AddStringToObject(v, "digest", digest);
	cJSON_AddStringToObject(v, "message", c->verdict_msg);
	return v;
}
