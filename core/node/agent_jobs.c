/* The agent's registry jobs: reading an image's configuration and pulling
 * it into the store, on the agent's own threads, in the scheduler's slots. */

#include "agent_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "cache_env.h"
#include "compat_targets.h"
#include "log.h"
#include "oci_pull.h"
#include "pull_secret.h"
#include "textfmt.h"

/* Every cache reads its image and pulls through its own reference: the
 * store shares content between caches of one digest, never a verdict or a
 * source (another cache's signature does not vouch for this one, another
 * cache's dead registry does not fail it). What a pull proved about a
 * source serves only the caches that would prove exactly the same: see
 * source checks below. Jobs wait in the scheduler (pull_sched.h) for a slot
 * of their registry host and run on the agent's own threads. */

struct job {
	struct agent *a;
	enum pull_sched_lane lane;
	char key[320];
	char ref[700];      /* the cache's reference when the job started (its text) */
	struct oci_ref pin; /* the same, parsed (a copy of the cache's) */
	int pin_rc;         /* or why it does not parse */
	char pin_err[256];
	char digest[80];
	bool want_targets_from_tree;
	int rc;
	char reason[64], message[512];
	cJSON *targets;
	char store_digest[80];
	bool present;
	uint64_t bytes;
	double seconds;
	struct pull_secret_ref secrets; /* the pull Secrets the cache names */
	struct trust *trust;            /* what the job trusts (referenced) */
	char verified_by[80];           /* the key that verified the digest, if any */
	uint64_t room_bytes, room;      /* refused for room: the image's files, the room it needs */
	bool checked;                   /* the pull checked the source at its registry */
	bool shared;                    /* an earlier check of the same source served */
};

static void job_fail(struct job *j, int rc, const char *reason, const char *msg)
{
	j->rc = rc ? rc : -EIO;
	snprintf(j->reason, sizeof(j->reason), "%s", reason);
	snprintf(j->message, sizeof(j->message), "%s", msg);
}

static const char *pull_reason(int rc)
{
	switch (rc) {
	case -ENODATA:
		return "Unsigned";
	case -EKEYREJECTED:
	case -ENOKEY:
		return "SignatureNotTrusted";
	case -EBADMSG:
	case -EILSEQ:
		return "DigestMismatch";
	case -EPERM:
		return "UnsafeContent";
	case -EFBIG:
	case -E2BIG:
		return "TooLarge";
	case -ETIMEDOUT:
		return "RegistryTimeout";
	case -ECONNREFUSED:
	case -EHOSTUNREACH:
	case -ECONNRESET:
	case -EAGAIN:
		return "RegistryUnavailable";
	case -ENOENT:
		return "ImageNotFound";
	case -EACCES:
		return "Unauthorized";
	case -ENETUNREACH:
		return "MirrorUnreachable";
	case -EBADE:
		return "CertificateUnknown";
	case -ENOSPC:
		return "InsufficientStorage";
	default:
		return "PullFailed";
	}
}

/* Failures that trying again cannot change: the signatures, the content
 * and the labels of a digest are what they are (a registry that comes back,
 * credentials that are fixed, an image pushed later are worth a retry). */
static bool permanent_reason(const char *reason)
{
	static const char *const p[] = {"Unsigned",      "SignatureNotTrusted",
	                                "NoTrustedKeys", "UnsafeContent",
	                                "TooLarge",      "InvalidImageLabels"};
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		if (!strcmp(reason, p[i]))
			return true;
	return false;
}

/* The registry host could not be reached (or turned us away for now). */
static bool unreachable(int rc)
{
	const char *reason = pull_reason(rc);
	return !strcmp(reason, "RegistryUnavailable") || !strcmp(reason, "RegistryTimeout") ||
	       !strcmp(reason, "MirrorUnreachable");
}

