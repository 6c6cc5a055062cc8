/* The admission decisions: AdmissionReview v1 requests for GKMCache and
 * ClusterGKMCache on /mutate and /validate, and for Pods on /mutate-pods
 * (placement, image volumes; see pod_review.c), answered within a deadline.
 *
 * Threads: reviewer_handle() runs on the HTTPS server's threads and does
 * only parsing (envelope, object, image reference); what can be answered
 * from the request alone (not ours, malformed) is answered there. The rest
 * moves to the loop thread, which owns the caches, the trust snapshot and
 * the policy engine: a cached digest and verdict are decided at once; a
 * miss becomes a registry job on the worker pool (one job per image and
 * key set, shared by every review waiting for it), and the review is
 * denied if the job is not back by the deadline. The job's result is cached
 * whenever it arrives.
 *
 * /mutate allows with a JSONPatch that sets gkm.io/resolvedDigest, or
 * denies with the policy's reason and message. /validate refuses what
 * /mutate would refuse, and an annotation that is missing or differs from
 * the digest the webhook resolves (on UPDATE with an unchanged spec.image
 * the digest stays the one recorded before). A kyverno.io/verify-images
 * annotation is never passed to the policy: anyone can write it. */
#ifndef GKM_REVIEWER_H
#define GKM_REVIEWER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache_catalog.h"

#include "engine.h"
#include "https_server.h"
#include "loop.h"
#include "oci_registry.h"
#include "placement_events.h"
#include "trust.h"
#include "workers.h"

struct reviewer_opts {
	struct loop *loop;
	struct workers *workers;
	struct engine_slot *policy;        /* loop-owned; its current engine decides */
	uint64_t deadline_ms;              /* every review is answered within this */
	uint64_t resolve_ttl_ms;           /* tag -> digest */
	uint64_t verified_ttl_ms;          /* verdicts with a verified signature */
	uint64_t rejected_ttl_ms;          /* unsigned or not verified (a signature may come) */
	size_t cache_entries;              /* per cache */
	unsigned max_jobs;                 /* registry checks in flight */
	struct oci_registry_opts registry; /* its strings must outlive the reviewer */
	/* namespaces whose caches registry's credentials serve ("a,b", "*";
	 * ""/NULL: only cluster-scoped caches; see core/node/pull_secret.h) */
	const char *global_credentials;
	/* Pods. catalog NULL: /mutate-pods is not served (404). */
	struct cache_catalog *catalog;         /* loop-owned, fed by the watches */
	const char *const *exclude_namespaces; /* NULL-terminated; pods there are never touched */
	struct placement_events *events;       /* Events about placements, or NULL */
};

struct reviewer;

/* trust: the first snapshot (a reference is taken). Caller frees with
 * reviewer_free(). */
__attribute__((warn_unused_result)) int reviewer_new(const struct reviewer_opts *o,
                                                     struct trust *trust, struct reviewer **out);

/* Loop thread: later reviews use t (a reference is taken). Cached verdicts
 * are keyed by the key set, so a new key set means new verifications. */
void reviewer_set_trust(struct reviewer *r, struct trust *t);

/* Loop thread: whether the catalog holds complete lists. Until it does, a
 * pod whose image volume may name a cache is refused (WebhookNotReady):
 * its verification cannot be skipped. */
void reviewer_set_catalog_synced(struct reviewer *r, bool synced);

/* The https_handler (ud is the reviewer). */
void reviewer_handle(struct https_request *rq, const char *path, const char *body, size_t len,
                     void *ud);

/* Shutting down, in this order once loop_run() returned:
 *   reviewer_refuse_new()  new requests are denied at once (ShuttingDown);
 *   workers_free() then loop_drain()  running registry checks finish and
 *                          the reviews waiting for them are decided;
 *   reviewer_close()       whatever still waits is denied (ShuttingDown)
 *                          and the jobs left are released. */
void reviewer_refuse_new(struct reviewer *r);
void reviewer_close(struct reviewer *r);
void reviewer_free(struct reviewer *r);

/* Reviews waiting on the loop or a registry job (for /readyz and tests). */
unsigned reviewer_waiting(struct reviewer *r);

#endif
