#include "agent.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "cache_view.h"
#include "compat_targets.h"
#include "fallback_notice.h"
#include "gpu_sources.h"
#include "kube_workqueue.h"
#include "local_model.h"
#include "log.h"
#include "metrics.h"
#include "node_capture.h"
#include "oci_pull.h"
#include "oci_ref.h"
#include "pull_sched.h"
#include "pull_secret.h"
#include "soon_timer.h"
#include "store.h"

#define MANAGER_PREFIX "gkm-agent/"
/* retries of a cache's failed image read or pull, and of a failed node
 * status write (which starts at the status debounce) */
#define PULL_BACKOFF_MS 1000
#define PULL_BACKOFF_MAX_MS 300000
#define STATUS_BACKOFF_MAX_MS 60000
/* looking for this node's Node again, while it cannot be read */
#define NODE_LOOKUP_BACKOFF_MS 5000
#define NODE_LOOKUP_BACKOFF_MAX_MS 60000
/* image configurations read at once (small requests); pulls: --max-pulls */
#define FETCH_SLOTS 4
/* how often the usage files of the CSI plugin are checked for changes */
#define USAGE_POLL_MS 1000

enum image_state { IMG_UNKNOWN = 0, IMG_FETCHING, IMG_READY };

/* One kind of registry job of one cache: reading its image configuration, or
 * pulling it (verified through the cache's own reference). A failure stays
 * reported until a try succeeds; the next try waits out its backoff holding
 * no slot, and a permanent failure waits for a change (the image, its
 * reference, the policies) instead of a timer. */
struct attempt {
	struct pull_sched_job job; /* queued or running in the scheduler */
	unsigned failures;         /* in a row; 0 once a try succeeded */
	bool permanent;            /* trying again cannot change the outcome */
	bool recheck;              /* something changed: one more try of a permanent failure */
	uint64_t retry_at;         /* loop ms: no try before */
	char retry_time[32];       /* the same in RFC 3339, for the report */
	char reason[64], message[512];
};

/* What the agent knows about one cache on this node. Loop thread only. */
/* The node's record of a cache (ready.json), as far as this run knows. */
enum record_state {
	REC_UNKNOWN, /* not written by this run, or removed */
	REC_READY,   /* Ready, written with the view (do_link) */
	REC_OTHER,   /* another state: what c->entry says */
};

struct cache {
	struct cache *next;
	char key[320]; /* "<scope>/<name>": scope is the namespace or "_cluster" */
	char ns[64];   /* "" for cluster-scoped */
	char name[256];
	cJSON *obj;      /* the cache object, NULL once deleted */
	char ref[700];   /* image reference pinned to the digest ("" without one) */
	char host[256];  /* the registry host of ref, for fair slots */
	char digest[80]; /* resolved digest, "" if none yet */

	enum image_state image;
	char image_digest[80];  /* the digest the image facts are about */
	cJSON *targets;         /* compat targets, when IMG_READY */
	bool targets_need_pull; /* no label: read targets from the extracted tree */
	struct attempt fetch;   /* reading the image configuration */

	struct attempt pull;    /* pulling and verifying through ref */
	char verified_ref[700]; /* the reference a pull of this cache last succeeded through */
	char verified_by[80];   /* the trusted key that verified it then ("" when none did) */
	char store_digest[80];  /* manifest digest the store holds for digest */

	char view_digest[80];     /* what the published view names ("" if none) */
	enum record_state record; /* what this agent last wrote to ready.json */
	cJSON *entry;             /* last node status entry, NULL if none */
	bool extracted;           /* a pull of this cache extracted digest: its link is no hit */
	struct cache_view_usage_stamp usage_seen; /* the usage file the usage pass last saw */
	/* a LocalModelCache's kernel cache (local_model.h): not for this node
	 * (handled as deleted here), and where its tree was placed */
	bool away;
	char *placed, placed_name[254], placed_digest[80];
	cJSON *captures; /* what captures of pods' volumes gave here (node_capture.h) */
	cJSON *live;     /* live volumes a capture on demand still has to take */
	char *demand;    /* the gkm.io/capture value last handled (NULL: not read yet) */
};

/* One node object: ClusterGKMCacheNode (ns "") or GKMCacheNode in ns. */
struct nodeobj {
	struct nodeobj *next;
	char ns[64];
	bool dirty, writing, created;
	unsigned failures;         /* status writes failed in a row */
	uint64_t write_not_before; /* backoff after a failure (loop ms) */
	char warned_uid[64];       /* the object told by an Event that the Node is missing */
};

struct agent {
	struct loop *loop;
	struct workers *workers; /* status writes, clean-up */
	struct workers *pool;    /* registry jobs, as many threads as slots */
	struct pull_sched *sched;
	struct oci_registry_opts reg; /* the daemon's, without in-request retries */
	atomic_bool cancel;           /* shutting down: registry transfers end */
	pthread_mutex_t clients_lock;
	struct client *clients; /* idle registry clients (registry jobs) */
	uint64_t clients_timer; /* drops them once no job ended for a while */
	struct objstore *os;
	struct engine_slot *policies;
	struct agent_opts o;
	struct trust *trust; /* referenced; registry jobs take their own reference */
	char node[254], root[512], run_dir[512], manager[300];
	struct store *store;
	struct kube_workqueue *queue;
	struct cache *caches;
	struct fallback_notice *notice; /* Events on pods given a fallback volume */
	struct nodeobj *nodeobjs;
	cJSON *gpus; /* the probe JSON ({"gpus": [...], "groups": [...]}) */
	uint64_t kick_timer, resync_timer, probe_timer, sched_timer, usage_timer;
	struct soon_timer status_timer; /* the debounced node status flush */
	uint64_t sched_at;              /* when sched_timer fires (loop ms) */
	uint64_t seed;                  /* for backoff jitter */
	bool synced_caches, synced_cluster, probed, stopping;
	char node_uid[64];
	cJSON *node_labels;     /* this node's Node's labels, once read */
	int node_rc;            /* reading this node's Node: 0, -ENOENT, -EACCES, ... */
	char node_err[256];     /* why it cannot be read */
	char node_since[32];    /* when node_rc last changed */
	unsigned node_failures; /* lookups failed in a row */
	uint64_t node_timer;    /* the next lookup while it fails */
	unsigned jobs;          /* worker jobs in flight that point at this agent */
	bool gc_running, gc_again;
	bool capturing; /* a capture job runs (one at a time) */
};

static struct metric *m_reconciles, *m_errors, *m_pulls, *m_pull_bytes, *m_hits, *m_verdicts,
    *m_extract_s, *m_node_found, *m_rewritten;

/* kind: policy, gpu_probe, image, pull, view, status_write, node_lookup */
static void count_error(const char *kind)
{
	metrics_add(m_errors, METRICS_L(kind), 1);
}

static void init_metrics(void)
{
	static const double secs[] = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
	m_reconciles = metrics_counter("gkm_agent_reconciles_total",
	                               "Agent reconciles of a cache, by result", "result");
	m_errors = metrics_counter("gkm_agent_errors_total",
	                           "Agent failures, by kind (policy, gpu_probe, image, pull, view, "
	                           "status_write, node_lookup)",
	                           "kind");
	m_pulls =
	    metrics_counter("gkm_pulls_total", "Image pulls into the store, by result", "result");
	m_pull_bytes = metrics_counter("gkm_pull_bytes_total",
	                               "Bytes of extracted cache trees written to the store", NULL);
	m_hits = metrics_counter("gkm_cache_hits_total",
	                         "Caches made ready from a digest already in the store", NULL);
	m_verdicts = metrics_counter("gkm_compat_verdicts_total",
	                             "Compatibility verdicts per GPU, by reason", "reason");
	m_extract_s =
	    metrics_histogram("gkm_extraction_seconds", "Time to pull, verify and extract an image",
	                      NULL, secs, sizeof(secs) / sizeof(secs[0]));
	m_node_found = metrics_gauge(
	    "gkm_agent_node_found",
	    "1 when the agent can read its Node (which owns its node objects), 0 when it cannot "
	    "(no such Node, or RBAC; always 0 in gkm up, which has none); see the NodeFound "
	    "condition of its node objects",
	    NULL);
	m_rewritten = metrics_counter(
	    "gkm_agent_node_objects_rewritten_total",
	    "This node's objects written again after something else deleted them (the operator "
	    "deletes the objects of a node whose Node it cannot find)",
	    NULL);
	/* unlabelled series exist from the start, so a scrape shows them at 0 */
	metrics_add(m_pull_bytes, NULL, 0);
	metrics_add(m_hits, NULL, 0);
	metrics_add(m_rewritten, NULL, 0);
}

/* ---- caches ---- */

static struct cache *find_cache(struct agent *a, const char *key)
{
	for (struct cache *c = a->caches; c; c = c->next)
		if (!strcmp(c->key, key))
			return c;
	return NULL;
}

static void cache_free(struct cache *c)
{
	cJSON_Delete(c->obj);
	cJSON_Delete(c->targets);
	cJSON_Delete(c->entry);
	cJSON_Delete(c->captures);
	cJSON_Delete(c->live);
	free(c->demand);
	free(c->placed);
	free(c);
}

/* Only once no job of c runs: a running job's completion needs it. */
static void forget_cache(struct agent *a, struct cache *c)
{
	pull_sched_cancel(a->sched, &c->fetch.job);
	pull_sched_cancel(a->sched, &c->pull.job);
	node_capture_forget(a->root, c->ns, c->name);
	for (struct cache **p = &a->caches; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			cache_free(c);
			return;
		}
	}
}

/* A new digest or reference: what the old one did or failed says nothing
 * about it. A job still running ends on its own and is then ignored. */
static void attempt_reset(struct agent *a, struct attempt *att)
{
	pull_sched_cancel(a->sched, &att->job);
	att->failures = 0;
	att->permanent = att->recheck = false;
	att->retry_at = 0;
	att->retry_time[0] = att->reason[0] = att->message[0] = '\0';
}

static void kick(struct agent *a);

static void enqueue(struct agent *a, const char *key, uint64_t delay_ms)
{
	if (delay_ms)
		kube_workqueue_add_after(a->queue, key, delay_ms, loop_now_ms());
	else
		kube_workqueue_add(a->queue, key);
	kick(a);
}

static void enqueue_all(struct agent *a)
{
	for (struct cache *c = a->caches; c; c = c->next)
		kube_workqueue_add(a->queue, c->key);
	kick(a);
}