/* Registry clients kept between jobs, shared by the pool's threads (one
 * job at a time uses a client: it is not thread-safe): connections, the
 * scheme a client learnt and its bearer tokens serve the next job of the
 * host instead of a TLS handshake (and a loopback registry's HTTPS probe)
 * per job. A client is dropped after a job that failed and once CLIENT_TTL_MS
 * old (so that credentials that changed, a new pull secret, are read again),
 * and all idle ones CLIENT_IDLE_MS after the last job (they hold TLS state). */
#define CLIENT_TTL_MS 300000
#define CLIENT_IDLE_MS 5000

struct client {
	struct client *next;
	struct oci_registry *reg;
	uint64_t born;
	char host[256];
	char creds[sizeof(((struct pull_secret *)0)->key)]; /* pull_secret.key, "" for none */
};

/* An idle client of host with the credentials creds names (its bearer
 * tokens were issued to them: a client is never shared between
 * credentials), or a new one made with opts (NULL: the job makes its own). */
static struct client *client_take(struct agent *a, const char *host, const char *creds,
                                  const struct oci_registry_opts *opts)
{
	uint64_t now = loop_now_ms();
	struct client *c = NULL;
	pthread_mutex_lock(&a->clients_lock);
	for (struct client **p = &a->clients; *p; p = &(*p)->next) {
		if (!strcmp((*p)->host, host) && !strcmp((*p)->creds, creds) &&
		    now - (*p)->born < CLIENT_TTL_MS) {
			c = *p;
			*p = c->next;
			break;
		}
	}
	pthread_mutex_unlock(&a->clients_lock);
	if (c)
		return c;
	struct oci_err e;
	memset(&e, 0, sizeof(e));
	if (!(c = calloc(1, sizeof(*c))) || oci_registry_new(host, opts, &c->reg, &e) != 0) {
		free(c);
		return NULL;
	}
	snprintf(c->host, sizeof(c->host), "%s", host);
	snprintf(c->creds, sizeof(c->creds), "%s", creds);
	c->born = now;
	return c;
}

static void client_free(struct client *c)
{
	if (c)
		oci_registry_free(c->reg);
	free(c);
}

static void client_give(struct agent *a, struct client *c, bool ok)
{
	if (!c)
		return;
	if (!ok || loop_now_ms() - c->born >= CLIENT_TTL_MS) {
		client_free(c);
		return;
	}
	pthread_mutex_lock(&a->clients_lock);
	c->next = a->clients;
	a->clients = c;
	pthread_mutex_unlock(&a->clients_lock);
}

void agent_clients_drop_idle(struct loop *l, void *ud)
{
	struct agent *a = ud;
	a->clients_timer = 0;
	pthread_mutex_lock(&a->clients_lock);
	struct client *c = a->clients;
	a->clients = NULL;
	pthread_mutex_unlock(&a->clients_lock);
	while (c) {
		struct client *next = c->next;
		client_free(c);
		c = next;
	}
	loop_trim_soon(l);
}

/* The registry options of a job: the daemon's, with the credentials of
 * the pull Secret its cache names instead of the daemon's own. The job
 * fails (reason and message set) when the Secrets cannot be read. */
static int job_registry(struct job *j, const struct oci_ref *ref, struct pull_secret *ps,
                        struct oci_registry_opts *o)
{
	char err[512];
	int rc = pull_secret_opts(j->a->os, &j->secrets,
	                          ref->kind == OCI_REF_REGISTRY ? ref->registry : NULL, &j->a->reg,
	                          ps, o, err, sizeof(err));
	if (rc)
		job_fail(j, rc, rc == -EINVAL ? "InvalidPullSecrets" : pull_reason(rc), err);
	return rc;
}

/* Open the repository of a job's reference, on a kept client (*client,
 * given back by the caller) where there is one. */
static int job_repo(struct job *j, const struct oci_ref *ref, const struct pull_secret *ps,
                    const struct oci_registry_opts *opts, struct client **client,
                    struct oci_repo **out, struct oci_err *e)
{
	*client = ref->kind == OCI_REF_REGISTRY
	              ? client_take(j->a, oci_ref_api_host(ref), ps->key, opts)
	              : NULL;
	return *client ? oci_repo_open_on(ref, (*client)->reg, out, e)
	               : oci_repo_open(ref, opts, false, out, e);
}

