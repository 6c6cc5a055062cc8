/* Controllers whose reconcile loop is Lua.
 *
 * A controller is a Lua module (lua/gkm/<name>.lua, or a policy bundle's
 * module) that declares what to watch and how to reconcile one object:
 *
 *   local kube = require 'gkm.kube'
 *   local M = {}
 *   -- config: the table the daemon passes (e.g. { node = "node-1" })
 *   function M.watches(config)
 *     return {
 *       -- the first watch is the primary kind: its keys are reconciled
 *       { apiVersion = "gkm.io/v1alpha1", kind = "GKMCache" },
 *       -- secondary watches feed caches (kube.get/list) and may enqueue keys
 *       { apiVersion = "gkm.io/v1alpha1", kind = "GKMCacheNode",
 *         labelSelector = "gkm.io/node=" .. config.node,   -- or { ["gkm.io/node"] = ... }
 *         enqueue = "map", debounce_ms = 500 },
 *     }
 *   end
 *   -- optional, for enqueue = "map": which primary keys an event concerns
 *   function M.map(ev)        -- ev = { watch = 2, type = "MODIFIED", object = {...} }
 *     return { "ns/name", ... }
 *   end
 *   function M.reconcile(req) -- req = { key, namespace, name, object (nil when gone), config }
 *     local obj = req.object
 *     kube.apply_status({ apiVersion = ..., kind = ..., metadata = {...}, status = {...} })
 *     kube.event(obj, "Normal", "Reconciled", "all good")
 *     return { requeue_after = 30 }   -- or { requeue = true }, or nil
 *   end
 *   return M
 *
 * Watch fields: apiVersion, kind (required); namespace, labelSelector
 * (string or map), fieldSelector; enqueue = "self" (default for the first
 * watch), "owner" (the ownerReferences of the primary kind), "map" (calls
 * M.map) or "none" (default for the others: cache only); debounce_ms (a burst
 * of events gives one reconcile per key); resync_s (re-enqueue every cached
 * object periodically).
 *
 * The runtime: informers (one per watch) feed a work queue of primary keys
 * (de-duplicated, rate-limited requeue on failure, requeue_after, at most
 * max_in_flight keys in flight). Reconciles start once every watch has
 * listed. Each reconcile runs on the loop thread through the engine; the
 * actions it queued with gkm.kube (apply, apply_status, delete, event) are
 * checked when queued and run only after the reconcile returned, in order,
 * on a worker thread; an error, a failed action or a bad return value
 * requeues the key with backoff (a Retry-After from the server raises it).
 * A key is never reconciled twice at the same time. */
#ifndef GKM_KUBE_CONTROLLER_H
#define GKM_KUBE_CONTROLLER_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "engine.h"
#include "kube_client.h"
#include "kube_informer.h"
#include "kube_workqueue.h"
#include "loop.h"
#include "workers.h"

#define KUBE_CONTROLLER_MAX_WATCHES 16
#define KUBE_CONTROLLER_MAX_ACTIONS 256 /* per reconcile */

struct kube_controller_opts {
	struct loop *loop;
	struct workers *workers;
	struct kube_client *client;
	struct engine_slot *engine; /* the daemon's; the current engine is used per call */
	const char *module;         /* "gkm.operator" */
	const cJSON *config;        /* copied; passed to watches() and each reconcile */
	const char *field_manager;  /* for applies: "gkm-operator", "gkm-agent/node-1" */
	const char *component;      /* reporter of Events; default the field manager */
	const char *host;           /* node name for Events, or NULL */
	struct kube_workqueue_opts queue;
};

struct kube_controller_stats {
	uint64_t reconciles, reconcile_errors, actions, action_errors, requeues;
};

struct kube_controller;

/* Call module.watches(config), check it, resolve every kind (built-in kinds
 * at once, others by discovery, which blocks: call before the loop runs or
 * accept the wait) and start the informers. On failure err says why and
 * nothing is left running. Stop with kube_controller_stop(). Loop thread. */
__attribute__((warn_unused_result)) int kube_controller_start(const struct kube_controller_opts *o,
                                                              struct kube_controller **out,
                                                              char *err, size_t errlen);
/* Stop the informers and reconciles; actions already running finish on their
 * worker and are then dropped. Loop thread. */
void kube_controller_stop(struct kube_controller *c);
struct kube_controller_stats kube_controller_stats(const struct kube_controller *c);
/* True once every watch has listed. */
bool kube_controller_synced(const struct kube_controller *c);

/* ---- For gkm.kube (core/lua/lua_kube.c): the reconcile in progress. ---- */

struct kube_reconcile;
/* The reconcile running now on this thread, or NULL. */
struct kube_reconcile *kube_reconcile_current(void);
/* The informers of this controller for apiVersion (NULL: any) and kind.
 * Returns how many were written to out (at most max). */
size_t kube_reconcile_informers(struct kube_reconcile *r, const char *api_version, const char *kind,
                                struct kube_informer **out, size_t max);
/* Queue an action (ownership of action passes): {op = "apply" | "delete" |
 * "event", ...}. -E2BIG past KUBE_CONTROLLER_MAX_ACTIONS. */
int kube_reconcile_add_action(struct kube_reconcile *r, cJSON *action);

#endif