/* The digest to use: the webhook's annotation, else what the operator resolved. */
static const char *cache_digest(const cJSON *obj)
{
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "annotations");
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(ann, "gkm.io/resolvedDigest");
	if (cJSON_IsString(d) && cache_view_valid_digest(d->valuestring))
		return d->valuestring;
	const char *s = obj_str(obj, "status.resolvedDigest");
	return cache_view_valid_digest(s) ? s : "";
}

/* The API host of a reference (fair slots are per host); "" if unparsable. */
static void ref_host(const char *refstr, char *out, size_t len)
{
	struct oci_ref ref;
	struct oci_err e;
	memset(&ref, 0, sizeof(ref));
	memset(&e, 0, sizeof(e));
	out[0] = '\0';
	if (oci_ref_parse(refstr, &ref, &e) == 0)
		snprintf(out, len, "%s",
		         ref.kind == OCI_REF_REGISTRY ? oci_ref_api_host(&ref) : "oci-layout");
	oci_ref_clear(&ref);
}

/* "repo@digest": the agent pulls by digest only, never by tag. */
static void pin_ref(const char *image, const char *digest, char *out, size_t len)
{
	char base[600];
	snprintf(base, sizeof(base), "%s", image);
	char *at = strchr(base, '@');
	if (at)
		*at = '\0';
	/* drop a tag (a ':' after the last '/') */
	char *slash = strrchr(base, '/');
	char *colon = strrchr(base, ':');
	if (colon && (!slash || colon > slash))
		*colon = '\0';
	snprintf(out, len, "%s@%s", base, digest);
}

static bool user_edited(const cJSON *before, const cJSON *after)
{
	static const char *const paths[][2] = {{"metadata", "generation"},
	                                       {"metadata", "annotations"}};
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		const cJSON *x = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(before, paths[i][0]), paths[i][1]);
		const cJSON *y = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(after, paths[i][0]), paths[i][1]);
		if (!(x ? y && cJSON_Compare(x, y, 1) : !y))
			return true;
	}
	return false;
}

/* One more try for a failure that only a change can fix. */
static void recheck_permanent(struct cache *c)
{
	c->fetch.recheck = c->fetch.failures && c->fetch.permanent;
	c->pull.recheck = c->pull.failures && c->pull.permanent;
}

/* A LocalModelCache's kernel cache whose node groups leave this node out
 * (or before the Node's labels are known). */
static bool local_model_away(const struct agent *a, const cJSON *obj)
{
	char path[PATH_MAX];
	return *local_model_name(obj) &&
	       !local_model_here(obj, a->node, a->node_labels, path, sizeof(path));
}

/* Whether what verified c's digest is still trusted (always, when nothing
 * is verified on the node). */
static bool still_trusted(const struct agent *a, const struct cache *c)
{
	if (!a->trust || !a->trust->s.verify_enabled)
		return true;
	return c->verified_by[0] && sig_keyset_has(a->trust->keys, c->verified_by);
}

static void on_cache_event(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct agent *a = ud;
	char key[320];
	const char *ns = obj_str(obj, "metadata.namespace"), *name = obj_str(obj, "metadata.name");
	if (!cache_view_valid_name(name) || (*ns && !cache_view_valid_namespace(ns)))
		return;
	snprintf(key, sizeof(key), "%s/%s", *ns ? ns : CACHE_VIEW_CLUSTER, name);
	struct cache *c = find_cache(a, key);
	bool created = !c;
	if (!c) {
		if (t == OBJSTORE_DELETED)
			return;
		c = calloc(1, sizeof(*c));
		if (!c)
			return;
		snprintf(c->key, sizeof(c->key), "%s", key);
		snprintf(c->ns, sizeof(c->ns), "%s", ns);
		snprintf(c->name, sizeof(c->name), "%s", name);
		/* after a restart the view tells what was linked and ready before */
		char linked[CACHE_VIEW_DIGEST_LEN + 1];
		struct cache_view_ready r;
		if (cache_view_linked_digest(a->root, ns, name, linked) == 0)
			snprintf(c->view_digest, sizeof(c->view_digest), "%s", linked);
		if (cache_view_ready_read(a->root, ns, name, &r, NULL, 0) == 0) {
			c->record = strcmp(r.state, "Ready") ? REC_UNKNOWN : REC_READY;
			snprintf(c->verified_by, sizeof(c->verified_by), "%s", r.verified_by);
			cache_view_ready_free(&r);
		}
		c->captures = node_capture_records_load(a->root, ns, name);
		c->next = a->caches;
		a->caches = c;
	}
	/* a user's edit (spec or annotations: `kubectl annotate gkmc NAME
	 * gkm.io/recheck=...`) is a change a permanent failure waits for, e.g.
	 * after the image was signed; the status the operator writes is not */
	if (c->obj && t != OBJSTORE_DELETED && user_edited(c->obj, obj))
		recheck_permanent(c);
	cJSON_Delete(c->obj);
	c->obj = t == OBJSTORE_DELETED ? NULL : cJSON_Duplicate(obj, 1);
	c->away = c->obj && local_model_away(a, c->obj);
	if (!c->obj || c->away) {
		pull_sched_cancel(a->sched, &c->fetch.job);
		pull_sched_cancel(a->sched, &c->pull.job);
	} else {
		const char *d = cache_digest(obj);
		char ref[sizeof(c->ref)] = "";
		if (*d)
			pin_ref(obj_str(obj, "spec.image"), d, ref, sizeof(ref));
		if (strcmp(d, c->digest) != 0) {
			snprintf(c->digest, sizeof(c->digest), "%s", d);
			c->image = IMG_UNKNOWN;
			c->targets_need_pull = false;
			attempt_reset(a, &c->fetch);
		}
		if (strcmp(ref, c->ref) != 0) {
			snprintf(c->ref, sizeof(c->ref), "%s", ref);
			ref_host(ref, c->host, sizeof(c->host));
			attempt_reset(a, &c->pull);
		}
		/* after a restart: the view was published only once a pull of
		 * this cache had verified the digest through its own reference
		 * (with a key still trusted) */
		if (created && *d && !strcmp(c->view_digest, d) && still_trusted(a, c))
			snprintf(c->verified_ref, sizeof(c->verified_ref), "%s", ref);
	}
	enqueue(a, key, 0);
}

/* ---- registry jobs ---- */

/* Every cache reads its image and pulls through its own reference: the
 * store shares content between caches of one digest, never a verdict or a
 * source (another cache's signature does not vouch for this one, another
 * cache's dead registry does not fail it). Jobs wait in the scheduler
 * (pull_sched.h) for a slot of their registry host and run on the agent's
 * own threads. */

struct job {
	struct agent *a;
	enum pull_sched_lane lane;
	char key[320];
	char ref[700];
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

static void clients_drop_idle(struct loop *l, void *ud)
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
	struct oci_ref ref;
	struct oci_repo *repo = NULL;
	struct client *client = NULL;
	struct oci_image img;
	struct oci_err e;
	char err[512];
	memset(&ref, 0, sizeof(ref));
	memset(&img, 0, sizeof(img));
	memset(&e, 0, sizeof(e));
	struct pull_secret ps;
	struct oci_registry_opts opts;
	memset(&ps, 0, sizeof(ps));
	int rc = oci_ref_parse(j->ref, &ref, &e);
	if (!rc && (rc = job_registry(j, &ref, &ps, &opts)))
		goto out;
	if (!rc)
		rc = job_repo(j, &ref, &ps, &opts, &client, &repo, &e);
	if (!rc)
		rc = oci_repo_fetch_image(repo, oci_ref_reference(&ref), NULL, &img, &e);
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
	oci_ref_clear(&ref);
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

/* Pull through this cache's reference: its signatures are verified even when
 * the store already holds the digest (then nothing else is downloaded). */
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
	                          .verdict = &verdict};
	struct oci_ref ref;
	struct pull_secret ps;
	struct client *client = NULL;
	memset(&e, 0, sizeof(e));
	memset(&ref, 0, sizeof(ref));
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
	int rc = oci_ref_parse(j->ref, &ref, &e);
	if (rc == 0 && job_registry(j, &ref, &ps, &opts) != 0) {
		oci_ref_clear(&ref);
		return;
	}
	if (rc == 0 && ref.kind == OCI_REF_REGISTRY)
		client = client_take(j->a, oci_ref_api_host(&ref), ps.key, &opts);
	oci_ref_clear(&ref);
	o.client = client ? client->reg : NULL;
	uint64_t t0 = loop_now_ms();
	/* the cache's own credentials reach its own source (manifest and
	 * config) before any byte of the store is handed to it */
	rc = oci_pull_to_store(j->a->store, j->ref, &o, NULL, j->store_digest, &info, &j->present,
	                       &e);
	j->seconds = (double)(loop_now_ms() - t0) / 1000.0;
	client_give(j->a, client, rc == 0);
	pull_secret_clear(&ps);
	if (rc) {
		job_fail(j, rc, pull_reason(rc), oci_err_str(&e, rc));
		return;
	}
	j->bytes = info.bytes;
	if (verdict.accepted)
		snprintf(j->verified_by, sizeof(j->verified_by), "%s", verdict.key_fingerprint);
	if (j->want_targets_from_tree) {
		char path[1024], err[512];
		if (store_entry_path(j->a->store, j->store_digest, path, sizeof(path)) == 0) {
			rc = compat_targets_from_dir(path, &j->targets, err, sizeof(err));
			if (rc && rc != -ENOENT)
				log_warn("cannot read cache targets", "digest", j->digest, "error",
				         err);
		}
	}
}

static struct cache *cache_of(struct pull_sched_job *sj)
{
	size_t off = sj->lane == PULL_SCHED_FETCH ? offsetof(struct cache, fetch.job)
	                                          : offsetof(struct cache, pull.job);
	return (struct cache *)(void *)((char *)sj - off);
}

static void schedule(struct agent *a);

static void sched_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	a->sched_timer = 0;
	schedule(a);
}