/* Read the image config: targets from its labels when it has them. */
static void fetch_image_work(void *ud)
{
	struct job *j = ud;
	struct oci_repo *repo = NULL;
	struct client *client = NULL;
	struct oci_image img;
	struct oci_err e;
	char err[512];
	memset(&img, 0, sizeof(img));
	memset(&e, 0, sizeof(e));
	struct pull_secret ps;
	struct oci_registry_opts opts;
	memset(&ps, 0, sizeof(ps));
	int rc = j->pin_rc;
	if (rc)
		oci_errf(&e, "%s", j->pin_err);
	if (!rc && (rc = job_registry(j, &j->pin, &ps, &opts)))
		goto out;
	if (!rc)
		rc = job_repo(j, &j->pin, &ps, &opts, &client, &repo, &e);
	if (!rc)
		rc = oci_repo_fetch_image(repo, oci_ref_reference(&j->pin), NULL, &img, &e);
	if (rc) {
		job_fail(j, rc, pull_reason(rc), oci_err_str(&e, rc));
		goto out;
	}
	cJSON *labels = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(img.config.root, "config"), "Labels");
	rc = compat_targets_from_labels(labels, &j->targets, err, sizeof(err));
	if (rc == -ENOENT) {
		j->want_targets_from_tree = true; /* no summary label: read the cache itself */
		rc = 0;
	} else if (rc) {
		job_fail(j, rc, "InvalidImageLabels", err);
	}
out:
	oci_image_clear(&img);
	oci_repo_free(repo);
	client_give(j->a, client, rc == 0);
	pull_secret_clear(&ps);
}

/* Whether two caches read their images with the same credentials: what
 * one learns about an image serves the other only then (a namespace without
 * access learns nothing from another's read). */
static bool same_access(const struct agent *a, const struct cache *c, const struct cache *o)
{
	struct pull_secret_ref rc = {0}, ro = {0};
	pull_secret_ref_of(c->obj, a->o.namespace_, a->o.global_credentials, &rc);
	pull_secret_ref_of(o->obj, a->o.namespace_, a->o.global_credentials, &ro);
	return pull_secret_ref_same(&rc, &ro);
}

/* Room in the store for an image, before its first layer byte: what its
 * cache-size-bytes label says the files take (agent_budget_room()). An
 * image without the label is pulled as before. */
static int store_room(const struct oci_image *img, void *ud, struct oci_err *err)
{
	struct job *j = ud;
	unsigned long long size = cache_env_size_bytes(oci_config_labels(&img->config));
	int rc = size ? agent_budget_room(j->a, size, &j->room, err) : 0;
	if (rc)
		j->room_bytes = size;
	return rc;
}

/* Source checks. A pull that succeeded proved, together: that the cache's
 * reference (registry, repository, digest) serves the manifest, the
 * configuration and every layer to the credentials it was read with, and,
 * when the node verifies, that a signature there verifies with the keys
 * trusted then. Another cache's pull takes that proof instead of asking the
 * registry again only when it would ask exactly the same: the same
 * reference, the same credentials (pull_secret.key: the Secret chosen and
 * its resourceVersion, "(anonymous)", or "" for the daemon's own) and the
 * same trust (the snapshot's sources and switches). Another repository
 * holding the digest, another Secret or a Secret edited since, a key added
 * or removed: each checks for itself. Only successes are kept (a failure is
 * its own cache's, and a recheck must reach the registry); a proof expires
 * after CHECK_TTL_MS (the daemon's own credentials and what a registry
 * serves may change without changing the key), and a new trust snapshot
 * drops them all. */
#define CHECK_TTL_MS 60000
#define CHECK_ENTRIES 256

struct source_check {
	char store_digest[80];
	char verified_by[80];
};

