#include "pod_patch.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission_review.h"
#include "cache_label.h"
#include "errbuf.h"

/* parent[name] as an object (or an array), created when absent or null.
 * NULL with err when it is something else (-EINVAL), or out of memory
 * (err empty). */
static cJSON *child(cJSON *parent, const char *name, bool array, const char *where, char *err,
                    size_t errlen)
{
	cJSON *c = cJSON_GetObjectItemCaseSensitive(parent, name);
	if (c && !cJSON_IsNull(c)) {
		if (array ? cJSON_IsArray(c) : cJSON_IsObject(c))
			return c;
		errbuf_set(err, errlen, "%s.%s must be %s", where, name,
		           array ? "a list" : "an object");
		return NULL;
	}
	errbuf_set(err, errlen, "%s", "");
	cJSON *n = array ? cJSON_CreateArray() : cJSON_CreateObject();
	if (!n)
		return NULL;
	if (c ? !cJSON_ReplaceItemInObjectCaseSensitive(parent, name, n)
	      : !cJSON_AddItemToObject(parent, name, n)) {
		cJSON_Delete(n);
		return NULL;
	}
	return n;
}

static cJSON *expression(const char *key)
{
	cJSON *e = cJSON_CreateObject(), *values;
	if (!e || !cJSON_AddStringToObject(e, "key", key) ||
	    !cJSON_AddStringToObject(e, "operator", "In") ||
	    !(values = cJSON_AddArrayToObject(e, "values")) ||
	    !cJSON_AddItemToArray(values, cJSON_CreateString(CACHE_LABEL_VALUE))) {
		cJSON_Delete(e);
		return NULL;
	}
	return e;
}

/* Is e exactly {key, operator: In, values: [ready]}? Checked member by
 * member: a pod's affinity is outside input, and comparing whole trees
 * (cJSON_Compare) takes time exponential in their depth. */
static bool is_expression(const cJSON *e, const char *key)
{
	const cJSON *k = cJSON_GetObjectItemCaseSensitive(e, "key");
	const cJSON *op = cJSON_GetObjectItemCaseSensitive(e, "operator");
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "values");
	return cJSON_IsObject(e) && cJSON_GetArraySize(e) == 3 && cJSON_IsString(k) &&
	       strcmp(k->valuestring, key) == 0 && cJSON_IsString(op) &&
	       strcmp(op->valuestring, "In") == 0 && cJSON_IsArray(v) &&
	       cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child) &&
	       strcmp(v->child->valuestring, CACHE_LABEL_VALUE) == 0;
}

/* Is t exactly {weight, preference: {matchExpressions: [our expression]}}? */
static bool is_preferred_term(const cJSON *t, const struct pod_place *p)
{
	const cJSON *w = cJSON_GetObjectItemCaseSensitive(t, "weight");
	const cJSON *pref = cJSON_GetObjectItemCaseSensitive(t, "preference");
	const cJSON *ex = cJSON_GetObjectItemCaseSensitive(pref, "matchExpressions");
	return cJSON_IsObject(t) && cJSON_GetArraySize(t) == 2 && cJSON_IsNumber(w) &&
	       w->valuedouble == p->weight && cJSON_IsObject(pref) &&
	       cJSON_GetArraySize(pref) == 1 && cJSON_IsArray(ex) && cJSON_GetArraySize(ex) == 1 &&
	       is_expression(ex->child, p->key);
}

static int add_required(cJSON *node, const struct pod_place *pl, size_t n, int *added, char *err,
                        size_t errlen)
{
	const char *w = "spec.affinity.nodeAffinity";
	cJSON *req =
	    child(node, "requiredDuringSchedulingIgnoredDuringExecution", false, w, err, errlen);
	cJSON *terms = req ? child(req, "nodeSelectorTerms", true,
	                           "spec.affinity.nodeAffinity.requiredDuringScheduling"
	                           "IgnoredDuringExecution",
	                           err, errlen)
	                   : NULL;
	if (!terms)
		return err[0] ? -EINVAL : -ENOMEM;
	if (cJSON_GetArraySize(terms) == 0) {
		cJSON *t = cJSON_CreateObject();
		if (!t || !cJSON_AddItemToArray(terms, t)) {
			cJSON_Delete(t);
			return -ENOMEM;
		}
		(*added)++;
	}
	cJSON *term;
	int i = 0;
	cJSON_ArrayForEach(term, terms)
	{
		char where[128];
		snprintf(where, sizeof(where), "%s.required...nodeSelectorTerms[%d]", w, i++);
		if (!cJSON_IsObject(term)) {
			errbuf_set(err, errlen, "%s must be an object", where);
			return -EINVAL;
		}
		cJSON *exprs = child(term, "matchExpressions", true, where, err, errlen);
		if (!exprs)
			return err[0] ? -EINVAL : -ENOMEM;
		for (size_t k = 0; k < n; k++) {
			if (pl[k].mode != POD_PLACE_REQUIRED)
				continue;
			const cJSON *e;
			bool have = false;
			cJSON_ArrayForEach(e, exprs) have = have || is_expression(e, pl[k].key);
			cJSON *add = have ? NULL : expression(pl[k].key);
			if (!have && (!add || !cJSON_AddItemToArray(exprs, add))) {
				cJSON_Delete(add);
				return -ENOMEM;
			}
			*added += !have;
		}
	}
	return 0;
}

