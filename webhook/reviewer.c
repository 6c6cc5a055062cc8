#include "reviewer.h"

#include "review.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admission_review.h"
#include "image_check.h"
#include "pull_secret.h"
#include "log.h"
#include "metrics.h"
#include "oci_ref.h"
#include "ttl_cache.h"

/* Loop thread: the image of a GKMCache review is checked; ask the policy
 * and answer. */
static void decide(struct review *rv)
{
	const struct check *c = &rv->checks[0];
	const char *digest = c->digest;
	char reason[80], message[1024];
	if (c->fail_reason) {
		review_deny(rv, c->fail_reason, "%s", c->message);
		return;
	}
	if (!review_admission_policy(rv, c, rv->req.name, rv->req.annotations, reason,
	                             sizeof(reason), message, sizeof(message))) {
		review_deny(rv, reason, "%s", message);
		return;
	}
	const char *have = rv->req.digest_annotation;
	/* /validate: the annotation must be what the webhook resolved. /mutate
	 * on UPDATE: a recorded digest changed by hand is refused at once (it
	 * would otherwise be put back silently); on CREATE a hand-set value is
	 * replaced, with a warning. */
	if (rv->ep == EP_VALIDATE && !have) {
		review_deny(rv, "ResolvedDigestMissing",
		            "annotation " ADMISSION_ANNOTATION_DIGEST " is missing; the mutating "
		            "webhook sets it (to %s for image %s)",
		            digest, rv->req.image);
		return;
	}
	if (have && strcmp(have, digest) != 0 && (rv->ep == EP_VALIDATE || c->pinned[0])) {
		review_deny(rv, "ResolvedDigestMismatch",
		            "annotation " ADMISSION_ANNOTATION_DIGEST " is written by the "
		            "admission webhook and may not be set by hand: for image %s it must be "
		            "%s, not %.100s%s",
		            rv->req.image, digest, have,
		            c->pinned[0] ? " (the digest stays as recorded while spec.image is "
		                           "unchanged; change spec.image to move it)"
		                         : "");
		return;
	}
	if (rv->ep == EP_VALIDATE) {
		struct admission_response ok = {.uid = rv->req.uid, .allowed = true};
		review_finish(rv, &ok);
		return;
	}
	char *patch = NULL;
	char warning[600] = "";
	/* the trees its image declares, for the pods that mount the cache
	 * (pod_review.c); left as they are when the config could not be read */
	char env[CACHE_ENV_TEXT_MAX];
	cache_env_format(c->verdict.trees, c->verdict.ntrees, env, sizeof(env));
	const struct admission_annotation a[] = {
	    {ADMISSION_ANNOTATION_DIGEST, digest},
	    {CACHE_ENV_ANNOTATION, env},
	    {CACHE_ENV_IDENTITY_ANNOTATION, c->verdict.identity}};
	if (admission_patch_annotations(&rv->req, a, c->verdict.trees_known ? 3 : 1, &patch) != 0) {
		review_deny(rv, "WebhookError", "out of memory building the patch");
		return;
	}
	char subject[OCI_REF_MAX + 16];
	snprintf(subject, sizeof(subject), "image %s", rv->req.image);
	review_image_warning(c, subject, warning, sizeof(warning));
	if (!warning[0] && have && strcmp(have, digest) != 0)
		snprintf(warning, sizeof(warning),
		         "annotation " ADMISSION_ANNOTATION_DIGEST " is written by the admission "
		         "webhook: %.100s was replaced by %s",
		         have, digest);
	struct admission_response ok = {
	    .uid = rv->req.uid, .allowed = true, .patch = patch, .warning = warning};
	review_finish(rv, &ok);
	free(patch);
}

/* Loop thread: a parsed review arrives. */
static void review_start(struct loop *l, void *ud)
{
	struct review *rv = ud;
	rv->trust = trust_ref(rv->r->trust);
	if (rv->ep == EP_PODS) {
		rv->decide = pod_review_decide;
		pod_review_start(rv);
	} else {
		rv->decide = decide;
		review_run_checks(rv);
	}
}

/* ---- the HTTPS side ---- */

