/* The agent's parts (private to core/node/agent*.c): what the agent knows
 * about each cache and node object, and the calls one part makes into
 * another. agent.h is the daemon's interface; this is not.
 *
 *   agent.c           caches from the watch, GPUs, resync, start and stop
 *   agent_jobs.c      registry jobs: reading an image's configuration, pulls
 *   agent_reconcile.c the policy's decision for a cache and the store's view
 *   agent_report.c    the node objects' status, and this node's Node
 *   agent_gc.c        store clean-up
 *   agent_evict.c     the store's budget: evictions, and the room a pull needs
 *   agent_captures.c  captures of pods' writable volumes
 *
 * Everything here runs on the loop thread except the *_work functions of
 * jobs, which see only their job. */
#ifndef GKM_AGENT_IMPL_H
#define GKM_AGENT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "agent.h"
#include "cache_view.h"
#include "metrics.h"
#include "oci_ref.h"
#include "pull_sched.h"
#include "soon_timer.h"
#include "ttl_cache.h"

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

/* A cache whose image the store's budget evicted (agent_evict.c). */
enum eviction_state {
	EV_UNREAD,   /* not known yet: the node's record may say Evicted (a restart) */
	EV_NONE,     /* not evicted */
	EV_REMOVING, /* out of service: its image is removed after a grace */
	EV_DONE,     /* its image is gone from the store */
};

struct cache_eviction {
	enum eviction_state state;
	bool wanted;     /* asked for since (a pod, an edit): pulled again */
	char digest[80]; /* the cache's digest then (a new one is no eviction) */
	char image[80];  /* the store entry removed */
	char reason[32]; /* HighThreshold, MaxBytes, PullNeedsSpace */
	char message[1024];
	int64_t at; /* unix seconds: an ask counts from then on */
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
	cJSON *obj;         /* the cache object, NULL once deleted */
	char ref[700];      /* image reference pinned to the digest ("" without one) */
	struct oci_ref pin; /* the same, parsed once (when pin_rc is 0) */
	int pin_rc;         /* spec.image does not parse: why, in pin_err */
	char pin_err[256];
	char host[256];  /* the registry host of ref, for fair slots */
	bool mirrored;   /* ref is pulled through a mirror (hosts.toml, registries.conf) */
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
	/* spec.nodeSelector or node affinity names Nodes, and this node's Node
	 * has not been read yet: not decided (nor reported) until it is */
	bool undecided;
	char *placed, placed_name[254], placed_digest[80];
	cJSON *captures; /* what captures of pods' volumes gave here (node_capture.h) */
	cJSON *live;     /* live volumes a capture on demand still has to take */
	char *demand;    /* the gkm.io/capture value last handled (NULL: not read yet) */
	cJSON *misses;   /* {volumeId: kernels the pod compiled, as last counted} */
	struct cache_eviction evicted;
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
	pthread_mutex_t checks_lock;
	struct ttl_cache *checks; /* source checks that may serve other caches (agent_jobs.c) */
	uint64_t clients_timer;   /* drops them once no job ended for a while */
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
	bool capturing;        /* a capture job runs (one at a time) */
	struct budget *budget; /* agent_evict.c */
};

struct agent_metrics {
	struct metric *reconciles, *errors, *pulls, *pull_bytes, *hits, *verdicts, *extract_s,
	    *node_found, *rewritten, *misses, *pulling, *source_checks;
};
extern struct agent_metrics agent_m;

/* agent.c */
/* kind: policy, gpu_probe, image, pull, view, status_write, node_lookup */
void agent_count_error(const char *kind);
struct cache *agent_find_cache(struct agent *a, const char *key);
/* Only once no job of c runs: a running job's completion needs it. */
void agent_forget_cache(struct agent *a, struct cache *c);
/* A new digest or reference: what the old one did or failed says nothing
 * about it. A job still running ends on its own and is then ignored. */
void agent_attempt_reset(struct agent *a, struct attempt *att);
void agent_enqueue(struct agent *a, const char *key, uint64_t delay_ms);
/* ROOT/csi/volumes/<key>[/sub]: where the CSI plugin keeps a volume's own
 * directories (csi/csi_node_dirs.c). -EINVAL for a key that is not one path
 * component (usage records are outside input), -ENAMETOOLONG. */
int agent_volume_dir(const struct agent *a, const char *key, const char *sub, char *buf,
                     size_t len);
/* Set c->away and c->undecided: whether this node is one c is for
 * (spec.nodeSelector, node affinity, a LocalModelCache's node groups);
 * the jobs of a cache that is not (or not yet) for it are cancelled. */
void agent_place_cache(const struct agent *a, struct cache *c);
/* The same for every cache (the Node's labels changed), each enqueued. */
void agent_place_all(struct agent *a);

/* agent_jobs.c */
/* Start what the scheduler lets start. */
void agent_schedule(struct agent *a);
/* Queue a registry job of c (unless one is queued, runs, or waits out its backoff). */
void agent_want(struct agent *a, struct cache *c, enum pull_sched_lane lane);
/* Drop the idle registry clients (a timer's callback). */
void agent_clients_drop_idle(struct loop *l, void *ud);
/* The source checks kept for other caches: made (0 or -ENOMEM), all
 * dropped (the trust changed), freed (no job runs). */
__attribute__((warn_unused_result)) int agent_checks_new(struct agent *a);
void agent_checks_forget(struct agent *a);
void agent_checks_free(struct agent *a);

/* agent_reconcile.c */
/* Run the work queue soon. */
void agent_kick(struct agent *a);

/* agent_report.c */
/* ns's node object ("" for the ClusterGKMCacheNode) needs a status write. */
void agent_mark_dirty(struct agent *a, const char *ns);
void agent_on_nodeobj_event(void *ud, enum objstore_event_type t, const cJSON *obj);
void agent_flush_status(struct loop *l, void *ud);
/* Look for this node's Node now, before the first status write. */
void agent_node_lookup_now(struct agent *a);
void agent_node_tick(struct loop *l, void *ud);

/* agent_gc.c */
void agent_gc_request(struct agent *a);

/* agent_evict.c */
int agent_budget_start(struct agent *a);
void agent_budget_stop(struct agent *a);
/* Check the store against its budget (after a clean-up of the store). */
void agent_budget_check(struct agent *a);
/* A pull of key was refused for room (agent_budget_room()): make it. */
void agent_budget_need(struct agent *a, const char *key, uint64_t bytes, uint64_t room);
/* The room check before a pull's first layer byte (worker threads): an
 * image whose files take bytes fits the store's file system with room
 * (*room: what it needs free) and its cap. -ENOSPC says why in err. */
int agent_budget_room(struct agent *a, uint64_t bytes, uint64_t *room, struct oci_err *err);
/* The eviction's part of the policy's input: store.evicted, and present
 * false while c is evicted. */
void agent_evict_input(struct agent *a, struct cache *c, cJSON *store, bool *present);
/* The user edited c (spec, annotations): an evicted c is pulled again. */
void agent_evict_edited(struct cache *c);

/* agent_captures.c */
void agent_captures_start(struct agent *a);

#endif
