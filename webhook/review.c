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
#include "log.h"
#include "metrics.h"
#include "oci_ref.h"
#include "pull_secret.h"
#include "ttl_cache.h"

#define KYVERNO_ANNOTATION "kyverno.io/verify-images"

const char *const review_endpoint_names[] = {"mutate", "validate", "pods"};
#define ep_names review_endpoint_names

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

uint64_t review_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- answering ---- */

void review_send_text(struct https_request *rq, unsigned status, const char *text)
{
	char *body = strdup(text);
	https_reply(rq, status, "text/plain; charset=utf-8", body, body ? strlen(body) : 0);
}

/* Answer with an AdmissionReview; any thread. */
void review_send(struct reviewer *r, struct https_request *rq, enum endpoint ep,
                 const struct admission_response *resp)
{
	char *body = NULL;
	size_t len = 0;
	const char *reason = resp->allowed ? "Allowed" : resp->reason ? resp->reason : "Forbidden";
	if (admission_response_build(resp, &body, &len) != 0) {
		review_send_text(rq, 500, "out of memory\n");
		metrics_add(r->m_decisions, METRICS_L(ep_names[ep], "error", "OutOfMemory"), 1);
		return;
	}
	double secs = (double)(review_mono_ns() - https_request_started_ns(rq)) / 1e9;
	https_reply(rq, 200, "application/json", body, len);
	metrics_observe(r->m_latency, METRICS_L(ep_names[ep]), secs);
	metrics_add(r->m_decisions,
	            METRICS_L(ep_names[ep], resp->allowed ? "allowed" : "denied", reason), 1);
}

void review_live_remove(struct review *rv)
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

void review_free(struct review *rv)
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
	review_live_remove(rv);
	review_send(rv->r, rv->rq, rv->ep, resp);
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
		    (s->rule[0] && (!cJSON_AddStringToObject(e, "identity", s->identity) ||
		                    !cJSON_AddStringToObject(e, "issuer", s->issuer) ||
		                    !cJSON_AddStringToObject(e, "rule", s->rule))) ||
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

/* Every check is back: decide the review. */
static void review_ready(struct review *rv)
{
	rv->decide(rv);
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

static void review_job_free(struct job *j)
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
	review_job_free(j);
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
			review_job_free(j);
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
	uint64_t elapsed = (review_mono_ns() - https_request_started_ns(rv->rq)) / 1000000u;
	uint64_t left = elapsed < r->o.deadline_ms ? r->o.deadline_ms - elapsed : 0;
	rv->timer = loop_add_timer(r->o.loop, left, review_timeout, rv);
	if (!rv->timer) {
		stop_waiting(rv);
		review_deny(rv, "WebhookError", "out of memory");
	}
}

void review_jobs_close(struct reviewer *r)
{
	while (r->jobs) {
		struct job *j = r->jobs;
		r->jobs = j->next;
		for (struct check *c = j->waiters; c; c = c->next_waiter)
			c->job = NULL;
		review_job_free(j);
	}
	r->njobs = 0;
}