/* When now + delay_ms will be, in RFC 3339. */
static void wall_time_in(uint64_t delay_ms, char *buf, size_t len)
{
	time_t t = time(NULL) + (time_t)((delay_ms + 999) / 1000);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
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
	enqueue(a, c->key, 0);
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
	struct cache *c = find_cache(a, j->key); /* kept while its job runs */
	if (!c)
		return NULL;
	struct attempt *att = j->lane == PULL_SCHED_FETCH ? &c->fetch : &c->pull;
	bool down = unreachable(j->rc);
	pull_sched_done(a->sched, &att->job, down ? PULL_SCHED_UNREACHABLE : PULL_SCHED_OK,
	                loop_now_ms());
	if (down)
		host_failed(a, j, att->job.host);
	if (strcmp(c->ref, j->ref) != 0) {
		enqueue(a, c->key, 0);
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
		attempt_reset(a, att);
	}
	*att_out = att;
	return c;
}

static void job_free(struct job *j)
{
	struct agent *a = j->a;
	trust_unref(j->trust);
	cJSON_Delete(j->targets);
	free(j);
	if (a->clients_timer)
		loop_cancel_timer(a->loop, a->clients_timer);
	a->clients_timer =
	    a->stopping ? 0 : loop_add_timer(a->loop, CLIENT_IDLE_MS, clients_drop_idle, a);
	schedule(a);
}

static void want(struct agent *a, struct cache *c, enum pull_sched_lane lane);

static void image_facts(struct agent *a, struct cache *c, const struct job *j)
{
	snprintf(c->image_digest, sizeof(c->image_digest), "%s", j->digest);
	if (j->want_targets_from_tree) {
		/* targets come from the tree: pull first, then check */
		c->targets_need_pull = true;
		c->image = IMG_FETCHING;
		want(a, c, PULL_SCHED_PULL);
	} else {
		c->image = IMG_READY;
		cJSON_Delete(c->targets);
		c->targets = cJSON_Duplicate(j->targets, 1);
	}
	enqueue(a, c->key, 0);
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
		count_error("image");
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

static void pull_done(struct loop *l, void *ud)
{
	struct job *j = ud;
	struct agent *a = j->a;
	struct attempt *att;
	(void)l;
	if (!a->stopping) /* a pull cut short by the shutdown did not fail */
		metrics_add(m_pulls,
		            METRICS_L(j->rc        ? "failed"
		                      : j->present ? "present"
		                                   : "pulled"),
		            1);
	if (!j->rc && !j->present) {
		metrics_add(m_pull_bytes, NULL, (double)j->bytes);
		metrics_observe(m_extract_s, NULL, j->seconds);
	}
	if (j->rc && !a->stopping)
		count_error("pull");
	struct cache *c = job_end(j, &att);
	if (c && !j->rc) {
		/* a digest the store already held counts as a hit when it is linked */
		c->extracted = !j->present;
		snprintf(c->store_digest, sizeof(c->store_digest), "%s", j->store_digest);
		snprintf(c->verified_ref, sizeof(c->verified_ref), "%s", j->ref);
		snprintf(c->verified_by, sizeof(c->verified_by), "%s", j->verified_by);
		if (c->targets_need_pull) {
			c->targets_need_pull = false;
			c->image = IMG_READY;
			cJSON_Delete(c->targets);
			c->targets =
			    j->targets ? cJSON_Duplicate(j->targets, 1) : cJSON_CreateArray();
		}
		enqueue(a, c->key, 0);
	}
	job_free(j);
}

static void start_job(struct agent *a, struct cache *c, enum pull_sched_lane lane)
{
	struct job *j = calloc(1, sizeof(*j));
	struct attempt *att = lane == PULL_SCHED_FETCH ? &c->fetch : &c->pull;
	if (j) {
		j->a = a;
		j->lane = lane;
		snprintf(j->key, sizeof(j->key), "%s", c->key);
		snprintf(j->ref, sizeof(j->ref), "%s", c->ref);
		snprintf(j->digest, sizeof(j->digest), "%s", c->digest);
		j->want_targets_from_tree = c->targets_need_pull;
		pull_secret_ref_of(c->obj, a->o.namespace_, a->o.global_credentials, &j->secrets);
		j->trust = a->trust ? trust_ref(a->trust) : NULL;
	}
	if (j && workers_submit(a->pool, lane == PULL_SCHED_FETCH ? fetch_image_work : pull_work,
	                        lane == PULL_SCHED_FETCH ? fetch_image_done : pull_done, j) == 0) {
		a->jobs++;
		return;
	}
	if (j)
		trust_unref(j->trust);
	free(j);
	pull_sched_done(a->sched, &att->job, PULL_SCHED_OK, loop_now_ms());
	enqueue(a, c->key, PULL_BACKOFF_MS); /* out of memory: ask again later */
}

/* A pull waits while another cache extracts the same digest (the store's
 * lock would hold its slot); once the digest is in the store, any number of
 * caches verify their own references for it at once. A configuration read
 * waits while another cache reads the same digest's (fetch_image_done). */
static bool may_start(struct pull_sched_job *sj, void *ud)
{
	struct agent *a = ud;
	const struct cache *c = cache_of(sj);
	bool pull = sj->lane == PULL_SCHED_PULL;
	for (const struct cache *o = a->caches; o; o = o->next) {
		const struct attempt *att = pull ? &o->pull : &o->fetch;
		if (o != c && att->job.running && !strcmp(o->digest, c->digest))
			/* a read of the same configuration serves this one too */
			return pull && store_lookup(a->store, c->digest, NULL) == 0;
	}
	return true;
}

/* Start what may start, and come back when a host's backoff ends. */
static void schedule(struct agent *a)
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
static void want(struct agent *a, struct cache *c, enum pull_sched_lane lane)
{
	struct attempt *att = lane == PULL_SCHED_FETCH ? &c->fetch : &c->pull;
	uint64_t now = loop_now_ms();
	if (att->job.queued || att->job.running || !*c->ref)
		return;
	if (att->failures && att->permanent && !att->recheck)
		return;
	if (att->failures && att->retry_at > now) {
		enqueue(a, c->key, att->retry_at - now);
		return;
	}
	if (pull_sched_queue(a->sched, &att->job, c->host, lane) != 0)
		enqueue(a, c->key, PULL_BACKOFF_MS);
	att->recheck = false;
}

/* ---- node status ---- */

static struct nodeobj *find_nodeobj(struct agent *a, const char *ns)
{
	for (struct nodeobj *n = a->nodeobjs; n; n = n->next)
		if (!strcmp(n->ns, ns))
			return n;
	return NULL;
}

static struct nodeobj *nodeobj_for(struct agent *a, const char *ns)
{
	struct nodeobj *n = find_nodeobj(a, ns);
	if (n)
		return n;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	snprintf(n->ns, sizeof(n->ns), "%s", ns);
	n->next = a->nodeobjs;
	a->nodeobjs = n;
	return n;
}

static void mark_dirty(struct agent *a, const char *ns)
{
	struct nodeobj *n = nodeobj_for(a, ns);
	if (!n)
		return;
	n->dirty = true;
	soon_timer_arm(&a->status_timer, a->o.status_debounce_ms);
}

/* One of this node's objects was deleted (by hand, or with its namespace):
 * write it again while caches of its namespace report on this node (the
 * cluster-scoped one always); otherwise it is created when one appears. */
static void on_nodeobj_event(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct agent *a = ud;
	const char *ns = obj_str(obj, "metadata.namespace");
	struct nodeobj *n = find_nodeobj(a, ns);
	if (t != OBJSTORE_DELETED || a->stopping || !n ||
	    strcmp(obj_str(obj, "metadata.name"), a->node) != 0)
		return;
	n->created = false;
	bool reported = !*ns;
	for (struct cache *c = a->caches; c && !reported; c = c->next)
		reported = c->entry && !strcmp(c->ns, ns);
	if (reported) {
		metrics_add(m_rewritten, NULL, 1);
		if (a->node_rc == -ENOENT)
			log_warn(
			    "this node's object was deleted (the operator deletes the objects of "
			    "nodes it cannot find, and there is no Node of this name); writing "
			    "it again",
			    "node", a->node, "namespace", ns);
		else
			log_info("this node's object was deleted; writing it again", "node",
			         a->node, "namespace", ns);
		mark_dirty(a, ns);
	}
}

struct status_job {
	struct agent *a;
	struct nodeobj *n;
	cJSON *obj, *status;
	int rc;
	char err[512];
	/* the Node cannot be read: an Event on each new incarnation of the object */
	char warn_reason[32], warn_message[1024], warned_uid[64];
};

/* The NodeFound condition: can this agent read its Node? (Kubernetes only) */
static void node_condition(const struct agent *a, char *status, size_t slen, char *reason,
                           size_t rlen, char *message, size_t mlen)
{
	const char *st = "Unknown", *why = "NodeLookupFailed";
	switch (a->node_rc) {
	case 0:
		st = "True";
		why = "Found";
		snprintf(message, mlen, "Node %s owns this object (uid %s)", a->node, a->node_uid);
		break;
	case -ENOENT:
		st = "False";
		why = "NodeNotFound";
		snprintf(message, mlen,
		         "there is no Node named %s: the operator deletes node objects of nodes it "
		         "cannot find, and this agent writes them again; set the agent's --node "
		         "(NODE_NAME, from spec.nodeName) to its Kubernetes node name",
		         a->node);
		break;
	case -EACCES:
		why = "NodeForbidden";
		snprintf(message, mlen,
		         "the agent may not read Node %s (%s): its node objects get no owner and "
		         "are not removed with the node; give its service account get on nodes "
		         "(the chart's node ClusterRole)",
		         a->node, a->node_err);
		break;
	default:
		snprintf(message, mlen, "cannot read Node %s: %s; trying again", a->node,
		         a->node_err);
	}
	snprintf(status, slen, "%s", st);
	snprintf(reason, rlen, "%s", why);
}

/* Build the node object and its status from what the caches reported. */
static struct status_job *status_job_for(struct agent *a, struct nodeobj *n)
{
	struct status_job *sj = calloc(1, sizeof(*sj));
	if (!sj)
		return NULL;
	sj->a = a;
	sj->n = n;
	bool cluster = !*n->ns;
	cJSON *obj = cJSON_CreateObject();
	cJSON_AddStringToObject(obj, "apiVersion", GKM_API_VERSION);
	cJSON_AddStringToObject(obj, "kind", cluster ? "ClusterGKMCacheNode" : "GKMCacheNode");
	cJSON *meta = cJSON_AddObjectToObject(obj, "metadata");
	cJSON_AddStringToObject(meta, "name", a->node);
	if (!cluster)
		cJSON_AddStringToObject(meta, "namespace", n->ns);
	cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "labels"), "gkm.io/node", a->node);
	if (a->o.owner_node_refs && a->node_uid[0]) {
		cJSON *ref = cJSON_CreateObject();
		cJSON_AddStringToObject(ref, "apiVersion", "v1");
		cJSON_AddStringToObject(ref, "kind", "Node");
		cJSON_AddStringToObject(ref, "name", a->node);
		cJSON_AddStringToObject(ref, "uid", a->node_uid);
		cJSON_AddItemToArray(cJSON_AddArrayToObject(meta, "ownerReferences"), ref);
	}
	cJSON_AddStringToObject(cJSON_AddObjectToObject(obj, "spec"), "nodeName", a->node);

	cJSON *st = obj_without(obj, "spec");
	cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "metadata"),
	                                        "ownerReferences");
	cJSON *status = cJSON_AddObjectToObject(st, "status");
	cJSON *groups = cJSON_GetObjectItemCaseSensitive(a->gpus, "groups");
	cJSON_AddItemToObject(status, "gpus",
	                      groups ? cJSON_Duplicate(groups, 1) : cJSON_CreateArray());
	cJSON *caches = cJSON_AddObjectToObject(status, "caches");
	unsigned total = 0, ready = 0, failed = 0, incompatible = 0;
	for (struct cache *c = a->caches; c; c = c->next) {
		if (!c->entry || strcmp(c->ns, n->ns) != 0)
			continue;
		cJSON *e = cJSON_Duplicate(c->entry, 1);
		if (c->captures)
			cJSON_AddItemToObject(e, "captures", cJSON_Duplicate(c->captures, 1));
		cJSON_AddItemToObject(caches, c->name, e);
		const char *state = obj_str(c->entry, "state");
		total++;
		ready += !strcmp(state, "Ready");
		failed += !strcmp(state, "Failed");
		incompatible += !strcmp(state, "Incompatible"); /* not a failure */
	}
	/* the counts `kubectl get gkmcn` prints */
	cJSON_AddNumberToObject(status, "totalCaches", total);
	cJSON_AddNumberToObject(status, "readyCaches", ready);
	cJSON_AddNumberToObject(status, "failedCaches", failed);
	cJSON_AddNumberToObject(status, "incompatibleCaches", incompatible);
	char now[32];
	obj_now(now, sizeof(now));
	cJSON_AddStringToObject(status, "lastUpdated", now);
	if (a->o.owner_node_refs) {
		char cst[16], reason[32], message[1024];
		node_condition(a, cst, sizeof(cst), reason, sizeof(reason), message,
		               sizeof(message));
		cJSON *cond = cJSON_CreateObject();
		cJSON_AddStringToObject(cond, "type", "NodeFound");
		cJSON_AddStringToObject(cond, "status", cst);
		cJSON_AddStringToObject(cond, "reason", reason);
		cJSON_AddStringToObject(cond, "message", message);
		cJSON_AddStringToObject(cond, "lastTransitionTime", a->node_since);
		cJSON_AddItemToArray(cJSON_AddArrayToObject(status, "conditions"), cond);
		if (a->node_rc) {
			snprintf(sj->warn_reason, sizeof(sj->warn_reason), "%s", reason);
			snprintf(sj->warn_message, sizeof(sj->warn_message), "%s", message);
			snprintf(sj->warned_uid, sizeof(sj->warned_uid), "%s", n->warned_uid);
		}
	}
	sj->obj = n->created ? NULL : obj;
	if (n->created)
		cJSON_Delete(obj);
	/* no caches left in this namespace: no caches member (an applied {}
	 * would freeze the object, see objstore.h), which removes the entries */
	obj_drop_empty_maps(st);
	sj->status = st;
	return sj;
}