/* The key of a check: reference, credentials, trust. buf: CHECK_KEY_MAX. */
#define CHECK_KEY_MAX (sizeof(((struct cache *)0)->ref) + sizeof(((struct client *)0)->creds) + 96)
static void check_key(const char *ref, const char *creds, const struct trust *t, char *buf)
{
	snprintf(buf, CHECK_KEY_MAX, "%s\n%s\n%s/%d/%d", ref, creds, t ? t->digest : "-",
	         t && t->s.verify_enabled, t && t->s.allow_unsigned);
}

/* An earlier check under key whose content the store still holds (else the
 * cache pulls again). Any thread. */
static bool check_find(struct agent *a, const char *key, struct source_check *sc,
                       struct store_entry_info *info)
{
	pthread_mutex_lock(&a->checks_lock);
	long n = ttl_cache_get(a->checks, key, loop_now_ms(), sc, sizeof(*sc));
	pthread_mutex_unlock(&a->checks_lock);
	return n == (long)sizeof(*sc) && store_lookup(a->store, sc->store_digest, info) == 0;
}

static bool check_shared(struct job *j, const char *key, struct store_entry_info *info)
{
	struct source_check sc;
	if (!check_find(j->a, key, &sc, info))
		return false;
	snprintf(j->store_digest, sizeof(j->store_digest), "%s", sc.store_digest);
	snprintf(j->verified_by, sizeof(j->verified_by), "%s", sc.verified_by);
	j->present = j->shared = true;
	return true;
}

static void check_keep(struct job *j, const char *key)
{
	struct agent *a = j->a;
	struct source_check sc;
	snprintf(sc.store_digest, sizeof(sc.store_digest), "%s", j->store_digest);
	snprintf(sc.verified_by, sizeof(sc.verified_by), "%s", j->verified_by);
	pthread_mutex_lock(&a->checks_lock);
	/* out of memory: the next cache of the source checks for itself */
	if (ttl_cache_put(a->checks, key, &sc, sizeof(sc), loop_now_ms() + CHECK_TTL_MS) != 0)
		log_debug("source check not kept", "cache", j->key);
	pthread_mutex_unlock(&a->checks_lock);
}

int agent_checks_new(struct agent *a)
{
	pthread_mutex_init(&a->checks_lock, NULL);
	return ttl_cache_new(CHECK_ENTRIES, &a->checks);
}

void agent_checks_forget(struct agent *a)
{
	pthread_mutex_lock(&a->checks_lock);
	ttl_cache_clear(a->checks);
	pthread_mutex_unlock(&a->checks_lock);
}

void agent_checks_free(struct agent *a)
{
	ttl_cache_free(a->checks);
	pthread_mutex_destroy(&a->checks_lock);
}

/* Without a summary label the targets come from the extracted tree. */
static void targets_from_tree(struct job *j)
{
	char path[1024], err[512];
	if (!j->want_targets_from_tree ||
	    store_entry_path(j->a->store, j->store_digest, path, sizeof(path)) != 0)
		return;
	int rc = compat_targets_from_dir(path, &j->targets, err, sizeof(err));
	if (rc && rc != -ENOENT)
		log_warn("cannot read cache targets", "digest", j->digest, "error", err);
}

/* Pull through this cache's reference: its signatures are verified even when
 * the store already holds the digest (then nothing else is downloaded),
 * unless a check of the same source, credentials and trust serves it. */