static void answer_now(struct reviewer *r, struct https_request *rq, enum endpoint ep,
                       const char *uid, const char *reason, const char *message)
{
	struct admission_response resp = {
	    .uid = uid, .allowed = reason == NULL, .reason = reason, .message = message};
	review_send(r, rq, ep, &resp);
	if (reason)
		log_info("review denied", "endpoint", review_endpoint_names[ep], "uid", uid,
		         "reason", reason, "message", message);
}

/* A GKMCache review's one check: its spec.image. 0, or a denial to answer. */
static int prepare_cache_review(struct review *rv, const char **reason, char *err, size_t errlen)
{
	struct oci_err oerr = {{0}};
	struct check *c;
	if (admission_request_check(&rv->req, err, errlen) != 0) {
		*reason = "InvalidObject";
		return -EINVAL;
	}
	if (!(rv->checks = calloc(1, sizeof(*rv->checks)))) {
		*reason = "WebhookError";
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rv->nchecks = 1;
	c = &rv->checks[0];
	c->rv = rv;
	c->image = rv->req.image;
	c->global = pull_secret_global(rv->r->o.global_credentials, rv->req.namespace_);
	if (oci_ref_parse(rv->req.image, &c->ref, &oerr) != 0) {
		*reason = "InvalidImageReference";
		snprintf(err, errlen, "spec.image: %s", oci_err_str(&oerr, -EINVAL));
		return -EINVAL;
	}
	if (c->ref.kind != OCI_REF_REGISTRY) {
		*reason = "InvalidImageReference";
		snprintf(err, errlen,
		         "spec.image '%.200s' names a layout directory on one machine; a cluster "
		         "pulls from a registry (host/repository:tag or @sha256:...)",
		         rv->req.image);
		return -EINVAL;
	}
	if (!(c->ref_text = oci_ref_format(&c->ref))) {
		*reason = "WebhookError";
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* On UPDATE with the same image, the digest recorded at creation stays. */
	const char *old = rv->req.old_digest_annotation;
	if (rv->req.op == ADMISSION_UPDATE && rv->req.old_image && !c->ref.digest &&
	    strcmp(rv->req.old_image, rv->req.image) == 0 && old && oci_digest_valid(old))
		snprintf(c->pinned, sizeof(c->pinned), "%s", old);
	return 0;
}

void reviewer_handle(struct https_request *rq, const char *path, const char *body, size_t len,
                     void *ud)
{
	struct reviewer *r = ud;
	struct review *rv = NULL;
	char err[600];
	const char *reason = NULL;
	enum endpoint ep;
	if (strcmp(path, "/mutate") == 0)
		ep = EP_MUTATE;
	else if (strcmp(path, "/validate") == 0)
		ep = EP_VALIDATE;
	else if (strcmp(path, "/mutate-pods") == 0 && r->o.catalog)
		ep = EP_PODS;
	else {
		review_send_text(rq, 404,
		                 r->o.catalog
		                     ? "not found: POST AdmissionReviews to /mutate, /validate or "
		                       "/mutate-pods\n"
		                     : "not found: POST AdmissionReviews to /mutate or /validate "
		                       "(/mutate-pods needs --pod-placement)\n");
		return;
	}
	if (!(rv = calloc(1, sizeof(*rv)))) {
		review_send_text(rq, 500, "out of memory\n");
		return;
	}
	rv->r = r;
	rv->rq = rq;
	rv->ep = ep;
	if (admission_review_parse(body, len, &rv->req, err, sizeof(err)) != 0) {
		metrics_add(r->m_decisions,
		            METRICS_L(review_endpoint_names[ep], "error", "BadRequest"), 1);
		log_info("bad AdmissionReview", "endpoint", review_endpoint_names[ep], "error",
		         err);
		char msg[700];
		snprintf(msg, sizeof(msg), "bad AdmissionReview: %s\n", err);
		review_send_text(rq, 400, msg);
		free(rv);
		return;
	}
	int rc;
	if (ep == EP_PODS ? !rv->req.pod : !rv->req.ours) {
		answer_now(r, rq, ep, rv->req.uid, NULL, NULL);
		goto done;
	}
	if (ep == EP_PODS) {
		rc = pod_review_prepare(rv, err, sizeof(err));
		reason = rc == -ENOMEM ? "WebhookError" : "InvalidPod";
	} else {
		rc = prepare_cache_review(rv, &reason, err, sizeof(err));
	}
	if (rc != 0) {
		answer_now(r, rq, ep, rv->req.uid, rc > 0 ? NULL : reason, rc > 0 ? NULL : err);
		goto done;
	}
	pthread_mutex_lock(&r->lock);
	bool closing = r->closing;
	if (!closing) {
		rv->live_next = r->live;
		if (r->live)
			r->live->live_prev = rv;
		r->live = rv;
		r->nlive++;
	}
	pthread_mutex_unlock(&r->lock);
	if (closing) {
		answer_now(r, rq, ep, rv->req.uid, "ShuttingDown",
		           "the admission webhook is shutting down; try again");
		goto done;
	}
	if (loop_post(r->o.loop, review_start, rv) != 0) {
		review_live_remove(rv);
		answer_now(r, rq, ep, rv->req.uid, "WebhookError", "out of memory");
		goto done;
	}
	return;
done:
	review_free(rv);
}

/* ---- life cycle ---- */

int reviewer_new(const struct reviewer_opts *o, struct trust *trust, struct reviewer **out)
{
	static const double buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	                                 0.1,    0.25,  0.5,    1,     2.5,  5,     10};
	struct reviewer *r = calloc(1, sizeof(*r));
	int rc;
	if (!r)
		return -ENOMEM;
	r->o = *o;
	if ((rc = ttl_cache_new(o->cache_entries, &r->resolved)) != 0 ||
	    (rc = ttl_cache_new(o->cache_entries, &r->verdicts)) != 0) {
		ttl_cache_free(r->resolved);
		free(r);
		return rc;
	}
	pthread_mutex_init(&r->lock, NULL);
	r->trust = trust_ref(trust);
	r->m_latency = metrics_histogram("gkm_webhook_review_seconds",
	                                 "Time from request headers to answer, by endpoint",
	                                 "endpoint", buckets, sizeof(buckets) / sizeof(buckets[0]));
	r->m_decisions = metrics_counter("gkm_webhook_decisions_total",
	                                 "Admission answers by endpoint, result and reason",
	                                 "endpoint,result,reason");
	r->m_cache = metrics_counter("gkm_webhook_cache_total",
	                             "Cache lookups (resolve: tag to digest; verdict: signatures "
	                             "by digest and key set), by result",
	                             "cache,result");
	r->m_checks = metrics_counter("gkm_webhook_registry_checks_total",
	                              "Registry checks (resolve, find and verify signatures), by "
	                              "result",
	                              "result");
	r->m_jobs =
	    metrics_gauge("gkm_webhook_registry_checks_running", "Registry checks in flight", NULL);
	r->m_placements =
	    metrics_counter("gkm_webhook_pod_placements_total",
	                    "Cache volumes of admitted pods, by the node affinity "
	                    "added (required, preferred, none) and mount (csi, image)",
	                    "mode,mount");
	*out = r;
	return 0;
}

void reviewer_set_trust(struct reviewer *r, struct trust *t)
{
	struct trust *old = r->trust;
	r->trust = trust_ref(t);
	trust_unref(old);
}

void reviewer_set_catalog_synced(struct reviewer *r, bool synced)
{
	r->catalog_synced = synced;
}

unsigned reviewer_waiting(struct reviewer *r)
{
	pthread_mutex_lock(&r->lock);
	unsigned n = r->nlive;
	pthread_mutex_unlock(&r->lock);
	return n;
}

void reviewer_refuse_new(struct reviewer *r)
{
	pthread_mutex_lock(&r->lock);
	r->closing = true;
	pthread_mutex_unlock(&r->lock);
}

void reviewer_close(struct reviewer *r)
{
	reviewer_refuse_new(r);
	/* the loop is gone: nothing else touches the jobs or the live reviews */
	review_jobs_close(r);
	for (;;) {
		pthread_mutex_lock(&r->lock);
		struct review *rv = r->live;
		pthread_mutex_unlock(&r->lock);
		if (!rv)
			break;
		review_deny(rv, "ShuttingDown",
		            "the admission webhook is shutting down; try again");
	}
}

void reviewer_free(struct reviewer *r)
{
	if (!r)
		return;
	ttl_cache_free(r->resolved);
	ttl_cache_free(r->verdicts);
	trust_unref(r->trust);
	pthread_mutex_destroy(&r->lock);
	free(r);
}