static void status_work(void *ud)
{
	struct status_job *sj = ud;
	struct objstore *os = sj->a->os;
	if (sj->obj)
		sj->rc = os->ops->apply(os, sj->obj, sj->a->manager, false, NULL, sj->err,
		                        sizeof(sj->err));
	cJSON *stored = NULL;
	if (!sj->rc)
		sj->rc = os->ops->apply(os, sj->status, sj->a->manager, true, &stored, sj->err,
		                        sizeof(sj->err));
	const char *uid = obj_str(stored, "metadata.uid");
	if (!sj->rc && sj->warn_reason[0] && *uid && strcmp(uid, sj->warned_uid) != 0) {
		os->ops->event(os, stored, "Warning", sj->warn_reason, sj->warn_message, NULL);
		snprintf(sj->warned_uid, sizeof(sj->warned_uid), "%s", uid);
	}
	cJSON_Delete(stored);
}

static void status_done(struct loop *l, void *ud)
{
	struct status_job *sj = ud;
	struct agent *a = sj->a;
	(void)l;
	a->jobs--;
	sj->n->writing = false;
	if (sj->rc) {
		count_error("status_write");
		unsigned delay = backoff_ms(sj->n->failures++, a->o.status_debounce_ms,
		                            STATUS_BACKOFF_MAX_MS, &a->seed);
		char in[24];
		snprintf(in, sizeof(in), "%.1fs", delay / 1000.0);
		log_warn("node status write failed; will retry", "node", a->node, "namespace",
		         sj->n->ns, "in", in, "error", sj->err);
		sj->n->write_not_before = loop_now_ms() + delay;
		if (sj->rc == -ENOENT) /* the object was deleted: create it again */
			sj->n->created = false;
		if (!a->stopping) {
			sj->n->dirty = true;
			soon_timer_arm(&a->status_timer, delay);
		}
	} else {
		sj->n->failures = 0;
		sj->n->write_not_before = 0;
		if (sj->obj)
			sj->n->created = true;
		if (sj->warn_reason[0])
			snprintf(sj->n->warned_uid, sizeof(sj->n->warned_uid), "%s",
			         sj->warned_uid);
	}
	cJSON_Delete(sj->obj);
	cJSON_Delete(sj->status);
	free(sj);
}

static void flush_status(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	uint64_t now = loop_now_ms();
	for (struct nodeobj *n = a->nodeobjs; n; n = n->next) {
		if (!n->dirty)
			continue;
		/* one write per object at a time, none before its backoff: retry after */
		if (n->writing || n->write_not_before > now) {
			soon_timer_arm(&a->status_timer, n->writing ? a->o.status_debounce_ms
			                                            : n->write_not_before - now);
			continue;
		}
		struct status_job *sj = status_job_for(a, n);
		if (!sj)
			continue;
		n->dirty = false;
		n->writing = true;
		a->jobs++;
		if (workers_submit(a->workers, status_work, status_done, sj) != 0) {
			a->jobs--;
			n->writing = false;
			n->dirty = true;
			cJSON_Delete(sj->obj);
			cJSON_Delete(sj->status);
			free(sj);
		}
	}
}

/* ---- this node's Node ---- */

/* Node objects carry an ownerReference to their Node (the garbage collector
 * removes them with it), and the operator deletes the objects of nodes it
 * cannot find. An agent that cannot read its Node (a --node that names no
 * Node, or RBAC) says so where users look: the NodeFound condition and an
 * Event on its node objects, gkm_agent_node_found, the log; and it keeps
 * looking, so that a fixed RBAC or a Node that appears is picked up. */

struct node_job {
	struct agent *a;
	int rc;
	char uid[64], err[256];
	cJSON *labels;
};

static void node_set(struct agent *a, int rc, const char *uid, const char *err);

static void node_lookup_work(void *ud)
{
	struct node_job *nj = ud;
	struct objstore *os = nj->a->os;
	cJSON *node = NULL;
	nj->rc = os->ops->get(os, "v1", "Node", NULL, nj->a->node, &node, nj->err, sizeof(nj->err));
	if (!nj->rc) {
		snprintf(nj->uid, sizeof(nj->uid), "%s", obj_str(node, "metadata.uid"));
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(node, "metadata"), "labels");
		nj->labels = l ? cJSON_Duplicate(l, 1) : cJSON_CreateObject();
	}
	cJSON_Delete(node);
}

/* The Node's labels: which LocalModelCaches' node groups take this node. */
static void node_labels_seen(struct agent *a, cJSON *labels)
{
	if (!labels || (a->node_labels && cJSON_Compare(a->node_labels, labels, 1))) {
		cJSON_Delete(labels);
		return;
	}
	cJSON_Delete(a->node_labels);
	a->node_labels = labels;
	for (struct cache *c = a->caches; c; c = c->next) {
		c->away = c->obj && local_model_away(a, c->obj);
		enqueue(a, c->key, 0);
	}
}

static void node_lookup_done(struct loop *l, void *ud)
{
	struct node_job *nj = ud;
	(void)l;
	nj->a->jobs--;
	if (!nj->a->stopping) {
		node_labels_seen(nj->a, nj->labels);
		nj->labels = NULL;
		node_set(nj->a, nj->rc, nj->uid, nj->err);
	}
	cJSON_Delete(nj->labels);
	free(nj);
}

static void node_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	a->node_timer = 0;
	struct node_job *nj = calloc(1, sizeof(*nj));
	if (nj) {
		nj->a = a;
		a->jobs++;
		if (workers_submit(a->workers, node_lookup_work, node_lookup_done, nj) == 0)
			return;
		a->jobs--;
		free(nj);
	}
	node_set(a, -ENOMEM, "", strerror(ENOMEM));
}

static void mark_all_nodeobjs(struct agent *a, bool reapply)
{
	for (struct nodeobj *n = a->nodeobjs; n; n = n->next) {
		if (reapply) /* the object itself changes: its ownerReference */
			n->created = false;
		mark_dirty(a, n->ns);
	}
}

static void node_set(struct agent *a, int rc, const char *uid, const char *err)
{
	bool changed = rc != a->node_rc;
	a->node_rc = rc;
	metrics_set(m_node_found, NULL, rc == 0);
	if (changed)
		obj_now(a->node_since, sizeof(a->node_since));
	if (rc == 0) {
		snprintf(a->node_uid, sizeof(a->node_uid), "%s", uid);
		a->node_failures = 0;
		if (changed && a->node_failures == 0 && a->nodeobjs)
			log_info(
			    "this node's Node can be read now; its node objects get it as owner",
			    "node", a->node);
		if (changed)
			mark_all_nodeobjs(a, true);
		return;
	}
	count_error("node_lookup");
	snprintf(a->node_err, sizeof(a->node_err), "%s", err);
	if (changed) {
		char st[16], reason[32], message[1024];
		node_condition(a, st, sizeof(st), reason, sizeof(reason), message, sizeof(message));
		log_warn("cannot read this node's Node; will keep trying", "node", a->node,
		         "reason", reason, "error", message);
		mark_all_nodeobjs(a, false);
	}
	if (!a->stopping)
		a->node_timer =
		    loop_add_timer(a->loop,
		                   backoff_ms(a->node_failures++, NODE_LOOKUP_BACKOFF_MS,
		                              NODE_LOOKUP_BACKOFF_MAX_MS, &a->seed),
		                   node_tick, a);
}