static void pull_work(void *ud)
{
	struct job *j = ud;
	struct oci_err e;
	struct store_entry_info info;
	struct oci_registry_opts opts;
	struct sig_verdict verdict = {0};
	bool verify = j->trust && j->trust->s.verify_enabled;
	struct oci_pull_opts o = {.registry = &opts,
	                          .keys = verify ? j->trust->keys : NULL,
	                          .require_signature = verify,
	                          .verdict = &verdict,
	                          .before_layers = store_room,
	                          .before_layers_ud = j};
	struct pull_secret ps;
	struct client *client = NULL;
	memset(&e, 0, sizeof(e));
	memset(&ps, 0, sizeof(ps));
	if (verify && j->trust->nkeys == 0) {
		/* fail closed: with nothing to verify with, nothing is used */
		job_fail(
		    j, -ENOKEY, "NoTrustedKeys",
		    "signature verification is on, but no trusted key is configured "
		    "(--trust-dir, --key; the chart's verification.keys): nothing is verified, so "
		    "nothing is made Ready");
		return;
	}
	if (j->pin_rc) {
		job_fail(j, j->pin_rc, pull_reason(j->pin_rc), j->pin_err);
		return;
	}
	if (job_registry(j, &j->pin, &ps, &opts) != 0)
		return;
	char key[CHECK_KEY_MAX];
	check_key(j->ref, ps.key, j->trust, key);
	if (check_shared(j, key, &info)) {
		pull_secret_clear(&ps);
		targets_from_tree(j);
		return;
	}
	if (j->pin.kind == OCI_REF_REGISTRY)
		client = client_take(j->a, oci_ref_api_host(&j->pin), ps.key, &opts);
	o.client = client ? client->reg : NULL;
	uint64_t t0 = loop_now_ms();
	/* the cache's own credentials reach its own source (manifest and
	 * config) before any byte of the store is handed to it */
	int rc = oci_pull_to_store(j->a->store, &j->pin, &o, NULL, j->store_digest, &info,
	                           &j->present, &e);
	j->seconds = (double)(loop_now_ms() - t0) / 1000.0;
	j->checked = true;
	client_give(j->a, client, rc == 0);
	pull_secret_clear(&ps);
	if (rc) {
		job_fail(j, rc, pull_reason(rc), oci_err_str(&e, rc));
		return;
	}
	j->bytes = info.bytes;
	if (verdict.accepted)
		snprintf(j->verified_by, sizeof(j->verified_by), "%s", verdict.key_fingerprint);
	check_keep(j, key);
	targets_from_tree(j);
}

static struct cache *cache_of(struct pull_sched_job *sj)
{
	size_t off = sj->lane == PULL_SCHED_FETCH ? offsetof(struct cache, fetch.job)
	                                          : offsetof(struct cache, pull.job);
	return (struct cache *)(void *)((char *)sj - off);
}

static void sched_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	a->sched_timer = 0;
	agent_schedule(a);
}

/* When now + delay_ms will be, in RFC 3339. */
static void wall_time_in(uint64_t delay_ms, char *buf, size_t len)
{
	rfc3339_format((int64_t)time(NULL) + (int64_t)((delay_ms + 999) / 1000), buf, len);
}

static void attempt_failed(struct agent *a, struct cache *c, struct attempt *att,
                           const char *reason, const char *message, uint64_t not_before)
{
	uint64_t now = loop_now_ms();
	att->retry_at =
	    now + backoff_ms(att->failures++, PULL_BACKOFF_MS, PULL_BACKOFF_MAX_MS, &a->seed);
	if (not_before > att->retry_at)
		att->retry_at = not_before;
	att->permanent = permanent_reason(reason);
	att->recheck = false;
	wall_time_in(att->retry_at - now, att->retry_time, sizeof(att->retry_time));
	snprintf(att->reason, sizeof(att->reason), "%s", reason);
	snprintf(att->message, sizeof(att->message), "%s", message);
	agent_enqueue(a, c->key, 0);
}

/* The host of a job could not be reached: caches queued for it that have
 * not failed yet would meet the same closed door. They report the host's
 * failure now and wait out its backoff without a slot; one try at a time
 * then tells when it answers again. */
static void host_failed(struct agent *a, const struct job *j, const struct pull_sched_host *h)
{
	uint64_t at = pull_sched_host_retry_at(h);
	for (struct cache *c = a->caches; c; c = c->next) {
		struct attempt *atts[] = {&c->fetch, &c->pull};
		for (size_t i = 0; i < 2; i++) {
			struct attempt *att = atts[i];
			if (!att->job.queued || att->job.host != h || att->failures)
				continue;
			pull_sched_cancel(a->sched, &att->job);
			attempt_failed(a, c, att, j->reason, j->message, at);
		}
	}
}

