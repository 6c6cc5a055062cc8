/* The placement policy hook (policies/placement.lua) and its validator:
 * for each cache volume of a pod, how its node affinity is added. */
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "policy_check.h"

#define REASON_MAX 512

static int check_one(const cJSON *p, char *err, size_t errlen)
{
	const cJSON *mode = cJSON_GetObjectItemCaseSensitive(p, "mode");
	const cJSON *weight = cJSON_GetObjectItemCaseSensitive(p, "weight");
	const cJSON *reason = cJSON_GetObjectItemCaseSensitive(p, "reason");
	const char *m = cJSON_IsString(mode) ? mode->valuestring : "";
	if (!cJSON_IsObject(p)) {
		snprintf(err, errlen, "placement of volume '%.64s' must be a table", p->string);
		return -1;
	}
	if (strcmp(m, "required") && strcmp(m, "preferred") && strcmp(m, "none")) {
		snprintf(
		    err, errlen,
		    "placement of volume '%.64s': 'mode' must be \"required\", \"preferred\" or "
		    "\"none\"",
		    p->string);
		return -1;
	}
	if (strcmp(m, "preferred") == 0 &&
	    (!cJSON_IsNumber(weight) || weight->valuedouble < 1 || weight->valuedouble > 100 ||
	     weight->valuedouble != (double)(int)weight->valuedouble)) {
		snprintf(err, errlen,
		         "placement of volume '%.64s': a preferred placement needs 'weight', an "
		         "integer from 1 to 100",
		         p->string);
		return -1;
	}
	if (reason && (!cJSON_IsString(reason) || strlen(reason->valuestring) > REASON_MAX)) {
		snprintf(
		    err, errlen,
		    "placement of volume '%.64s': 'reason' must be a string of at most %d bytes",
		    p->string, REASON_MAX);
		return -1;
	}
	return 0;
}

static int validate_placement(const cJSON *r, char *err, size_t errlen)
{
	const cJSON *ps = cJSON_GetObjectItemCaseSensitive(r, "placements");
	if (!cJSON_IsObject(r) || !cJSON_IsObject(ps))
		return policy_check_fail(err, errlen,
		                         "want a table with 'placements', a table keyed by volume "
		                         "name");
	const cJSON *p;
	cJSON_ArrayForEach(p, ps)
	{
		if (check_one(p, err, errlen) != 0)
			return -1;
	}
	return 0;
}

ENGINE_HOOK(placement_hook, "placement", "placement", "evaluate", validate_placement);
