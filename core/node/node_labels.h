/* The Node labels the operator keeps: on each Node, the label of every cache
 * Ready there (the scheme of cache_label.h: key -> "ready").
 *
 * Each Node gets one server-side apply of its metadata.labels under the
 * field manager NODE_LABELS_MANAGER, holding the node's full set: a label
 * the operator no longer applies is removed by the API server's ownership
 * rules, and labels other managers own are never touched. What the manager
 * owns is read from the Node's managedFields (the Node watch keeps them), so
 * nothing is written while it already matches, a restarted operator removes
 * the labels of caches deleted while it was down, and a label someone else
 * removed or took over is applied again.
 *
 * Applies are debounced, one at a time per node, on worker threads; a failed
 * one is retried with backoff. Each names the Node's uid: an apply never
 * creates a Node (the API server answers Conflict when it is gone) and never
 * labels a new Node that took a deleted one's name (Invalid).
 *
 * Loop thread, but for node_labels_owned() and node_labels_apply_obj(),
 * which are pure. */
#ifndef GKM_NODE_LABELS_H
#define GKM_NODE_LABELS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "objstore.h"
#include "workers.h"

#define NODE_LABELS_MANAGER "gkm-operator/node-labels"

struct node_labels;

/* debounce_ms: the delay between a Node event and the check of that node.
 * Nothing is applied before node_labels_start(). Caller frees with
 * node_labels_free(). */
__attribute__((warn_unused_result)) int node_labels_new(struct loop *l, struct workers *w,
                                                        struct objstore *os, unsigned debounce_ms,
                                                        struct node_labels **out);
/* Applies in flight finish (their done callbacks need nl): call after the
 * workers were freed and the loop drained. NULL: no-op. */
void node_labels_free(struct node_labels *nl);
/* No new applies (shutdown). */
void node_labels_quiesce(struct node_labels *nl);

/* The cache whose label is key is Ready on nodes[0..n) (any order,
 * duplicates allowed), and nowhere else: replaces what was set for key
 * before; the nodes that gain or lose the label are checked at once (the
 * caller's aggregation is the debounce). 0 or -ENOMEM (nothing changed). */
__attribute__((warn_unused_result)) int node_labels_set(struct node_labels *nl, const char *key,
                                                        const char *const *nodes, size_t n);
/* The cache whose label is key is gone: its label goes from every node
 * (after the debounce). */
void node_labels_drop(struct node_labels *nl, const char *key);

/* A Node as the watch delivers it (ADDED or MODIFIED, with managedFields).
 * nl NULL: no-op, as for node_labels_node_deleted(). */
void node_labels_node(struct node_labels *nl, const cJSON *node);
void node_labels_node_deleted(struct node_labels *nl, const char *name);

/* Start applying, and check every node: call once the caller knows where
 * every cache is Ready (a partial picture would take labels away). */
void node_labels_start(struct node_labels *nl);
/* Check every node again (the periodic resync). */
void node_labels_resync(struct node_labels *nl);

/* The label keys that node should carry, sorted (caller frees the array
 * with node_labels_keys_free(); the strings are borrowed from nl until its
 * next change). 0 or -ENOMEM. */
__attribute__((warn_unused_result)) int
node_labels_wanted(const struct node_labels *nl, const char *node, const char ***keys, size_t *n);

/* The labels node carries under NODE_LABELS_MANAGER: the keys its Apply
 * entry of the main resource owns in managedFields whose value is still
 * "ready", sorted. Caller frees with node_labels_owned_free() (the keys and
 * the array). 0 or -ENOMEM; none: *n = 0. */
__attribute__((warn_unused_result)) int node_labels_owned(const cJSON *node, char ***keys,
                                                          size_t *n);
void node_labels_owned_free(char **keys, size_t n);
void node_labels_keys_free(const char **keys);

/* The server-side apply configuration of Node name (uid) carrying exactly
 * keys[0..n) (none: no labels member at all, which removes every label the
 * manager owns). Caller frees; NULL when out of memory. */
cJSON *node_labels_apply_obj(const char *name, const char *uid, const char *const *keys, size_t n);

#endif