/* A job's completion on the loop: its cache and attempt, or NULL when the
 * agent stops or the cache has moved on to another reference since. */
static struct cache *job_end(struct job *j, struct attempt **att_out)
{
	struct agent *a = j->a;
	a->jobs--;
	if (a->stopping)
		return NULL;
	struct cache *c = agent_find_cache(a, j->key); /* kept while its job runs */
	if (!c)
		return NULL;
	struct attempt *att = j->lane == PULL_SCHED_FETCH ? &c->fetch : &c->pull;
	bool down = unreachable(j->rc);
	pull_sched_done(a->sched, &att->job, down ? PULL_SCHED_UNREACHABLE : PULL_SCHED_OK,
	                loop_now_ms());
	if (down)
		host_failed(a, j, att->job.host);
	if (strcmp(c->ref, j->ref) != 0) {
		agent_enqueue(a, c->key, 0);
		return NULL;
	}
	if (j->rc) {
		attempt_failed(a, c, att, j->reason, j->message, 0);
		log_warn(j->lane == PULL_SCHED_FETCH ? "cannot read the image configuration"
		                                     : "pull failed",
		         "cache", c->key, "digest", j->digest, "reason", j->reason, "error",
		         j->message, "next_try",
		         att->permanent ? "after a change" : att->retry_time);
	} else {
		agent_attempt_reset(a, att);
	}
	*att_out = att;
	return c;
}

static void job_free(struct job *j)
{
	struct agent *a = j->a;
	trust_unref(j->trust);
	oci_ref_clear(&j->pin);
	cJSON_Delete(j->targets);
	free(j);
	if (a->clients_timer)
		loop_cancel_timer(a->loop, a->clients_timer);
	a->clients_timer =
	    a->stopping ? 0 : loop_add_timer(a->loop, CLIENT_IDLE_MS, agent_clients_drop_idle, a);
	agent_schedule(a);
}

static void image_facts(struct agent *a, struct cache *c, const struct job *j)
{
	snprintf(c->image_digest, sizeof(c->image_digest), "%s", j->digest);
	if (j->want_targets_from_tree) {
		/* targets come from the tree: pull first, then check */
		c->targets_need_pull = true;
		c->image = IMG_FETCHING;
		agent_want(a, c, PULL_SCHED_PULL);
	} else {
		c->image = IMG_READY;
		cJSON_Delete(c->targets);
		c->targets = cJSON_Duplicate(j->targets, 1);
	}
	agent_enqueue(a, c->key, 0);
}

/* An image's configuration is content (its digest pins it): one read serves
 * every cache of the digest still waiting to read it. What it says about a
 * source does not: a failure is its own cache's, and the others read it
 * through their own references; each still pulls through its own. */
static void fetch_image_done(struct loop *l, void *ud)
{
	struct job *j = ud;
	struct agent *a = j->a;
	struct attempt *att;
	(void)l;
	struct cache *c = job_end(j, &att);
	if (c && j->rc) {
		agent_count_error("image");
	} else if (c) {
		image_facts(a, c, j);
		for (struct cache *o = a->caches; o; o = o->next) {
			if (o == c || strcmp(o->digest, j->digest) != 0 || !o->fetch.job.queued ||
			    o->fetch.failures || !same_access(a, c, o))
				continue;
			pull_sched_cancel(a->sched, &o->fetch.job);
			image_facts(a, o, j);
		}
	}
	job_free(j);
}

/* A pull of c through ref succeeded (its job's, or a kept check's). */
static void cache_pulled(struct agent *a, struct cache *c, const char *ref,
                         const char *store_digest, const char *verified_by, bool present,
                         const cJSON *targets)
{
	/* a digest the store already held counts as a hit when it is linked */
	c->extracted = !present;
	snprintf(c->store_digest, sizeof(c->store_digest), "%s", store_digest);
	snprintf(c->verified_ref, sizeof(c->verified_ref), "%s", ref);
	snprintf(c->verified_by, sizeof(c->verified_by), "%s", verified_by);
	if (c->targets_need_pull) {
		c->targets_need_pull = false;
		c->image = IMG_READY;
		cJSON_Delete(c->targets);
		c->targets = targets ? cJSON_Duplicate(targets, 1) : cJSON_CreateArray();
	}
	agent_enqueue(a, c->key, 0);
}

