#include "kube_affinity.h"

#include <stdlib.h>
#include <string.h>

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : "";
}

static bool in_values(const cJSON *values, const char *v)
{
	const cJSON *x;
	cJSON_ArrayForEach(x, values)
	{
		if (cJSON_IsString(x) && !strcmp(x->valuestring, v))
			return true;
	}
	return false;
}

static bool compare(const char *v, const cJSON *values, bool greater)
{
	const cJSON *first = cJSON_GetArrayItem(values, 0);
	char *end1, *end2;
	if (!v || !cJSON_IsString(first))
		return false;
	long long a = strtoll(v, &end1, 10), b = strtoll(first->valuestring, &end2, 10);
	if (*end1 || *end2 || !*v || !*first->valuestring)
		return false;
	return greater ? a > b : a < b;
}

/* One requirement; value is the label's (or field's) value, NULL if absent. */
static bool requirement(const cJSON *req, const char *value)
{
	const char *op = str(req, "operator");
	const cJSON *values = cJSON_GetObjectItemCaseSensitive(req, "values");
	if (!strcmp(op, "In"))
		return value && in_values(values, value);
	if (!strcmp(op, "NotIn"))
		return !value || !in_values(values, value);
	if (!strcmp(op, "Exists"))
		return value != NULL;
	if (!strcmp(op, "DoesNotExist"))
		return value == NULL;
	if (!strcmp(op, "Gt") || !strcmp(op, "Lt"))
		return compare(value, values, op[0] == 'G');
	return false; /* unknown: selects nothing, as Kubernetes */
}

bool kube_affinity_term(const cJSON *term, const char *node, const cJSON *labels)
{
	const cJSON *r, *exprs = cJSON_GetObjectItemCaseSensitive(term, "matchExpressions"),
	                *fields = cJSON_GetObjectItemCaseSensitive(term, "matchFields");
	if (cJSON_GetArraySize(exprs) + cJSON_GetArraySize(fields) == 0)
		return false; /* an empty term selects nothing, as Kubernetes */
	cJSON_ArrayForEach(r, exprs)
	{
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(labels, str(r, "key"));
		if (!requirement(r, cJSON_IsString(l) ? l->valuestring : NULL))
			return false;
	}
	cJSON_ArrayForEach(r, fields)
	{
		bool name = !strcmp(str(r, "key"), "metadata.name");
		if (!requirement(r, name ? node : NULL))
			return false;
	}
	return true;
}

static const cJSON *required_terms(const cJSON *spec)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(spec, "affinity");
	a = cJSON_GetObjectItemCaseSensitive(a, "nodeAffinity");
	a = cJSON_GetObjectItemCaseSensitive(a, "requiredDuringSchedulingIgnoredDuringExecution");
	return cJSON_GetObjectItemCaseSensitive(a, "nodeSelectorTerms");
}

bool kube_affinity_selects(const cJSON *spec, const char *node, const cJSON *labels)
{
	const cJSON *kv;
	cJSON_ArrayForEach(kv, cJSON_GetObjectItemCaseSensitive(spec, "nodeSelector"))
	{
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(labels, kv->string);
		if (!cJSON_IsString(kv) || !cJSON_IsString(l) ||
		    strcmp(l->valuestring, kv->valuestring))
			return false;
	}
	const cJSON *terms = required_terms(spec), *t;
	if (!terms)
		return true;
	cJSON_ArrayForEach(t, terms)
	{
		if (kube_affinity_term(t, node, labels))
			return true;
	}
	return false; /* terms, none of which selects (an empty list selects nothing) */
}

bool kube_affinity_set(const cJSON *spec)
{
	const cJSON *sel = cJSON_GetObjectItemCaseSensitive(spec, "nodeSelector");
	return (sel && sel->child) || required_terms(spec) != NULL;
}
