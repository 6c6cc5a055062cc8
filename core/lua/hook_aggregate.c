/* The aggregation policy hook (policies/aggregate.lua) and its validator:
 * the result becomes a cache's status, so every field is checked here. */
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "kube_client.h"
#include "policy_check.h"

static int count_field(const cJSON *r, const char *name, char *err, size_t errlen)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, name);
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 ||
	    v->valuedouble != (double)(long long)v->valuedouble) {
		snprintf(err, errlen, "'%s' must be a non-negative integer", name);
		return -1;
	}
	return 0;
}

static int check_condition(const cJSON *c, char *err, size_t errlen)
{
	static const char *const strings[] = {"type", "status", "reason", "message",
	                                      "lastTransitionTime"};
	for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
		if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c, strings[i]))) {
			snprintf(err, errlen, "every condition needs a string '%s'", strings[i]);
			return -1;
		}
	}
	const char *status = cJSON_GetObjectItemCaseSensitive(c, "status")->valuestring;
	if (strcmp(status, "True") && strcmp(status, "False") && strcmp(status, "Unknown"))
		return policy_check_fail(err, errlen,
		                         "a condition status must be True, False or Unknown");
	if (!policy_check_reason(cJSON_GetObjectItemCaseSensitive(c, "reason")->valuestring) ||
	    !policy_check_reason(cJSON_GetObjectItemCaseSensitive(c, "type")->valuestring))
		return policy_check_fail(err, errlen,
		                         "condition type and reason must be CamelCase words");
	return 0;
}

/* reason -> node names (failedNodeConditions, incompatibleNodeConditions);
 * absent or empty is fine. */
static int check_reason_map(const cJSON *r, const char *name, char *err, size_t errlen)
{
	const cJSON *map = cJSON_GetObjectItemCaseSensitive(r, name), *reason, *n;
	if (map && !cJSON_IsObject(map) && !(cJSON_IsArray(map) && !map->child)) {
		snprintf(err, errlen, "'%s' must map reasons to nodes", name);
		return -1;
	}
	cJSON_ArrayForEach(reason, map)
	{
		if (!reason->string || !policy_check_reason(reason->string) ||
		    !cJSON_IsArray(reason)) {
			snprintf(err, errlen,
			         "'%s' must map CamelCase reasons to lists of node names", name);
			return -1;
		}
		cJSON_ArrayForEach(n, reason)
		{
			if (!cJSON_IsString(n))
				return policy_check_fail(err, errlen, "node names must be strings");
		}
	}
	return 0;
}

static int validate_aggregate(const cJSON *r, char *err, size_t errlen)
{
	static const char *const counts[] = {"totalNodes", "readyNodes", "failedNodes",
	                                     "podsUsing"};
	if (!cJSON_IsObject(r))
		return policy_check_fail(err, errlen, "want a status table");
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
		if (count_field(r, counts[i], err, errlen) != 0)
			return -1;
	if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, "resolvedDigest")) ||
	    !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, "lastUpdated")))
		return policy_check_fail(err, errlen,
		                         "'resolvedDigest' and 'lastUpdated' must be strings");
	const cJSON *conds = cJSON_GetObjectItemCaseSensitive(r, "conditions"), *c;
	if (!(cJSON_IsArray(conds) || (cJSON_IsObject(conds) && !conds->child)))
		return policy_check_fail(err, errlen, "'conditions' must be a list");
	cJSON_ArrayForEach(c, conds)
	{
		if (check_condition(c, err, errlen) != 0)
			return -1;
	}
	/* optional: policies written before it keep working */
	if (cJSON_GetObjectItemCaseSensitive(r, "incompatibleNodes") &&
	    count_field(r, "incompatibleNodes", err, errlen) != 0)
		return -1;
	if (check_reason_map(r, "failedNodeConditions", err, errlen) != 0 ||
	    check_reason_map(r, "incompatibleNodeConditions", err, errlen) != 0)
		return -1;
	/* optional: the nodes that get the cache's Node label; never in the
	 * status (a thousand names), the operator takes it out */
	const cJSON *labeled = cJSON_GetObjectItemCaseSensitive(r, "labeledNodes"), *n;
	if (labeled && !cJSON_IsArray(labeled) && !(cJSON_IsObject(labeled) && !labeled->child))
		return policy_check_fail(err, errlen,
		                         "'labeledNodes' must be a list of node names");
	cJSON_ArrayForEach(n, labeled)
	{
		if (!cJSON_IsString(n) || !kube_valid_subdomain(n->valuestring))
			return policy_check_fail(err, errlen,
			                         "'labeledNodes' must be a list of node names");
	}
	return 0;
}

ENGINE_HOOK(aggregate_hook, "aggregate", "aggregate", "evaluate", validate_aggregate);
