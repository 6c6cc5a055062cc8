/* The node agent: for every GKMCache and ClusterGKMCache, check the image
 * against this node's GPUs, pull, verify and extract it into the store when a
 * GPU can use it, publish the view the CSI plugin mounts, and report per-GPU
 * results in this node's GKMCacheNode / ClusterGKMCacheNode status.
 *
 * Decisions are Lua (gkm.agent, the compat policy); this file gathers the
 * facts for them and carries out what they decide. Everything here runs on
 * the loop thread except the jobs it hands to the worker pool (image
 * configs, pulls, object writes). */
#ifndef GKM_AGENT_H
#define GKM_AGENT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "objstore.h"
#include "oci_registry.h"
#include "trust.h"
#include "signature.h"
#include "workers.h"

struct agent_opts {
	const char *node;            /* this node's name */
	const char *root;            /* store/ and caches/ live here (/var/lib/gkm) */
	const char *run_dir;         /* the CSI plugin's usage/ (/run/gkm) */
	const char *gpu_source;      /* "auto" | "nvml" | "rocm" | "file" */
	const char *gpu_file;        /* for "file" */
	const char *sysfs_root;      /* NULL: /sys */
	const char *nvml_lib;        /* NULL: libnvidia-ml.so.1 */
	unsigned max_pulls;          /* concurrent pulls (default 2) */
	unsigned reprobe_s;          /* GPU re-probe period (default 300) */
	unsigned resync_s;           /* re-check every cache this often (default 30) */
	unsigned status_debounce_ms; /* node status writes are batched (default 200) */
	/* what is trusted: with verify_enabled, a signature by one of its keys
	 * is required before anything is extracted or linked (no key at all:
	 * nothing is, fail closed); referenced, agent_set_trust() replaces it */
	struct trust *trust;
	const struct oci_registry_opts *registry; /* NULL: defaults */
	bool owner_node_refs; /* give node objects an ownerReference to their Node */
	/* gkm's namespace, where a ClusterGKMCache's pull Secrets are (NULL:
	 * $POD_NAMESPACE, else "gkm") */
	const char *namespace_;
	/* namespaces whose caches without spec.pullSecrets the daemon's own
	 * registry credentials serve ("a,b", "*"; NULL: only ClusterGKMCaches) */
	const char *global_credentials;
	/* the store's budget (agent_evict.c): above store_high_percent of its
	 * file system's usage (100: no threshold) the images no pod uses are
	 * evicted until under store_low_percent; store_max_bytes caps what
	 * the images take (0: no cap); an image used less than
	 * store_min_age_s ago stays. 0 for the percents: the defaults */
	unsigned store_high_percent, store_low_percent, store_min_age_s;
	uint64_t store_max_bytes;
};

#define AGENT_STORE_HIGH_PERCENT 85 /* the kubelet's imageGCHighThresholdPercent */
#define AGENT_STORE_LOW_PERCENT 80  /* and imageGCLowThresholdPercent */
#define AGENT_STORE_MIN_AGE_S 120   /* and imageMinimumGCAge */

struct agent;

/* Starts watching and reconciling. policies must outlive the agent (its
 * current engine may be swapped at any time: call agent_policies_changed()).
 * Caller stops with agent_stop(). */
__attribute__((warn_unused_result)) int agent_start(struct loop *l, struct workers *w,
                                                    struct objstore *os,
                                                    struct engine_slot *policies,
                                                    const struct agent_opts *o, struct agent **out);
/* Shutdown is two steps because worker jobs point at the agent: quiesce
 * (no new work), then free the worker pool and run the completions it
 * posted (loop_drain), then agent_stop. */
void agent_quiesce(struct agent *a);
void agent_stop(struct agent *a);

/* Re-evaluate every cache (after a policy reload). */
void agent_policies_changed(struct agent *a);
/* New trusted keys (a reload): caches refused for their signatures get a
 * new try, and a Ready cache whose verifying key is no longer trusted is
 * verified again (no longer mountable until it is). Takes a reference. */
void agent_set_trust(struct agent *a, struct trust *t);
/* Probe the GPUs again now (and re-evaluate if they changed). */
void agent_reprobe(struct agent *a);
/* True once the first GPU probe and the initial lists are done. */
bool agent_ready(const struct agent *a);

#endif
