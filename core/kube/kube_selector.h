/* Label selectors: parse the string form the API server takes
 * ("app=demo,tier!=db,env in (a,b),!legacy,gpu"), match it against an
 * object's labels (for lists served from informer caches), and build the
 * string from a map of required labels ({app="demo"} -> "app=demo").
 *
 * Keys and values are checked against Kubernetes' rules (qualified names of
 * at most 63 characters with an optional DNS prefix; values of at most 63
 * characters) so that a bad selector fails here with a message, not as a
 * 400 from the server or a watch that never matches. */
#ifndef GKM_KUBE_SELECTOR_H
#define GKM_KUBE_SELECTOR_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

struct kube_selector;

/* "" or NULL selects everything. Caller frees with kube_selector_free().
 * 0 or -EINVAL with err naming the offending part. */
__attribute__((warn_unused_result)) int
kube_selector_parse(const char *s, struct kube_selector **out, char *err, size_t errlen);
void kube_selector_free(struct kube_selector *sel);

/* labels: the object's metadata.labels (may be NULL). */
bool kube_selector_match(const struct kube_selector *sel, const cJSON *labels);
/* Match an object (reads metadata.labels). */
bool kube_selector_match_object(const struct kube_selector *sel, const cJSON *obj);

/* From an object of string values: "k1=v1,k2=v2" with keys sorted. *out is
 * malloc'ed (caller frees). 0 or -EINVAL (a non-string value, an invalid key
 * or value) with err. */
__attribute__((warn_unused_result)) int kube_selector_from_map(const cJSON *map, char **out,
                                                               char *err, size_t errlen);

/* Kubernetes label key / value rules. */
bool kube_label_key_valid(const char *k);
bool kube_label_value_valid(const char *v);

#endif