static int add_preferred(cJSON *node, const struct pod_place *p, int *added, char *err,
                         size_t errlen)
{
	cJSON *prefs = child(node, "preferredDuringSchedulingIgnoredDuringExecution", true,
	                     "spec.affinity.nodeAffinity", err, errlen);
	if (!prefs)
		return err[0] ? -EINVAL : -ENOMEM;
	const cJSON *have;
	cJSON_ArrayForEach(have, prefs)
	{
		if (is_preferred_term(have, p))
			return 0;
	}
	cJSON *t = cJSON_CreateObject(), *pref, *exprs;
	if (!t || !cJSON_AddNumberToObject(t, "weight", p->weight) ||
	    !(pref = cJSON_AddObjectToObject(t, "preference")) ||
	    !(exprs = cJSON_AddArrayToObject(pref, "matchExpressions")) ||
	    !cJSON_AddItemToArray(exprs, expression(p->key)) || !cJSON_AddItemToArray(prefs, t)) {
		cJSON_Delete(t);
		return -ENOMEM;
	}
	(*added)++;
	return 0;
}

int pod_patch_affinity(const cJSON *affinity, const struct pod_place *pl, size_t n, cJSON **out,
                       char *err, size_t errlen)
{
	bool required = false, preferred = false;
	int rc = -ENOMEM, added = 0;
	for (size_t i = 0; i < n; i++) {
		required = required || pl[i].mode == POD_PLACE_REQUIRED;
		preferred = preferred || pl[i].mode == POD_PLACE_PREFERRED;
	}
	if (affinity && !cJSON_IsNull(affinity) && !cJSON_IsObject(affinity)) {
		errbuf_set(err, errlen, "spec.affinity must be an object");
		return -EINVAL;
	}
	*out = NULL;
	if (!required && !preferred)
		return 0;
	cJSON *a = affinity && cJSON_IsObject(affinity) ? cJSON_Duplicate(affinity, true)
	                                                : cJSON_CreateObject();
	if (!a)
		return -ENOMEM;
	errbuf_set(err, errlen, "%s", "");
	cJSON *node = child(a, "nodeAffinity", false, "spec.affinity", err, errlen);
	if (!node) {
		rc = err[0] ? -EINVAL : -ENOMEM;
		goto out;
	}
	if (required && (rc = add_required(node, pl, n, &added, err, errlen)) != 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		if (pl[i].mode == POD_PLACE_PREFERRED &&
		    (rc = add_preferred(node, &pl[i], &added, err, errlen)) != 0)
			goto out;
	}
	if (added)
		*out = a;
	else
		cJSON_Delete(a);
	return 0;
out:
	cJSON_Delete(a);
	return rc;
}

int pod_patch_build(const struct pod_info *p, const struct pod_place *pl, size_t npl,
                    const struct pod_pin *pins, size_t npins, const char *annotation_key,
                    const char *annotation_value, cJSON *env_ops, char **out, char *err,
                    size_t errlen)
{
	cJSON *ops = cJSON_CreateArray(), *aff = NULL, *o;
	int rc = -ENOMEM;
	if (!ops)
		return -ENOMEM;
	if (npl) {
		if ((rc = pod_patch_affinity(p->affinity, pl, npl, &aff, err, errlen)) != 0)
			goto out;
		rc = -ENOMEM;
		if (aff) {
			if (!(o = admission_patch_op(ops, "add", "/spec/affinity")))
				goto out;
			cJSON_AddItemToObject(o, "value", aff);
			aff = NULL;
		}
	}
	for (size_t i = 0; i < npins; i++) {
		char path[64];
		bool same = false;
		for (size_t k = 0; k < p->n; k++)
			same = same || (p->vols[k].index == pins[i].index && p->vols[k].reference &&
			                strcmp(p->vols[k].reference, pins[i].reference) == 0);
		if (same)
			continue;
		snprintf(path, sizeof(path), "/spec/volumes/%d/image/reference", pins[i].index);
		if (!(o = admission_patch_op(ops, "replace", path)) ||
		    !cJSON_AddStringToObject(o, "value", pins[i].reference))
			goto out;
	}
	for (cJSON *e = env_ops ? env_ops->child : NULL; e;) {
		cJSON *next = e->next;
		if (!cJSON_AddItemToArray(ops, cJSON_DetachItemViaPointer(env_ops, e)))
			goto out;
		e = next;
	}
	if (annotation_key && annotation_value) {
		const struct admission_annotation a = {annotation_key, annotation_value};
		if (admission_annotation_ops(ops, p->annotations, p->has_metadata, &a, 1) != 0)
			goto out;
	}
	*out = NULL;
	if (cJSON_GetArraySize(ops) && !(*out = cJSON_PrintUnformatted(ops)))
		goto out;
	rc = 0;
out:
	cJSON_Delete(aff);
	cJSON_Delete(ops);
	return rc;
}