/* ---- store clean-up ---- */

/* A store entry younger than this survives a clean-up even when nothing
 * names it: it may be a pull that committed after the snapshot of names. */
#define GC_MIN_AGE_S 10

struct gc_job {
	struct agent *a;
	char (*keep)[80]; /* digests some cache names (a snapshot taken on the loop) */
	size_t nkeep;
	struct store_gc_stats st;
	int rc;
};

static bool gc_keep(void *ctx, const char *digest)
{
	struct gc_job *g = ctx;
	for (size_t i = 0; i < g->nkeep; i++)
		if (!strcmp(g->keep[i], digest))
			return true;
	bool used = true;
	if (cache_view_digest_in_use(g->a->run_dir, digest, &used) != 0)
		return true; /* usage records unreadable: keep */
	return used;
}

static void gc_work(void *ud)
{
	struct gc_job *g = ud;
	g->rc = store_gc(g->a->store, gc_keep, g, GC_MIN_AGE_S, &g->st);
}

static void gc_request(struct agent *a);

static void gc_done(struct loop *l, void *ud)
{
	struct gc_job *g = ud;
	struct agent *a = g->a;
	(void)l;
	a->jobs--;
	a->gc_running = false;
	if (g->rc) {
		log_warn("store clean-up failed", "error", strerror(-g->rc));
	} else if (g->st.removed) {
		char n[24], bytes[24];
		snprintf(n, sizeof(n), "%llu", (unsigned long long)g->st.removed);
		snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)g->st.bytes_removed);
		log_info("removed store entries no cache names and no pod uses", "entries", n,
		         "bytes", bytes);
	}
	free(g->keep);
	free(g);
	if (a->gc_again && !a->stopping) {
		a->gc_again = false;
		gc_request(a);
	}
}

/* Remove the extracted images that no cache of this node names and no pod
 * uses (a deleted cache, a digest replaced by a new one). Only once the
 * caches are listed: before that every entry would look unnamed. */
static void gc_request(struct agent *a)
{
	if (a->stopping || !a->synced_caches || !a->synced_cluster)
		return;
	if (a->gc_running) {
		a->gc_again = true;
		return;
	}
	size_t n = 0;
	for (struct cache *c = a->caches; c; c = c->next)
		n += 3;
	struct gc_job *g = calloc(1, sizeof(*g));
	if (!g || !(g->keep = calloc(n ? n : 1, sizeof(*g->keep)))) {
		free(g);
		return;
	}
	g->a = a;
	for (struct cache *c = a->caches; c; c = c->next) {
		const char *names[] = {c->digest, c->store_digest, c->view_digest};
		for (size_t i = 0; i < 3; i++)
			if (*names[i])
				snprintf(g->keep[g->nkeep++], sizeof(g->keep[0]), "%s", names[i]);
	}
	a->gc_running = true;
	a->jobs++;
	if (workers_submit(a->workers, gc_work, gc_done, g) != 0) {
		a->jobs--;
		a->gc_running = false;
		free(g->keep);
		free(g);
	}
}

/* ---- reconcile ---- */

static int validate_decision(const cJSON *r, char *err, size_t errlen)
{
	static const char *const known[] = {"fetch_image", "pull", "link", "unlink"};
	const cJSON *actions = cJSON_GetObjectItemCaseSensitive(r, "actions"), *act;
	const cJSON *entry = cJSON_GetObjectItemCaseSensitive(r, "entry");
	if (!cJSON_IsObject(r) || !(cJSON_IsArray(actions) || cJSON_IsObject(actions))) {
		snprintf(err, errlen, "want {entry, actions}");
		return -1;
	}
	cJSON_ArrayForEach(act, actions)
	{
		const char *t = obj_str(act, "type");
		size_t i = 0;
		while (i < sizeof(known) / sizeof(known[0]) && strcmp(known[i], t))
			i++;
		if (i == sizeof(known) / sizeof(known[0])) {
			snprintf(err, errlen, "unknown action '%s'", t);
			return -1;
		}
	}
	if (entry && (!cJSON_IsObject(entry) || !*obj_str(entry, "state"))) {
		snprintf(err, errlen, "entry must be a table with a state");
		return -1;
	}
	return 0;
}

static cJSON *compat_verdicts(struct agent *a, struct cache *c)
{
	cJSON *in = cJSON_CreateObject(), *out = NULL;
	cJSON *cache = cJSON_AddObjectToObject(in, "cache");
	cJSON_AddStringToObject(cache, "name", c->key);
	cJSON_AddItemToObject(cache, "targets", cJSON_Duplicate(c->targets, 1));
	cJSON *gpus = cJSON_GetObjectItemCaseSensitive(a->gpus, "gpus");
	cJSON_AddItemToObject(in, "gpus", gpus ? cJSON_Duplicate(gpus, 1) : cJSON_CreateArray());
	struct engine_error err;
	if (engine_call(a->policies->current, "compat", in, &out, &err) != ENGINE_OK) {
		count_error("policy");
		log_error("compat policy failed", "cache", c->key, "error", err.message);
		/* the first line: the traceback stays in the log */
		err.message[strcspn(err.message, "\n")] = '\0';
		out = cJSON_CreateObject();
		cJSON_AddStringToObject(out, "error", err.message);
	}
	cJSON_Delete(in);
	const cJSON *v;
	cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(out, "gpus"))
	{
		metrics_add(m_verdicts, METRICS_L(obj_str(v, "reason")), 1);
	}
	return out;
}

static const char *const image_states[] = {"unknown", "fetching", "ready"};

/* state "failed" with why, and when (if ever by itself) it is tried again;
 * reported from the first failure until a try succeeds, retries included */
static void failure_json(cJSON *o, const struct attempt *att)
{
	cJSON_ReplaceItemInObjectCaseSensitive(o, "state", cJSON_CreateString("failed"));
	cJSON_AddStringToObject(o, "reason", att->reason);
	cJSON_AddStringToObject(o, "message", att->message);
	cJSON_AddNumberToObject(o, "attempts", att->failures);
	cJSON_AddBoolToObject(o, "permanent", att->permanent);
	if (!att->permanent)
		cJSON_AddStringToObject(o, "nextAttemptTime", att->retry_time);
}

/* usage = {pods = n, list = [{podName, podNamespace, podUID, volumeId}],
 * fallback = [{..., state, reason, message}]}: the CSI plugin's records, in
 * the shape of the node status pods[] and fallbackPods[]; a fallback volume
 * (an empty directory instead of the cache) does not use the cache. */
/* A writable volume's size-limited layer (csi/csi_layer.h), as the CSI
 * plugin keeps it under ROOT/csi: its limit and what the pod wrote, rounded
 * to MiB so that a writing pod does not rewrite the node status at every
 * reconcile. Nothing for a volume without a layer. */
static void layer_usage(const struct agent *a, const char *key, cJSON *o)
{
	char vdir[PATH_MAX], layer[PATH_MAX + 8];
	struct stat sd, sl;
	struct statvfs sv;
	if (!key || !*key || key[0] == '.' || strchr(key, '/'))
		return;
	snprintf(vdir, sizeof(vdir), "%s/csi/volumes/%s", a->root, key);
	snprintf(layer, sizeof(layer), "%s/layer", vdir);
	/* a mount of its own: another device than the directory it is in */
	if (stat(vdir, &sd) != 0 || stat(layer, &sl) != 0 || sd.st_dev == sl.st_dev ||
	    statvfs(layer, &sv) != 0)
		return;
	uint64_t total = (uint64_t)sv.f_blocks * sv.f_frsize;
	uint64_t used = total - (uint64_t)sv.f_bfree * sv.f_frsize;
	cJSON_AddNumberToObject(o, "sizeLimitBytes", (double)total);
	cJSON_AddNumberToObject(o, "writtenBytes", (double)(used >> 20 << 20));
}

static cJSON *usage_json(const struct agent *a, const struct cache_view_usage *u)
{
	cJSON *usage = cJSON_CreateObject();
	cJSON *list = cJSON_AddArrayToObject(usage, "list");
	cJSON *fallback = cJSON_AddArrayToObject(usage, "fallback");
	for (size_t i = 0; u && i < u->npods; i++) {
		const struct cache_view_pod *p = &u->pods[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "podName", p->name ? p->name : "");
		cJSON_AddStringToObject(o, "podNamespace", p->namespace ? p->namespace : "");
		cJSON_AddStringToObject(o, "podUID", p->uid ? p->uid : "");
		cJSON_AddStringToObject(o, "volumeId", p->volume_id ? p->volume_id : "");
		if (!p->read_only || p->fallback)
			layer_usage(a, p->volume_id, o);
		if (p->fallback) {
			cJSON_AddStringToObject(o, "state", p->fallback_state);
			cJSON_AddStringToObject(o, "reason", p->fallback_reason);
			cJSON_AddStringToObject(o, "message", p->fallback_message);
		}
		cJSON_AddItemToArray(p->fallback ? fallback : list, o);
	}
	cJSON_AddNumberToObject(usage, "pods", cJSON_GetArraySize(list));
	return usage;
}