static void count_shared(const char *key, const char *ref, const char *by)
{
	metrics_add(agent_m.pulls, METRICS_L("present"), 1);
	metrics_add(agent_m.source_checks, METRICS_L("shared"), 1);
	log_debug("source check shared", "cache", key, "image", ref, "by", by);
}

static void pull_done(struct loop *l, void *ud)
{
	struct job *j = ud;
	struct agent *a = j->a;
	struct attempt *att;
	(void)l;
	metrics_add(agent_m.pulling, NULL, -1);
	if (j->shared && !a->stopping) {
		count_shared(j->key, j->ref, j->verified_by);
	} else if (!a->stopping) { /* a pull cut short by the shutdown did not fail */
		metrics_add(agent_m.pulls,
		            METRICS_L(j->rc        ? "failed"
		                      : j->present ? "present"
		                                   : "pulled"),
		            1);
		if (j->checked)
			metrics_add(agent_m.source_checks, METRICS_L("checked"), 1);
	}
	if (!j->rc && !j->present) {
		metrics_add(agent_m.pull_bytes, NULL, (double)j->bytes);
		metrics_observe(agent_m.extract_s, NULL, j->seconds);
	}
	if (j->rc && !a->stopping)
		agent_count_error("pull");
	struct cache *c = job_end(j, &att);
	if (c && j->room_bytes)
		agent_budget_need(a, c->key, j->room_bytes, j->room); /* evict to make room */
	if (c && !j->rc)
		cache_pulled(a, c, j->ref, j->store_digest, j->verified_by, j->present, j->targets);
	job_free(j);
}

/* A pull of c that a kept check serves on the loop, with no job: its
 * credentials are known without reading a Secret (for one that names
 * Secrets the job reads them, and looks for a check then), and its targets
 * do not have to be read from the tree. */
static bool pull_served(struct agent *a, struct cache *c)
{
	struct pull_secret_ref sr;
	const char *creds;
	char key[CHECK_KEY_MAX];
	struct source_check sc;
	struct store_entry_info info;
	if (c->pin_rc || c->targets_need_pull)
		return false;
	pull_secret_ref_of(c->obj, a->o.namespace_, a->o.global_credentials, &sr);
	if (!pull_secret_ref_key(&sr, &creds))
		return false;
	check_key(c->ref, creds, a->trust, key);
	if (!check_find(a, key, &sc, &info))
		return false;
	pull_sched_done(a->sched, &c->pull.job, PULL_SCHED_OK, loop_now_ms());
	count_shared(c->key, c->ref, sc.verified_by);
	agent_attempt_reset(a, &c->pull);
	cache_pulled(a, c, c->ref, sc.store_digest, sc.verified_by, true, NULL);
	return true;
}

/* A job of c, with copies of what it needs (it runs on another thread). */
static struct job *job_new(struct agent *a, const struct cache *c, enum pull_sched_lane lane)
{
	struct job *j = calloc(1, sizeof(*j));
	if (!j || (!c->pin_rc && oci_ref_copy(&c->pin, &j->pin) != 0)) {
		free(j);
		return NULL;
	}
	j->a = a;
	j->lane = lane;
	snprintf(j->key, sizeof(j->key), "%s", c->key);
	snprintf(j->ref, sizeof(j->ref), "%s", c->ref);
	j->pin_rc = c->pin_rc;
	snprintf(j->pin_err, sizeof(j->pin_err), "%s", c->pin_err);
	snprintf(j->digest, sizeof(j->digest), "%s", c->digest);
	j->want_targets_from_tree = c->targets_need_pull;
	pull_secret_ref_of(c->obj, a->o.namespace_, a->o.global_credentials, &j->secrets);
	j->trust = a->trust ? trust_ref(a->trust) : NULL;
	return j;
}

