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

#define KYVERNO_ANNOTATION "kyverno.io/verify-images"

static const char *const ep_names[] = {"mutate", "validate", "pods"};

/* One registry check (resolve and/or verify), shared by the checks that
 * wait for the same image, digest and key set. */
struct job {
	struct reviewer *r;
	struct job *next;
	char *key;
	char *ref_text; /* the resolution's cache key */
	struct oci_ref ref;
	char digest[OCI_DIGEST_MAX]; /* known digest, or "" to resolve the tag */
	struct trust *trust;
	bool verify;
	bool global; /* with the webhook's own credentials (else anonymous) */
	int rc;
	struct image_check_result res;
	struct check *waiters;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- answering ---- */

static void send_text(struct https_request *rq, unsigned status, const char *text)
{
	char *body = strdup(text);
	https_reply(rq, status, "text/plain; charset=utf-8", body, body ? strlen(body) : 0);
}

/* Answer with an AdmissionReview; any thread. */
static void send_review(struct reviewer *r, struct https_request *rq, enum endpoint ep,
                        const struct admission_response *resp)
{
	char *body = NULL;
	size_t len = 0;
	const char *reason = resp->allowed ? "Allowed" : resp->reason ? resp->reason : "Forbidden";
	if (admission_response_build(resp, &body, &len) != 0) {
		send_text(rq, 500, "out of memory\n");
		metrics_add(r->m_decisions, METRICS_L(ep_names[ep], "error", "OutOfMemory"), 1);
		return;
	}
	double secs = (double)(mono_ns() - https_request_started_ns(rq)) / 1e9;
	https_reply(rq, 200, "application/json", body, len);
	metrics_observe(r->m_latency, METRICS_L(ep_names[ep]), secs);
	metrics_add(r->m_decisions,
	            METRICS_L(ep_names[ep], resp->allowed ? "allowed" : "denied", reason), 1);
}

static void live_remove(struct review *rv)
{
	struct reviewer *r = rv->r;
	pthread_mutex_lock(&r->lock);
	if (rv->live_prev)
		rv->live_prev->live_next = rv->live_next;
	else
		r->live = rv->live_next;
	if (rv->live_next)
		rv->live_next->live_prev = rv->live_prev;
	r->nlive--;
	pthread_mutex_unlock(&r->lock);
}

static void check_clear(struct check *c)
{
	oci_ref_clear(&c->ref);
	free(c->ref_text);
}

static void review_free(struct review *rv)
{
	for (unsigned i = 0; i < rv->nchecks; i++)
		check_clear(&rv->checks[i]);
	free(rv->checks);
	pod_review_free(rv->pod);
	admission_request_clear(&rv->req);
	if (rv->trust)
		trust_unref(rv->trust);
	free(rv);
}

void review_finish(struct review *rv, const struct admission_response *resp)
{
	live_remove(rv);
	send_review(rv->r, rv->rq, rv->ep, resp);
	const char *image = rv->nchecks ? rv->checks[0].image : "";
	if (!resp->allowed)
		log_info("review denied", "endpoint", ep_names[rv->ep], "kind", rv->req.kind,
		         "namespace", rv->req.namespace_, "name", rv->req.name, "image", image,
		         "reason", resp->reason, "message", resp->message);
	else if (log_enabled(LOG_DEBUG))
		log_debug("review allowed", "endpoint", ep_names[rv->ep], "kind", rv->req.kind,
		          "namespace", rv->req.namespace_, "name", rv->req.name, "image", image);
	review_free(rv);
}

void review_deny(struct review *rv, const char *reason, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	struct admission_response resp = {
	    .uid = rv->req.uid, .allowed = false, .reason = reason, .message = msg};
	review_finish(rv, &resp);
}

/* ---- the admission policy ---- */

static cJSON *policy_input(const struct review *rv, const struct check *c, const char *name,
                           const cJSON *annotations)
{
	cJSON *in = cJSON_CreateObject(), *img, *sigs, *cfg, *obj, *an;
	if (!in || !(img = cJSON_AddObjectToObject(in, "image")) ||
	    !cJSON_AddStringToObject(img, "ref", c->image) ||
	    !cJSON_AddStringToObject(img, "registry", c->ref.registry) ||
	    !cJSON_AddStringToObject(img, "repository", c->ref.repository) ||
	    (c->ref.tag && !cJSON_AddStringToObject(img, "tag", c->ref.tag)) ||
	    !cJSON_AddStringToObject(img, "digest", c->digest) ||
	    !(sigs = cJSON_AddArrayToObject(in, "signatures")) ||
	    !(cfg = cJSON_AddObjectToObject(in, "config")) ||
	    !cJSON_AddBoolToObject(cfg, "verifyEnabled", c->verify) ||
	    !cJSON_AddBoolToObject(cfg, "allowUnsigned", rv->trust->s.allow_unsigned) ||
	    !(obj = cJSON_AddObjectToObject(in, "object")) ||
	    !cJSON_AddStringToObject(obj, "kind", rv->req.kind) ||
	    !cJSON_AddStringToObject(obj, "namespace", rv->req.namespace_) ||
	    !cJSON_AddStringToObject(obj, "name", name) ||
	    !cJSON_AddStringToObject(obj, "operation", admission_op_name(rv->req.op)) ||
	    !(an = cJSON_AddObjectToObject(obj, "annotations")))
		goto fail;
	for (size_t i = 0; c->verify && i < c->verdict.n; i++) {
		const struct image_sig *s = &c->verdict.sig[i];
		cJSON *e = cJSON_CreateObject();
		if (!e || !cJSON_AddItemToArray(sigs, e) ||
		    !cJSON_AddStringToObject(e, "kind", image_sig_kind_name(s->kind)) ||
		    !cJSON_AddBoolToObject(e, "verified", s->verified) ||
		    (s->verified && !cJSON_AddStringToObject(e, "key", s->key)) ||
		    (!s->verified && !cJSON_AddStringToObject(e, "reason", s->reason)))
			goto fail;
	}
	const cJSON *a;
	cJSON_ArrayForEach(a, annotations)
	{
		/* a hint anyone can write, never proof of anything */
		if (!cJSON_IsString(a) || strcmp(a->string, KYVERNO_ANNOTATION) == 0)
			continue;
		if (!cJSON_AddStringToObject(an, a->string, a->valuestring))
			goto fail;
	}
	return in;
fail:
	cJSON_Delete(in);
	return NULL;
}

static const char *json_str(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : "";
}

bool review_admission_policy(struct review *rv, const struct check *c, const char *object_name,
                             const cJSON *annotations, char *reason, size_t reason_len,
                             char *message, size_t message_len)
{
	struct reviewer *r = rv->r;
	struct engine_error eerr;
	cJSON *out = NULL, *in = policy_input(rv, c, object_name, annotations);
	if (!in) {
		snprintf(reason, reason_len, "WebhookError");
		snprintf(message, message_len, "out of memory building the policy input");
		return false;
	}
	enum engine_status st =
	    r->o.policy->current ? engine_call(r->o.policy->current, "admission", in, &out, &eerr)
	                         : ENGINE_NO_HOOK;
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		snprintf(reason, reason_len, "PolicyError");
		snprintf(message, message_len, "the admission policy failed (%s): %.800s",
		         engine_status_name(st),
		         r->o.policy->current ? eerr.message : "no policy loaded");
		return false;
	}
	bool allowed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(out, "allowed"));
	if (!allowed) {
		snprintf(reason, reason_len, "%s", json_str(out, "reason"));
		snprintf(message, message_len, "%s", json_str(out, "message"));
	}
	cJSON_Delete(out);
	return allowed;
}

