/* The operator's private state, shared by its parts: operator.c (the
 * watches, aggregation and status writes) and operator_image.c (digests and
 * the operator's own signature check). */
#ifndef GKM_OPERATOR_IMPL_H
#define GKM_OPERATOR_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "oci_ref.h"
#include "operator.h"
#include "soon_timer.h"
#include "strmap.h"

#define MANAGER "gkm-operator"
#define CLUSTER_SCOPE "_cluster"
/* A failed status write is retried with backoff: up to this for an error
 * that may pass (unreachable, 5xx, 429), and up to the longer one for a
 * write the API server refused (400, 401, 403, 413, 422), which the same
 * write cannot change; a new aggregation is written once the backoff ends. */
#define WRITE_BACKOFF_MAX_MS 30000
#define REFUSED_BACKOFF_MAX_MS 300000

enum verdict {
	VERDICT_NONE = 0,
	VERDICT_VERIFIED,
	VERDICT_UNSIGNED,
	VERDICT_UNTRUSTED,
	VERDICT_ERROR
};

struct ocache {
	struct ocache *next;
	char key[320]; /* "<ns or _cluster>/<name>" */
	char ns[64], name[256];
	cJSON *obj;
	cJSON *applied; /* the status last written (without lastUpdated) */
	bool dirty, writing, resolving, verifying;
	unsigned failures;         /* status writes failed in a row */
	uint64_t write_not_before; /* loop_now_ms() before which no write starts */
	char image[600];           /* spec.image, parsed once into ref */
	struct oci_ref ref;        /* when ref_rc is 0; else why not in ref_err */
	int ref_rc;
	bool parsed;
	char ref_err[512];
	char resolved[144]; /* digest the operator resolved for resolved_for */
	char resolved_for[600];
	char resolve_error[512];
	/* the operator's own signature check (with trusted keys) */
	enum verdict verdict; /* for verified_image at verified_digest */
	char verified_image[600], verified_digest[144];
	char verdict_msg[512];
	unsigned verify_failures;   /* registry errors in a row */
	uint64_t verify_not_before; /* loop_now_ms() before which no new check */
};

struct operator_ {
	struct loop *loop;
	struct workers *workers;
	struct objstore *os;
	struct engine_slot *policies;
	struct operator_opts o;
	struct ocache *caches;
	struct strmap cache_index;    /* key -> struct ocache */
	struct node_reports *reports; /* what the node objects report */
	struct strmap nodes;          /* Kubernetes Node names (owned), when watched */
	struct node_labels *labels;   /* the cache labels of Nodes, when watched */
	struct claims *claims;        /* spec.claim (Kubernetes) */
	struct kserve *kserve;        /* LocalModelCaches (--kserve) */
	struct secret_grants *grants; /* the agents' pull Secrets (agent_service_account) */
	bool grants_known;
	bool labels_started;
	struct soon_timer flush_timer;
	uint64_t resync_timer;
	uint64_t seed; /* backoff jitter */
	unsigned synced, want_synced;
	bool stopping;
	unsigned long writes, skipped;
};

/* kind: policy, status_write, resolve, verify, cleanup, node_report */
void operator_count_error(const char *kind);
struct ocache *operator_find_cache(struct operator_ *op, const char *key, bool create);
/* Drop c when its object is gone and no job refers to it. */
void operator_forget_if_gone(struct operator_ *op, struct ocache *c);
/* Aggregate the cache of key again soon. */
void operator_mark(struct operator_ *op, const char *key);

/* operator_image.c */
const char *operator_digest_for(struct operator_ *op, struct ocache *c);
cJSON *operator_verification_of(struct operator_ *op, struct ocache *c, const char *digest);

#endif
