/* The JSONPatch the placement webhook answers a Pod with: node affinity on
 * each cache's Node label, image volume references pinned to a digest, and
 * the annotation that says what was decided and why. Pure functions.
 *
 * Affinity, per cache (matchExpressions {key, operator: In, values: [ready]}):
 *  - required: ANDed into every nodeSelectorTerm of
 *    requiredDuringSchedulingIgnoredDuringExecution, or one new term when
 *    there is none;
 *  - preferred: one preferredSchedulingTerm with the given weight.
 * An identical expression or term already there is not added again, so a
 * pod reviewed twice (reinvocation) is patched once. */
#ifndef GKM_POD_PATCH_H
#define GKM_POD_PATCH_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "pod_volumes.h"

enum pod_place_mode { POD_PLACE_NONE = 0, POD_PLACE_REQUIRED, POD_PLACE_PREFERRED };

struct pod_place {
	const char *key; /* the Node label key */
	enum pod_place_mode mode;
	int weight; /* preferred: 1..100 */
};

/* An image volume whose reference is replaced. */
struct pod_pin {
	int index; /* in spec.volumes */
	const char *reference;
};

/* spec.affinity (may be NULL) with the placements added: a new object the
 * caller frees, in *out, or NULL when the placements change nothing. 0, or
 * -EINVAL when the affinity present is not shaped as Kubernetes defines it
 * (err says where), -ENOMEM. */
__attribute__((warn_unused_result)) int pod_patch_affinity(const cJSON *affinity,
                                                           const struct pod_place *pl, size_t n,
                                                           cJSON **out, char *err, size_t errlen);

/* The whole patch (JSON text, caller frees) for the pod p was read as:
 * affinity when a placement changes it, each pin, the operations of env_ops
 * (a JSONPatch array, may be NULL: its items are moved, pod_env.h), and
 * annotation annotation_key = annotation_value (NULL: none). *out is NULL when nothing
 * changes. 0, -EINVAL (err), -ENOMEM. */
__attribute__((warn_unused_result)) int
pod_patch_build(const struct pod_info *p, const struct pod_place *pl, size_t npl,
                const struct pod_pin *pins, size_t npins, const char *annotation_key,
                const char *annotation_value, cJSON *env_ops, char **out, char *err, size_t errlen);

#endif