void review_image_warning(const struct check *c, const char *subject, char *buf, size_t len)
{
	buf[0] = '\0';
	if (!c->verify)
		snprintf(buf, len,
		         "signature verification is off (verify-enabled: false); %s was admitted "
		         "unchecked",
		         subject);
	else if (!image_verdict_accepted(&c->verdict))
		snprintf(buf, len, "%s has %s; admitted because unsigned images are allowed",
		         subject, c->verdict.found ? "no signature that verifies" : "no signature");
}

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
	if (admission_patch_digest(&rv->req, digest, &patch) != 0) {
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

/* Every check is back: decide the review. */
static void review_ready(struct review *rv)
{
	if (rv->ep == EP_PODS)
		pod_review_decide(rv);
	else
		decide(rv);
}

/* ---- caches and registry jobs (loop thread) ---- */

/* The tag resolution's cache key: one per credentials, as the verdict's. */
static void resolve_key(char *key, size_t cap, const char *ref_text, bool global)
{
	snprintf(key, cap, "%s|%c", ref_text, global ? 'g' : 'a');
}

/* What one read learns serves only reads with the same credentials. */
static void verdict_key(char *key, size_t cap, const char *digest, const struct trust *t,
                        bool global)
{
	snprintf(key, cap, "%s|%s|%c", digest, t->s.verify_enabled ? t->keys_fp : "-",
	         global ? 'g' : 'a');
}

static bool cache_lookup(struct reviewer *r, struct ttl_cache *c, const char *name, const char *key,
                         void *val, size_t cap)
{
	bool hit = ttl_cache_get(c, key, loop_now_ms(), val, cap) >= 0;
	metrics_add(r->m_cache, METRICS_L(name, hit ? "hit" : "miss"), 1);
	return hit;
}

static void job_unlink_waiter(struct job *j, struct check *c)
{
	for (struct check **p = &j->waiters; *p; p = &(*p)->next_waiter) {
		if (*p == c) {
			*p = c->next_waiter;
			break;
		}
	}
	c->next_waiter = NULL;
	c->job = NULL;
}

static void check_fail(struct check *c, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void check_fail(struct check *c, const char *reason, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->message, sizeof(c->message), fmt, ap);
	va_end(ap);
	c->fail_reason = reason;
	c->done = true;
}

static void check_succeed(struct check *c, const char *digest, const struct image_verdict *v,
                          bool verify)
{
	snprintf(c->digest, sizeof(c->digest), "%s", digest);
	c->verdict = *v;
	c->verify = verify;
	c->done = true;
}

/* Take rv's checks off the jobs they wait for; the image of the last one
 * that waited, or "". */
static const char *stop_waiting(struct review *rv)
{
	const char *slow = "";
	for (unsigned i = 0; i < rv->nchecks; i++) {
		struct check *c = &rv->checks[i];
		if (c->job) {
			job_unlink_waiter(c->job, c);
			slow = c->image;
		}
	}
	return slow;
}

static void review_timeout(struct loop *l, void *ud)
{
	struct review *rv = ud;
	rv->timer = 0;
	const char *slow = stop_waiting(rv);
	review_deny(rv, "RegistryTimeout",
	            "could not resolve and verify image %s within %llu ms (the registry is slow "
	            "or unreachable); try again",
	            slow, (unsigned long long)rv->r->o.deadline_ms);
}

static void job_free(struct job *j)
{
	free(j->key);
	free(j->ref_text);
	oci_ref_clear(&j->ref);
	trust_unref(j->trust);
	free(j);
}

static void job_work(void *ud)
{
	struct job *j = ud;
	struct oci_registry_opts o = j->r->o.registry;
	if (!j->global) {
		o.username = o.password = o.auth_file = o.auth_json = NULL;
		o.no_default_auth_files = true;
		o.auth_source = PULL_SECRET_NONE_WHY;
	}
	j->rc = image_check_run(&j->ref, j->digest[0] ? j->digest : NULL,
	                        j->verify ? j->trust->keys : NULL, &o, &j->res);
}

static void job_done(struct loop *l, void *ud)
{
	struct job *j = ud;
	struct reviewer *r = j->r;
	for (struct job **p = &r->jobs; *p; p = &(*p)->next) {
		if (*p == j) {
			*p = j->next;
			break;
		}
	}
	r->njobs--;
	metrics_set(r->m_jobs, NULL, r->njobs);
	uint64_t now = loop_now_ms();
	const char *result = j->rc == 0                              ? "ok"
	                     : j->res.error == IMAGE_CHECK_NOT_FOUND ? "not_found"
	                                                             : "unavailable";
	metrics_add(r->m_checks, METRICS_L(result), 1);
	if (j->rc == 0) {
		char key[256], rkey[1100];
		resolve_key(rkey, sizeof(rkey), j->ref_text, j->global);
		if (j->res.resolved &&
		    ttl_cache_put(r->resolved, rkey, j->res.digest, strlen(j->res.digest) + 1,
		                  now + r->o.resolve_ttl_ms) != 0)
			log_warn("cannot cache a tag resolution", "error", "out of memory");
		verdict_key(key, sizeof(key), j->res.digest, j->trust, j->global);
		uint64_t ttl = !j->verify || image_verdict_accepted(&j->res.verdict)
		                   ? r->o.verified_ttl_ms
		                   : r->o.rejected_ttl_ms;
		if (ttl_cache_put(r->verdicts, key, &j->res.verdict, sizeof(j->res.verdict),
		                  now + ttl) != 0)
			log_warn("cannot cache a verdict", "error", "out of memory");
	} else {
		log_warn("registry check failed", "image", j->ref_text, "error", j->res.message);
	}
	while (j->waiters) {
		struct check *c = j->waiters;
		struct review *rv = c->rv;
		j->waiters = c->next_waiter;
		c->next_waiter = NULL;
		c->job = NULL;
		if (j->rc == 0)
			check_succeed(c, j->res.digest, &j->res.verdict, j->verify);
		else if (j->res.error == IMAGE_CHECK_NOT_FOUND)
			check_fail(c, "ImageNotFound", "image %s: %s", c->image, j->res.message);
		else
			check_fail(c, "RegistryUnavailable", "image %s could not be checked: %s",
			           c->image, j->res.message);
		if (--rv->waiting == 0) {
			loop_cancel_timer(l, rv->timer);
			rv->timer = 0;
			review_ready(rv);
		}
	}
	job_free(j);
}

/* Wait for the job that checks c's image (digest may be NULL: resolve).
 * true when c waits; false when it failed at once. */
static bool wait_for_job(struct check *c, const char *digest)
{
	struct review *rv = c->rv;
	struct reviewer *r = rv->r;
	bool verify = rv->trust->s.verify_enabled;
	char *key = NULL;
	struct job *j;
	if (asprintf(&key, "%s|%s|%s|%c", c->ref_text, digest ? digest : "",
	             verify ? rv->trust->keys_fp : "-", c->global ? 'g' : 'a') < 0) {
		check_fail(c, "WebhookError", "out of memory");
		return false;
	}
	for (j = r->jobs; j && strcmp(j->key, key) != 0; j = j->next)
		;
	if (!j) {
		if (r->njobs >= r->o.max_jobs) {
			free(key);
			check_fail(c, "WebhookBusy",
			           "%u registry checks are already running; try again shortly",
			           r->njobs);
			return false;
		}
		if (!(j = calloc(1, sizeof(*j))) || !(j->ref_text = strdup(c->ref_text)) ||
		    oci_ref_copy(&c->ref, &j->ref) != 0) {
			if (j)
				free(j->ref_text);
			free(j);
			free(key);
			check_fail(c, "WebhookError", "out of memory");
			return false;
		}
		j->r = r;
		j->key = key;
		key = NULL;
		j->trust = trust_ref(rv->trust);
		j->verify = verify;
		j->global = c->global;
		snprintf(j->digest, sizeof(j->digest), "%s", digest ? digest : "");
		if (workers_submit(r->o.workers, job_work, job_done, j) != 0) {
			job_free(j);
			/* the pool refuses work only while shutting down (or out of memory) */
			check_fail(c, "ShuttingDown",
			           "the admission webhook is shutting down; try again");
			return false;
		}
		j->next = r->jobs;
		r->jobs = j;
		r->njobs++;
		metrics_set(r->m_jobs, NULL, r->njobs);
	}
	free(key);
	c->job = j;
	c->next_waiter = j->waiters;
	j->waiters = c;
	return true;
}

/* Answer c from the caches, or start waiting for its job. true when it waits. */
static bool check_start(struct check *c)
{
	struct reviewer *r = c->rv->r;
	char resolved[OCI_DIGEST_MAX];
	struct image_verdict v;
	char key[256], rkey[1100];
	const struct trust *t = c->rv->trust;
	const char *digest = c->ref.digest ? c->ref.digest : c->pinned[0] ? c->pinned : NULL;
	resolve_key(rkey, sizeof(rkey), c->ref_text, c->global);
	if (!digest && cache_lookup(r, r->resolved, "resolve", rkey, resolved, sizeof(resolved))) {
		resolved[sizeof(resolved) - 1] = '\0';
		digest = resolved;
	}
	if (digest) {
		verdict_key(key, sizeof(key), digest, t, c->global);
		if (cache_lookup(r, r->verdicts, "verdict", key, &v, sizeof(v))) {
			check_succeed(c, digest, &v, t->s.verify_enabled);
			return false;
		}
	}
	return wait_for_job(c, digest);
}

void review_run_checks(struct review *rv)
{
	struct reviewer *r = rv->r;
	rv->waiting = 0;
	for (unsigned i = 0; i < rv->nchecks; i++)
		rv->waiting += check_start(&rv->checks[i]);
	if (!rv->waiting) {
		review_ready(rv);
		return;
	}
	uint64_t elapsed = (mono_ns() - https_request_started_ns(rv->rq)) / 1000000u;
	uint64_t left = elapsed < r->o.deadline_ms ? r->o.deadline_ms - elapsed : 0;
	rv->timer = loop_add_timer(r->o.loop, left, review_timeout, rv);
	if (!rv->timer) {
		stop_waiting(rv);
		review_deny(rv, "WebhookError", "out of memory");
	}
}

/* Loop thread: a parsed review arrives. */
static void review_start(struct loop *l, void *ud)
{
	struct review *rv = ud;
	rv->trust = trust_ref(rv->r->trust);
	if (rv->ep == EP_PODS)
		pod_review_start(rv);
	else
		review_run_checks(rv);
}

/* ---- the HTTPS side ---- */

static void answer_now(struct reviewer *r, struct https_request *rq, enum endpoint ep,
                       const char *uid, const char *reason, const char *message)
{
	struct admission_response resp = {
	    .uid = uid, .allowed = reason == NULL, .reason = reason, .message = message};
	send_review(r, rq, ep, &resp);
	if (reason)
		log_info("review denied", "endpoint", ep_names[ep], "uid", uid, "reason", reason,
		         "message", message);
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
		send_text(rq, 404,
		          r->o.catalog
		              ? "not found: POST AdmissionReviews to /mutate, /validate or "
		                "/mutate-pods\n"
		              : "not found: POST AdmissionReviews to /mutate or /validate "
		                "(/mutate-pods needs --pod-placement)\n");
		return;
	}
	if (!(rv = calloc(1, sizeof(*rv)))) {
		send_text(rq, 500, "out of memory\n");
		return;
	}
	rv->r = r;
	rv->rq = rq;
	rv->ep = ep;
	if (admission_review_parse(body, len, &rv->req, err, sizeof(err)) != 0) {
		metrics_add(r->m_decisions, METRICS_L(ep_names[ep], "error", "BadRequest"), 1);
		log_info("bad AdmissionReview", "endpoint", ep_names[ep], "error", err);
		char msg[700];
		snprintf(msg, sizeof(msg), "bad AdmissionReview: %s\n", err);
		send_text(rq, 400, msg);
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
		live_remove(rv);
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
	while (r->jobs) {
		struct job *j = r->jobs;
		r->jobs = j->next;
		for (struct check *c = j->waiters; c; c = c->next_waiter)
			c->job = NULL;
		job_free(j);
	}
	r->njobs = 0;
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