static cJSON *decide_input(struct agent *a, struct cache *c, const struct cache_view_usage *u)
{
	char now[32];
	obj_now(now, sizeof(now));
	cJSON *in = cJSON_CreateObject();
	cJSON_AddStringToObject(in, "node", a->node);
	cJSON_AddStringToObject(in, "now", now);
	if (c->obj && !c->away) {
		cJSON *cache = cJSON_AddObjectToObject(in, "cache");
		cJSON_AddStringToObject(cache, "kind", obj_str(c->obj, "kind"));
		cJSON_AddStringToObject(cache, "namespace", c->ns);
		cJSON_AddStringToObject(cache, "name", c->name);
		cJSON_AddStringToObject(cache, "image", obj_str(c->obj, "spec.image"));
		cJSON_AddStringToObject(cache, "digest", c->digest);
		cJSON_AddBoolToObject(cache, "deleting",
		                      *obj_str(c->obj, "metadata.deletionTimestamp") != '\0');
	}
	cJSON *gpus = cJSON_GetObjectItemCaseSensitive(a->gpus, "gpus");
	cJSON_AddItemToObject(in, "gpus", gpus ? cJSON_Duplicate(gpus, 1) : cJSON_CreateArray());
	bool image_current = !strcmp(c->image_digest, c->digest);
	cJSON *image = cJSON_AddObjectToObject(in, "image");
	cJSON_AddStringToObject(image, "state",
	                        image_states[image_current ? c->image : IMG_UNKNOWN]);
	/* without labels the targets come from the pull: its failure is the image's */
	const struct attempt *image_failure = c->fetch.failures                          ? &c->fetch
	                                      : c->targets_need_pull && c->pull.failures ? &c->pull
	                                                                                 : NULL;
	if (image_failure)
		failure_json(image, image_failure);
	if (image_current && c->image == IMG_READY && a->policies->current) {
		cJSON *v = compat_verdicts(a, c);
		if (v)
			cJSON_AddItemToObject(in, "compat", v);
	}
	/* present for this cache: in the store, and verified through this
	 * cache's own reference (another cache's check vouches for nothing) */
	const char *sd = c->store_digest[0] ? c->store_digest : c->digest;
	bool present =
	    *c->digest && !strcmp(c->verified_ref, c->ref) && store_lookup(a->store, sd, NULL) == 0;
	cJSON_AddBoolToObject(cJSON_AddObjectToObject(in, "store"), "present", present);
	cJSON *pull = cJSON_AddObjectToObject(in, "pull");
	cJSON_AddStringToObject(pull, "state",
	                        c->pull.job.queued || c->pull.job.running ? "running" : "idle");
	if (c->pull.failures && !c->targets_need_pull)
		failure_json(pull, &c->pull);
	cJSON *view = cJSON_AddObjectToObject(in, "view");
	if (c->view_digest[0])
		cJSON_AddStringToObject(view, "digest", c->view_digest);
	struct cache_view_ready r;
	if (c->view_digest[0] && !(image_current && c->image == IMG_READY) &&
	    cache_view_ready_read(a->root, c->ns, c->name, &r, NULL, 0) == 0) {
		/* what the view was published for, while the image facts are read
		 * again (after a restart) */
		cJSON *ids = cJSON_AddArrayToObject(view, "compatibleGPUs");
		for (size_t i = 0; i < r.ncompatible_gpus; i++)
			cJSON_AddItemToArray(ids, cJSON_CreateString(r.compatible_gpus[i]));
		cache_view_ready_free(&r);
	}
	cJSON_AddItemToObject(in, "usage", usage_json(a, u));
	if (c->entry)
		cJSON_AddItemToObject(in, "previous", cJSON_Duplicate(c->entry, 1));
	return in;
}

static int do_link(struct agent *a, struct cache *c, const cJSON *entry)
{
	if (strcmp(c->verified_ref, c->ref) != 0) {
		/* whatever a policy says: a view only after this cache's own pull */
		count_error("view");
		log_error("not publishing a cache that was not pulled through its own reference",
		          "cache", c->key, "digest", c->digest);
		return -EPERM;
	}
	struct cache_view_ready r;
	memset(&r, 0, sizeof(r));
	const char *sd = c->store_digest[0] ? c->store_digest : c->digest;
	snprintf(r.digest, sizeof(r.digest), "%.71s", sd);
	snprintf(r.state, sizeof(r.state), "Ready");
	r.compatible = true;
	char *ids[CACHE_VIEW_GPUS_MAX], idbuf[CACHE_VIEW_GPUS_MAX][24];
	size_t n = 0;
	const cJSON *set, *id;
	cJSON_ArrayForEach(set, cJSON_GetObjectItemCaseSensitive(entry, "compatibleGPUs"))
	{
		cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(set, "ids"))
		{
			if (n >= CACHE_VIEW_GPUS_MAX)
				break;
			if (cJSON_IsNumber(id))
				snprintf(idbuf[n], sizeof(idbuf[n]), "%d", id->valueint);
			else
				snprintf(idbuf[n], sizeof(idbuf[n]), "%s",
				         cJSON_IsString(id) ? id->valuestring : "?");
			ids[n] = idbuf[n];
			n++;
		}
	}
	r.compatible_gpus = ids;
	r.ncompatible_gpus = n;
	r.reason = "";
	r.message = "";
	snprintf(r.verified_by, sizeof(r.verified_by), "%s", c->verified_by);
	obj_now(r.updated, sizeof(r.updated));
	int rc = cache_view_publish(a->root, c->ns, c->name, &r);
	if (rc == 0) {
		bool relink = !strcmp(c->view_digest, c->digest);
		c->record = REC_READY;
		snprintf(c->view_digest, sizeof(c->view_digest), "%s", c->digest);
		if (!relink && !c->extracted)
			metrics_add(m_hits, NULL, 1);
		c->extracted = false;
	} else {
		count_error("view");
		log_error("cannot publish the cache view", "cache", c->key, "error", strerror(-rc));
	}
	return rc;
}

static bool record_changed(const cJSON *entry, const cJSON *prev)
{
	static const char *const keys[] = {"digest", "state", "reason", "message"};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strcmp(obj_str(entry, keys[i]), obj_str(prev, keys[i])) != 0)
			return true;
	return false;
}

/* The node's record (ready.json) says what the status entry says, in every
 * state, so that the CSI plugin can tell a pod why it cannot mount. Ready is
 * written only with the view (do_link), and a record that is not Ready
 * makes the cache unmountable whatever the view still links. linked: the
 * view was linked in this reconcile (its Ready record is the newest word). */
static void write_record(struct agent *a, struct cache *c, const cJSON *entry, bool linked)
{
	if (!entry) {
		/* gone: no record, unless a pod still holds the view */
		if (!c->view_digest[0] && cache_view_unpublish(a->root, c->ns, c->name) == 0)
			c->record = REC_UNKNOWN;
		return;
	}
	if (linked)
		return;
	const char *state = obj_str(entry, "state");
	if (!strcmp(state, "Ready")) {
		if (c->record != REC_READY && !strcmp(c->view_digest, c->digest))
			do_link(a, c, entry);
		return;
	}
	if (c->record == REC_OTHER && !record_changed(entry, c->entry))
		return;
	struct cache_view_ready r;
	char message[1024];
	memset(&r, 0, sizeof(r));
	const char *d = obj_str(entry, "digest");
	if (cache_view_valid_digest(d))
		snprintf(r.digest, sizeof(r.digest), "%s", d);
	snprintf(r.state, sizeof(r.state), "%s", state);
	snprintf(message, sizeof(message), "%s", obj_str(entry, "message"));
	r.compatible = strcmp(state, "Incompatible") != 0;
	r.reason = (char *)obj_str(entry, "reason");
	r.message = message;
	obj_now(r.updated, sizeof(r.updated));
	int rc = cache_view_record(a->root, c->ns, c->name, &r);
	if (rc == 0) {
		c->record = REC_OTHER;
	} else {
		count_error("view");
		log_error("cannot write the cache's node record", "cache", c->key, "error",
		          strerror(-rc));
	}
}

/* Lua has one empty table for {} and []; the CRD's lists must stay lists. */
static void entry_lists(cJSON *entry)
{
	static const char *const lists[] = {"compatibleGPUs", "incompatibleGPUs", "pods"};
	for (size_t i = 0; entry && i < sizeof(lists) / sizeof(lists[0]); i++) {
		cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, lists[i]);
		if (cJSON_IsObject(v) && !v->child)
			cJSON_ReplaceItemInObjectCaseSensitive(entry, lists[i],
			                                       cJSON_CreateArray());
	}
}

/* A LocalModelCache's kernel cache: its tree copied into the node group's
 * storage while it is Ready here, removed when it is not; a failure makes
 * the entry Failed with the reason. */
static void place_local_model(struct agent *a, struct cache *c, cJSON *entry)
{
	char path[PATH_MAX] = "", err[640];
	const char *name = c->obj ? local_model_name(c->obj) : "";
	bool want = *name && !c->away && entry && !strcmp(obj_str(entry, "state"), "Ready") &&
	            *c->view_digest && !strcmp(c->view_digest, c->digest) &&
	            local_model_here(c->obj, a->node, a->node_labels, path, sizeof(path));
	if (c->placed && (!want || strcmp(c->placed, path) || strcmp(c->placed_name, name))) {
		if (local_model_remove(c->placed, c->placed_name, err, sizeof(err)) != 0)
			log_warn("cannot remove a kernel cache from local model storage", "cache",
			         c->key, "error", err);
		else
			log_info("removed a kernel cache from local model storage", "cache", c->key,
			         "path", c->placed);
		free(c->placed);
		c->placed = NULL;
	}
	if (!want || (c->placed && !strcmp(c->placed_digest, c->view_digest)))
		return;
	int fd = -1;
	char *real = NULL;
	int rc = cache_view_open_data(a->root, c->ns, c->name, c->view_digest, &fd, &real, err,
	                              sizeof(err));
	if (rc == 0)
		rc = local_model_place(path, name, fd, err, sizeof(err));
	if (fd >= 0)
		close(fd);
	free(real);
	if (rc) {
		count_error("view");
		log_warn("cannot place a kernel cache in local model storage", "cache", c->key,
		         "error", err);
		obj_set(entry, "state", cJSON_CreateString("Failed"));
		obj_set(entry, "reason", cJSON_CreateString("LocalModelPathUnusable"));
		obj_set(entry, "message", cJSON_CreateString(err));
		return;
	}
	c->placed = strdup(path);
	snprintf(c->placed_name, sizeof(c->placed_name), "%s", name);
	snprintf(c->placed_digest, sizeof(c->placed_digest), "%s", c->view_digest);
	log_info("placed a kernel cache in local model storage", "cache", c->key, "path", path,
	         "localModelCache", name);
}