static void start_job(struct agent *a, struct cache *c, enum pull_sched_lane lane)
{
	if (lane == PULL_SCHED_PULL && pull_served(a, c))
		return;
	struct job *j = job_new(a, c, lane);
	struct attempt *att = lane == PULL_SCHED_FETCH ? &c->fetch : &c->pull;
	if (j && workers_submit(a->pool, lane == PULL_SCHED_FETCH ? fetch_image_work : pull_work,
	                        lane == PULL_SCHED_FETCH ? fetch_image_done : pull_done, j) == 0) {
		a->jobs++;
		if (lane != PULL_SCHED_FETCH) {
			metrics_add(agent_m.pulling, NULL, 1);
			log_info("pull started", "cache", c->key, "digest", c->digest);
		}
		return;
	}
	if (j) {
		trust_unref(j->trust);
		oci_ref_clear(&j->pin);
	}
	free(j);
	pull_sched_done(a->sched, &att->job, PULL_SCHED_OK, loop_now_ms());
	agent_enqueue(a, c->key, PULL_BACKOFF_MS); /* out of memory: ask again later */
}

/* A pull waits while another cache extracts the same digest (the store's
 * lock would hold its slot), and while another cache checks the same source
 * with the same credentials (its check will likely serve this one too);
 * once the digest is in the store, caches of other sources verify their own
 * references for it at once. A configuration read waits while another
 * cache reads the same digest's (fetch_image_done). */
static bool may_start(struct pull_sched_job *sj, void *ud)
{
	struct agent *a = ud;
	const struct cache *c = cache_of(sj);
	bool pull = sj->lane == PULL_SCHED_PULL;
	for (const struct cache *o = a->caches; o; o = o->next) {
		const struct attempt *att = pull ? &o->pull : &o->fetch;
		if (o == c || !att->job.running || strcmp(o->digest, c->digest) != 0)
			continue;
		if (!pull)
			return false; /* a read of the same configuration serves this one too */
		if ((!strcmp(o->ref, c->ref) && same_access(a, c, o)) ||
		    store_lookup(a->store, c->digest, NULL) != 0)
			return false;
	}
	return true;
}

/* Start what may start, and come back when a host's backoff ends. */
void agent_schedule(struct agent *a)
{
	if (a->stopping)
		return;
	uint64_t now = loop_now_ms();
	for (int l = 0; l < PULL_SCHED_LANES; l++) {
		struct pull_sched_job *sj;
		while ((sj = pull_sched_next(a->sched, l, now, may_start, a)) != NULL)
			start_job(a, cache_of(sj), l);
	}
	uint64_t due = pull_sched_next_due(a->sched);
	if (a->sched_timer && a->sched_at == due)
		return;
	if (a->sched_timer)
		loop_cancel_timer(a->loop, a->sched_timer);
	a->sched_timer = 0;
	if (due != UINT64_MAX) {
		a->sched_timer = loop_add_timer(a->loop, due > now ? due - now : 0, sched_tick, a);
		a->sched_at = due;
	}
}

/* The policy asked for this job: queue it, unless it is queued or running
 * already, or its last failure waits for its backoff (come back then) or,
 * being permanent, for a change. */
void agent_want(struct agent *a, struct cache *c, enum pull_sched_lane lane)
{
	struct attempt *att = lane == PULL_SCHED_FETCH ? &c->fetch : &c->pull;
	uint64_t now = loop_now_ms();
	if (att->job.queued || att->job.running || !*c->ref)
		return;
	if (att->failures && att->permanent && !att->recheck)
		return;
	if (att->failures && att->retry_at > now) {
		agent_enqueue(a, c->key, att->retry_at - now);
		return;
	}
	if (pull_sched_queue(a->sched, &att->job, c->host, lane) != 0)
		agent_enqueue(a, c->key, PULL_BACKOFF_MS);
	att->recheck = false;
}
