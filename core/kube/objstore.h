/* Where the control loops read and write their objects: the Kubernetes API
 * server (objstore_kube.c) or, in standalone mode, a directory of YAML files
 * (objstore_file.c). The loops (core/node/agent.c, core/node/operator.c) see only this
 * interface, so `gkm up` runs exactly the code the daemons run.
 *
 * Threads: watch() and the event callbacks run on the loop thread. apply(),
 * remove() and event() block: call them from worker threads. */
#ifndef GKM_OBJSTORE_H
#define GKM_OBJSTORE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "loop.h"

#define GKM_GROUP "gkm.io"
#define GKM_API_VERSION "gkm.io/v1alpha1"
/* List page for the node objects (GKMCacheNode, ClusterGKMCacheNode): one
 * reports every cache on its node, 100 KB and more with 100 caches. */
#define GKM_NODEOBJ_LIST_PAGE 10

enum objstore_event_type { OBJSTORE_ADDED = 1, OBJSTORE_MODIFIED, OBJSTORE_DELETED };

/* obj is borrowed for the call. */
typedef void (*objstore_event_fn)(void *ud, enum objstore_event_type type, const cJSON *obj);
/* Called once, on the loop thread, after the initial list was delivered. */
typedef void (*objstore_synced_fn)(void *ud);

struct objstore_watch {
	const char *api_version; /* "gkm.io/v1alpha1", "v1" */
	const char *kind;        /* "GKMCache", "Node", "ConfigMap" */
	const char *namespace_;  /* NULL: all namespaces */
	const char *label_selector;
	const char *field_selector;
	objstore_event_fn on_event;
	objstore_synced_fn on_synced; /* may be NULL */
	void *ud;
	/* The caller keeps what it needs of each object it is given: the store
	 * keeps no copy (Kubernetes: an informer without an object cache), and a DELETED found by a
	 * relist carries only apiVersion, kind and metadata.name/namespace. */
	bool no_cache;
	/* Objects per list page (Kubernetes); 0: the default. A page is parsed
	 * whole, so watches of big objects ask for small pages. */
	unsigned list_page;
	/* Deliver metadata.managedFields (Kubernetes; dropped otherwise): for
	 * a writer that reads which fields its field manager owns. */
	bool keep_managed_fields;
};

struct objstore;

struct objstore_ops {
	/* Start delivering events; objects already there arrive as ADDED. */
	int (*watch)(struct objstore *s, const struct objstore_watch *w);
	/* Server-side apply of obj (apiVersion, kind, metadata.name[,namespace]
	 * and the fields this manager owns); status selects the status
	 * subresource. On success *result (may be NULL) gets the stored object
	 * (caller frees). */
	int (*apply)(struct objstore *s, const cJSON *obj, const char *manager, bool status,
	             cJSON **result, char *err, size_t errlen);
	/* Read one object (with its status); -ENOENT when absent. Caller frees *out. */
	int (*get)(struct objstore *s, const char *api_version, const char *kind, const char *ns,
	           const char *name, cJSON **out, char *err, size_t errlen);
	/* Delete; -ENOENT when already gone. */
	int (*remove)(struct objstore *s, const char *api_version, const char *kind, const char *ns,
	              const char *name, char *err, size_t errlen);
	/* Record an Event about obj (type "Normal" or "Warning"). */
	int (*event)(struct objstore *s, const cJSON *obj, const char *type, const char *reason,
	             const char *message, const char *component);
	void (*free)(struct objstore *s);
};

struct objstore {
	const struct objstore_ops *ops;
};

/* Standalone mode: objects live under dir (created if missing), one YAML
 * file per object written by `gkm apply`, the status beside it written by
 * the loops, events in dir/events.jsonl. Watches poll the directory from the
 * loop every poll_ms. Caller frees with s->ops->free(s). */
__attribute__((warn_unused_result)) int objstore_file_new(const char *dir, struct loop *l,
                                                          unsigned poll_ms, struct objstore **out);

/* Helpers on plain objects. Borrowed strings; "" when absent. */
const char *obj_str(const cJSON *obj, const char *path); /* "metadata.name" */
/* A stable key "namespace/name" or "name" (cluster-scoped). buf >= 320 bytes. */
void obj_key(const cJSON *obj, char *buf, size_t len);
/* Is s a valid DNS-1123 subdomain (names) / label (namespaces)? */
bool obj_valid_name(const char *s);
bool obj_valid_label(const char *s);
/* Set obj[key] = item (replacing any value); takes ownership of item. */
void obj_set(cJSON *obj, const char *key, cJSON *item);
/* A copy of obj without its member key (caller frees); NULL for a NULL obj
 * or out of memory. */
cJSON *obj_without(const cJSON *obj, const char *key);
/* Remove from obj, at every depth, each member whose value is an empty
 * object or becomes one by this removal (items of arrays stay, emptied or
 * not). For the configurations the daemons server-side apply: an applied {}
 * over entries the manager owned becomes null on kube-apiserver, which then
 * refuses the write (422, kubernetes#117447); a member left out is removed
 * with the ownership of what the manager applied before. */
void obj_drop_empty_maps(cJSON *obj);
/* Lua has one empty table for {} and []: each of obj's n members named in
 * keys that is an empty object becomes an empty array (a CRD's list). */
void obj_empty_lists(cJSON *obj, const char *const *keys, size_t n);
/* RFC 3339 UTC time now, "2026-11-21T10:00:00Z". buf >= 32 bytes. */
void obj_now(char *buf, size_t len);

#endif