static void reconcile(struct agent *a, const char *key)
{
	struct cache *c = find_cache(a, key);
	if (!c || !a->policies->current || !a->probed)
		return;
	struct cache_view_usage u;
	bool have_usage = cache_view_usage_read(a->run_dir, c->ns, c->name, &u) == 0;
	cJSON *in = decide_input(a, c, have_usage ? &u : NULL), *out = NULL;
	if (have_usage) {
		fallback_notice_usage(a->notice, c->key, &u);
		cache_view_usage_free(&u);
	}
	struct engine_error err;
	enum engine_status st = engine_call_fn(a->policies->current, "gkm.agent", "decide", in,
	                                       validate_decision, &out, &err);
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		metrics_add(m_reconciles, METRICS_L("policy_error"), 1);
		count_error("policy");
		log_error("agent decision failed", "cache", key, "error", err.message);
		kube_workqueue_add_rate_limited(a->queue, key, loop_now_ms());
		return;
	}
	metrics_add(m_reconciles, METRICS_L("ok"), 1);
	cJSON *entry = cJSON_DetachItemFromObjectCaseSensitive(out, "entry");
	entry_lists(entry);
	bool released = false, linked = false;
	const cJSON *act;
	cJSON_ArrayForEach(act, cJSON_GetObjectItemCaseSensitive(out, "actions"))
	{
		const char *t = obj_str(act, "type");
		if (!strcmp(t, "fetch_image") && *c->digest && c->targets_need_pull) {
			want(a, c, PULL_SCHED_PULL); /* the targets come with the pull */
		} else if (!strcmp(t, "fetch_image") && *c->digest) {
			want(a, c, PULL_SCHED_FETCH);
			if (c->fetch.job.queued || c->fetch.job.running) {
				c->image = IMG_FETCHING;
				snprintf(c->image_digest, sizeof(c->image_digest), "%s", c->digest);
			}
		} else if (!strcmp(t, "pull") && *c->digest) {
			want(a, c, PULL_SCHED_PULL);
		} else if (!strcmp(t, "link") && entry) {
			if (do_link(a, c, entry) == 0) {
				enqueue(a, key, 0);
				released = true; /* the view may have left an older digest */
				linked = true;
			}
		} else if (!strcmp(t, "unlink")) {
			if (cache_view_unpublish(a->root, c->ns, c->name) == 0) {
				c->view_digest[0] = '\0';
				c->record = REC_UNKNOWN;
				released = true;
			} else {
				count_error("view");
			}
		}
	}
	place_local_model(a, c, entry);
	write_record(a, c, entry, linked);
	if (cache_view_capture_set(a->root, c->ns, c->name,
	                           entry && c->obj && node_capture_on_exit(c->obj)) != 0)
		count_error("view");
	schedule(a);
	const cJSON *ra = cJSON_GetObjectItemCaseSensitive(out, "requeue_after");
	if (cJSON_IsNumber(ra) && ra->valuedouble > 0)
		enqueue(a, key, (uint64_t)(ra->valuedouble * 1000));
	cJSON_Delete(out);
	if (!cJSON_Compare(entry, c->entry, 1)) {
		cJSON_Delete(c->entry);
		c->entry = entry;
		mark_dirty(a, c->ns);
	} else {
		cJSON_Delete(entry);
	}
	kube_workqueue_forget(a->queue, key);
	/* deleted and released: forget it */
	if (!c->obj && !c->entry && !c->view_digest[0] && !c->pull.job.running &&
	    !c->fetch.job.running)
		forget_cache(a, c);
	if (released)
		gc_request(a);
}

static void process(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	a->kick_timer = 0;
	const char *key;
	uint64_t now = loop_now_ms();
	while ((key = kube_workqueue_get(a->queue, now)) != NULL) {
		char k[512];
		snprintf(k, sizeof(k), "%s", key);
		reconcile(a, k);
		kube_workqueue_done(a->queue, k);
	}
	uint64_t due = kube_workqueue_next_due(a->queue);
	if (due != UINT64_MAX && !a->stopping)
		a->kick_timer = loop_add_timer(a->loop, due > now ? due - now : 0, process, a);
}

static void kick(struct agent *a)
{
	if (a->stopping)
		return;
	if (a->kick_timer)
		loop_cancel_timer(a->loop, a->kick_timer);
	a->kick_timer = loop_add_timer(a->loop, 0, process, a);
}

/* ---- GPUs, resync, lifecycle ---- */

static int probe(struct agent *a, cJSON **out)
{
	struct gpu_probe *p = NULL;
	char err[512] = "";
	const char *src = a->o.gpu_source ? a->o.gpu_source : "auto";
	int rc;
	if (!strcmp(src, "file"))
		rc = gpu_file_probe(a->o.gpu_file, &p, err, sizeof(err));
	else if (!strcmp(src, "nvml"))
		rc = gpu_nvml_probe(a->o.nvml_lib, &p, err, sizeof(err));
	else if (!strcmp(src, "rocm"))
		rc = gpu_rocm_probe(a->o.sysfs_root, &p, err, sizeof(err));
	else
		rc = gpu_probe_auto(a->o.nvml_lib, a->o.sysfs_root, &p, err, sizeof(err));
	if (rc) {
		count_error("gpu_probe");
		log_error("GPU probe failed", "source", src, "error", err);
		return rc;
	}
	*out = gpu_probe_to_json(p);
	gpu_probe_free(p);
	return *out ? 0 : -ENOMEM;
}

void agent_reprobe(struct agent *a)
{
	cJSON *g = NULL;
	if (probe(a, &g) != 0)
		return;
	bool first = !a->probed;
	a->probed = true;
	if (a->gpus && cJSON_Compare(a->gpus, g, 1)) {
		cJSON_Delete(g);
		return;
	}
	cJSON_Delete(a->gpus);
	a->gpus = g;
	char count[16];
	snprintf(count, sizeof(count), "%d",
	         cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(g, "gpus")));
	log_info(first ? "GPUs probed" : "GPUs changed", "node", a->node, "gpus", count);
	mark_dirty(a, "");
	enqueue_all(a);
}

static void probe_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	agent_reprobe(a);
	a->probe_timer = loop_add_timer(l, (uint64_t)a->o.reprobe_s * 1000, probe_tick, a);
}

/* Pod usage changes (CSI) and store state are picked up by a periodic pass. */
/* Does a cache depend on this node's labels (a LocalModelCache's node
 * groups select nodes by them)? */
static bool wants_node_labels(const struct agent *a)
{
	for (const struct cache *c = a->caches; c; c = c->next)
		if (c->obj && *local_model_name(c->obj))
			return true;
	return false;
}

static void resync_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	enqueue_all(a);
	gc_request(a);
	/* labels change: read them again (a lookup that failed retries anyway) */
	if (a->o.owner_node_refs && !a->node_timer && wants_node_labels(a))
		node_tick(l, a);
	fallback_notice_scan(a->notice, a->run_dir);
	a->resync_timer = loop_add_timer(l, (uint64_t)a->o.resync_s * 1000, resync_tick, a);
}

/* The CSI plugin rewrites a cache's usage file as the kubelet publishes and
 * unpublishes volumes. One stat per cache each USAGE_POLL_MS brings a change
 * into node status (and releases a deleted cache's last use) at once, not at
 * the next resync. */
/* ---- captures of pods' writable volumes (node_capture.h) ---- */

struct capture_job {
	struct agent *a;
	char key[320];
	struct node_capture k;
};

static void capture_work(void *ud)
{
	struct capture_job *cj = ud;
	node_capture_run(&cj->k);
}

static void captures_start(struct agent *a);

static void capture_done(struct loop *l, void *ud)
{
	struct capture_job *cj = ud;
	struct agent *a = cj->a;
	(void)l;
	a->jobs--;
	a->capturing = false;
	struct cache *c = find_cache(a, cj->key);
	if (c && cj->k.record) {
		if (!c->captures)
			c->captures = cJSON_CreateArray();
		cJSON_AddItemToArray(c->captures, cj->k.record);
		cj->k.record = NULL;
		while (cJSON_GetArraySize(c->captures) > NODE_CAPTURE_RECORDS)
			cJSON_DeleteItemFromArray(c->captures, 0);
		node_capture_records_save(a->root, c->ns, c->name, c->captures);
		mark_dirty(a, c->ns);
	}
	node_capture_clear(&cj->k);
	free(cj);
	captures_start(a);
}

/* The writable volumes of c live on this node, [{dir, pod}], for a capture
 * on demand (their layers are in the CSI plugin's state directory, ROOT/csi). */
static cJSON *live_volumes(struct agent *a, const struct cache *c)
{
	struct cache_view_usage u;
	cJSON *list = cJSON_CreateArray();
	if (cache_view_usage_read(a->run_dir, c->ns, c->name, &u) != 0)
		return list;
	for (size_t i = 0; i < u.npods; i++) {
		const struct cache_view_pod *p = &u.pods[i];
		/* a volume's key is one path component (csi_volume.h) */
		if (p->read_only || p->fallback || !*p->volume_id || p->volume_id[0] == '.' ||
		    strchr(p->volume_id, '/'))
			continue;
		char dir[PATH_MAX];
		snprintf(dir, sizeof(dir), "%s/csi/volumes/%s", a->root, p->volume_id);
		cJSON *v = cJSON_CreateObject(), *pod = cJSON_AddObjectToObject(v, "pod");
		cJSON_AddStringToObject(v, "dir", dir);
		cJSON_AddStringToObject(pod, "name", p->name);
		cJSON_AddStringToObject(pod, "namespace", p->namespace);
		cJSON_AddStringToObject(pod, "uid", p->uid);
		cJSON_AddStringToObject(pod, "node", a->node);
		cJSON_AddItemToArray(list, v);
	}
	cache_view_usage_free(&u);
	return list;
}

/* The next capture, once the cache is published here (its image is the
 * capture's base): a live volume a capture on demand asked for, else a
 * volume the CSI plugin handed over at unpublish. */
