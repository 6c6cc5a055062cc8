/* Which Nodes an object selects, as the scheduler reads a pod's
 * spec.nodeSelector and required node affinity: nodeSelectorTerms (any term
 * selects; in a term every matchExpressions requirement on the Node's labels
 * and every matchFields requirement on metadata.name must hold; operators
 * In, NotIn, Exists, DoesNotExist, Gt, Lt; an unknown operator, and a term
 * with no requirement, select nothing). */
#ifndef GKM_KUBE_AFFINITY_H
#define GKM_KUBE_AFFINITY_H

#include <cjson/cJSON.h>
#include <stdbool.h>

/* One nodeSelectorTerm against Node node with labels (NULL: none). */
bool kube_affinity_term(const cJSON *term, const char *node, const cJSON *labels);

/* A spec's nodeSelector (every key equal) and
 * affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
 * (any of its nodeSelectorTerms): true when both hold, or are absent. */
bool kube_affinity_selects(const cJSON *spec, const char *node, const cJSON *labels);

/* Whether spec names Nodes at all (a nodeSelector or required node affinity). */
bool kube_affinity_set(const cJSON *spec);

#endif
