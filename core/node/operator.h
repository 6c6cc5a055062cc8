/* The operator: aggregates the node reports of every cache into its status
 * (policies/aggregate.lua), resolves digests where no webhook does, checks
 * signatures where it has trusted keys, records Events, removes node
 * objects of nodes that are gone, and labels each Node with the caches
 * Ready on it (node_labels.h; the aggregation says where: labeledNodes).
 *
 * Writes are debounced: a burst of node reports for a cache gives one status
 * write per debounce window, and a write that would not change the status is
 * not made. Loop thread, plus worker jobs for the writes and the registry. */
#ifndef GKM_OPERATOR_H
#define GKM_OPERATOR_H

#include <stdbool.h>

#include "engine.h"
#include "objstore.h"
#include "oci_registry.h"
#include "signature.h"
#include "trust.h"
#include "workers.h"

struct operator_opts {
	/* Where no admission webhook runs (verification off, standalone mode) the
	 * operator resolves tags to digests itself, and says so in Verified. */
	bool resolve_digests;
	bool verification_enabled;
	bool watch_nodes;     /* Kubernetes: remove node objects of deleted Nodes,
	                       * and set the cache labels of Nodes */
	bool kserve;          /* Kubernetes: kernel caches of LocalModelCaches (kserve.h) */
	unsigned debounce_ms; /* default 250 */
	unsigned resync_s;    /* default 60 */
	const struct oci_registry_opts *registry;
	/* Trusted keys (may be NULL or empty): the operator checks each cache's
	 * signature itself, through the cache's own image reference, and says in
	 * Verified what it found. Nothing else (an annotation anyone with write
	 * access can set) makes a cache Verified here. Referenced by the
	 * operator; operator_set_trust() replaces it. */
	struct trust *trust;
	/* as agent_opts.global_credentials */
	const char *global_credentials;
	/* Kubernetes: the node agents' ServiceAccount ("ns/name"): they may read
	 * only the pull Secrets caches name, through Roles the operator keeps
	 * (secret_grants.h); NULL: not managed */
	const char *agent_service_account;
};

struct operator_;

__attribute__((warn_unused_result)) int
operator_start(struct loop *l, struct workers *w, struct objstore *os, struct engine_slot *policies,
               const struct operator_opts *o, struct operator_ **out);
void operator_quiesce(struct operator_ *op);
void operator_stop(struct operator_ *op);
void operator_policies_changed(struct operator_ *op);
/* New trusted keys: every verdict is made again. Takes a reference. */
void operator_set_trust(struct operator_ *op, struct trust *t);
bool operator_ready(const struct operator_ *op);

/* Status writes made and skipped (unchanged), for metrics and benchmarks. */
void operator_counts(const struct operator_ *op, unsigned long *writes, unsigned long *skipped);

#endif