static void captures_start(struct agent *a)
{
	char dir[PATH_MAX], repo[512];
	for (struct cache *c = a->caches; c && !a->capturing && !a->stopping; c = c->next) {
		bool repo_set = c->obj && node_capture_repository(c->obj, repo, sizeof(repo));
		bool pending = node_capture_pending(a->root, c->ns, c->name, dir, sizeof(dir)) == 0;
		if (pending && !repo_set) {
			node_capture_discard(dir, "the cache does not capture");
			continue;
		}
		if (!repo_set || !c->ref[0] || !c->view_digest[0] ||
		    strcmp(c->view_digest, c->digest) != 0)
			continue;
		if (node_capture_demanded(a->root, c->ns, c->name, c->obj, &c->demand)) {
			cJSON_Delete(c->live);
			c->live = live_volumes(a, c);
		}
		cJSON *live = cJSON_DetachItemFromArray(c->live, 0);
		if (!live && !pending)
			continue;
		struct capture_job *cj = calloc(1, sizeof(*cj));
		if (!cj) {
			cJSON_Delete(live);
			return;
		}
		cj->a = a;
		snprintf(cj->key, sizeof(cj->key), "%s", c->key);
		snprintf(cj->k.dir, sizeof(cj->k.dir), "%s", live ? obj_str(live, "dir") : dir);
		cj->k.live = live != NULL;
		cj->k.pod = live ? cJSON_DetachItemFromObjectCaseSensitive(live, "pod") : NULL;
		cJSON_Delete(live);
		snprintf(cj->k.work, sizeof(cj->k.work), "%s/%s/.work-XXXXXX", a->root,
		         CACHE_VIEW_CAPTURES);
		snprintf(cj->k.base, sizeof(cj->k.base), "%s", c->ref);
		snprintf(cj->k.repository, sizeof(cj->k.repository), "%s", repo);
		cj->k.gpus_json = cJSON_PrintUnformatted(a->gpus);
		cj->k.os = a->os;
		cj->k.cancel = &a->cancel;
		cj->k.cache = cJSON_Duplicate(c->obj, 1);
		pull_secret_ref_of(c->obj, a->o.namespace_, a->o.global_credentials,
		                   &cj->k.secrets);
		a->capturing = true;
		a->jobs++;
		if (workers_submit(a->workers, capture_work, capture_done, cj) != 0) {
			a->jobs--;
			a->capturing = false;
			node_capture_clear(&cj->k);
			free(cj);
		}
	}
}

static void usage_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	bool changed = false;
	for (struct cache *c = a->caches; c; c = c->next) {
		struct cache_view_usage_stamp st;
		if (cache_view_usage_stamp(a->run_dir, c->ns, c->name, &st) != 0 ||
		    memcmp(&st, &c->usage_seen, sizeof(st)) == 0)
			continue;
		c->usage_seen = st;
		kube_workqueue_add(a->queue, c->key);
		changed = true;
	}
	if (changed)
		kick(a);
	captures_start(a);
	a->usage_timer = loop_add_timer(l, USAGE_POLL_MS, usage_tick, a);
}

/* New policies may change what a permanent failure was about (a trusted
 * key, an allowed unsigned image): each gets one more try. */
void agent_policies_changed(struct agent *a)
{
	for (struct cache *c = a->caches; c; c = c->next)
		recheck_permanent(c);
	enqueue_all(a);
}

void agent_set_trust(struct agent *a, struct trust *t)
{
	struct trust *old = a->trust;
	unsigned again = 0;
	a->trust = t ? trust_ref(t) : NULL;
	trust_unref(old);
	for (struct cache *c = a->caches; c; c = c->next) {
		recheck_permanent(c);
		if (c->verified_ref[0] && !still_trusted(a, c)) {
			/* not mountable until its own pull verifies it again */
			c->verified_ref[0] = '\0';
			again++;
		}
	}
	char n[24];
	snprintf(n, sizeof(n), "%u", again);
	log_info("trusted keys changed", "keys", t ? t->keys_fp : "none", "verify_again", n);
	enqueue_all(a);
}

bool agent_ready(const struct agent *a)
{
	return a->probed && a->synced_caches && a->synced_cluster;
}

static void synced_ns(void *ud)
{
	((struct agent *)ud)->synced_caches = true;
}

static void synced_cluster(void *ud)
{
	((struct agent *)ud)->synced_cluster = true;
}

int agent_start(struct loop *l, struct workers *w, struct objstore *os,
                struct engine_slot *policies, const struct agent_opts *o, struct agent **out)
{
	if (!o->node || !cache_view_valid_name(o->node) || !o->root || !o->run_dir)
		return -EINVAL;
	struct agent *a = calloc(1, sizeof(*a));
	int rc;
	if (!a)
		return -ENOMEM;
	init_metrics();
	pthread_mutex_init(&a->clients_lock, NULL);
	a->loop = l;
	soon_timer_init(&a->status_timer, l, flush_status, a);
	a->workers = w;
	a->os = os;
	a->policies = policies;
	a->o = *o;
	a->trust = o->trust ? trust_ref(o->trust) : NULL;
	snprintf(a->node, sizeof(a->node), "%s", o->node);
	snprintf(a->root, sizeof(a->root), "%s", o->root);
	snprintf(a->run_dir, sizeof(a->run_dir), "%s", o->run_dir);
	snprintf(a->manager, sizeof(a->manager), MANAGER_PREFIX "%s", o->node);
	a->o.node = a->node;
	a->o.root = a->root;
	a->o.run_dir = a->run_dir;
	if (!a->o.max_pulls)
		a->o.max_pulls = 2;
	if (!a->o.reprobe_s)
		a->o.reprobe_s = 300;
	if (!a->o.resync_s)
		a->o.resync_s = 30;
	if (!a->o.status_debounce_ms)
		a->o.status_debounce_ms = 200;
	/* a failed request is tried again by the agent after a backoff that
	 * holds no slot, not by the registry client sleeping in one */
	if (o->registry)
		a->reg = *o->registry;
	else
		oci_registry_opts_init(&a->reg);
	a->reg.retries = 0;
	a->reg.cancel = &a->cancel;
	a->o.registry = &a->reg;
	unsigned slots[PULL_SCHED_LANES] = {
	    [PULL_SCHED_FETCH] = FETCH_SLOTS, [PULL_SCHED_PULL] = a->o.max_pulls};
	if ((rc = pull_sched_new(slots, &a->sched)) ||
	    (rc = workers_new(l, FETCH_SLOTS + a->o.max_pulls, &a->pool)) ||
	    (rc = fallback_notice_new(w, os, &a->notice))) {
		agent_stop(a);
		return rc;
	}
	char store_root[600];
	snprintf(store_root, sizeof(store_root), "%s/store", a->root);
	struct kube_workqueue_opts qo = {
	    .max_in_flight = 64, .base_delay_ms = 500, .max_delay_ms = 300000};
	if ((rc = store_open(store_root, &a->store)) || (rc = kube_workqueue_new(&qo, &a->queue))) {
		log_error("cannot open the store", "path", store_root, "error", strerror(-rc));
		agent_stop(a);
		return rc;
	}
	if (o->owner_node_refs) {
		struct node_job nj = {.a = a};
		node_lookup_work(&nj); /* before the first status write */
		a->node_rc = 1;        /* so that the first result counts as a change */
		node_labels_seen(a, nj.labels);
		node_set(a, nj.rc, nj.uid, nj.err);
	}
	agent_reprobe(a);
	a->probe_timer = loop_add_timer(l, (uint64_t)a->o.reprobe_s * 1000, probe_tick, a);
	a->resync_timer = loop_add_timer(l, (uint64_t)a->o.resync_s * 1000, resync_tick, a);
	a->usage_timer = loop_add_timer(l, USAGE_POLL_MS, usage_tick, a);
	struct objstore_watch ns_w = {.api_version = GKM_API_VERSION,
	                              .kind = "GKMCache",
	                              .on_event = on_cache_event,
	                              .on_synced = synced_ns,
	                              .ud = a};
	struct objstore_watch cl_w = {.api_version = GKM_API_VERSION,
	                              .kind = "ClusterGKMCache",
	                              .on_event = on_cache_event,
	                              .on_synced = synced_cluster,
	                              .ud = a};
	char mine[300];
	snprintf(mine, sizeof(mine), "gkm.io/node=%s", a->node);
	struct objstore_watch ns_nw = {.api_version = GKM_API_VERSION,
	                               .kind = "GKMCacheNode",
	                               .label_selector = mine,
	                               .on_event = on_nodeobj_event,
	                               .ud = a,
	                               .no_cache = true, /* only deletions matter */
	                               .list_page = GKM_NODEOBJ_LIST_PAGE};
	struct objstore_watch cl_nw = ns_nw;
	cl_nw.kind = "ClusterGKMCacheNode";
	if ((rc = os->ops->watch(os, &ns_w)) || (rc = os->ops->watch(os, &cl_w)) ||
	    (rc = os->ops->watch(os, &ns_nw)) || (rc = os->ops->watch(os, &cl_nw))) {
		agent_stop(a);
		return rc;
	}
	mark_dirty(a, ""); /* the ClusterGKMCacheNode exists as soon as the agent runs */
	*out = a;
	return 0;
}

void agent_quiesce(struct agent *a)
{
	a->stopping = true;
	/* running registry jobs end (a registry that hangs does not hold the
	 * shutdown) and post their completions (loop_drain) */
	atomic_store(&a->cancel, true);
	workers_free(a->pool);
	a->pool = NULL;
}

void agent_stop(struct agent *a)
{
	if (!a)
		return;
	a->stopping = true;
	if (a->kick_timer)
		loop_cancel_timer(a->loop, a->kick_timer);
	if (a->resync_timer)
		loop_cancel_timer(a->loop, a->resync_timer);
	if (a->usage_timer)
		loop_cancel_timer(a->loop, a->usage_timer);
	if (a->probe_timer)
		loop_cancel_timer(a->loop, a->probe_timer);
	soon_timer_cancel(&a->status_timer);
	if (a->sched_timer)
		loop_cancel_timer(a->loop, a->sched_timer);
	if (a->node_timer)
		loop_cancel_timer(a->loop, a->node_timer);
	workers_free(a->pool);
	if (a->clients_timer)
		loop_cancel_timer(a->loop, a->clients_timer);
	clients_drop_idle(a->loop, a);
	pthread_mutex_destroy(&a->clients_lock);
	while (a->caches) {
		struct cache *c = a->caches;
		a->caches = c->next;
		cache_free(c);
	}
	while (a->nodeobjs) {
		struct nodeobj *n = a->nodeobjs;
		a->nodeobjs = n->next;
		free(n);
	}
	cJSON_Delete(a->gpus);
	cJSON_Delete(a->node_labels);
	fallback_notice_free(a->notice);
	pull_sched_free(a->sched);
	kube_workqueue_free(a->queue);
	store_close(a->store);
	trust_unref(a->trust);
	free(a);
}
