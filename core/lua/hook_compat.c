/* The compat policy hook and its validator. */
#include "hook_compat.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "policy_check.h"

/* A Lua table with no entries crosses as an empty JSON object. */
static bool empty_list(const cJSON *v)
{
	return cJSON_IsObject(v) && v->child == NULL;
}

int compat_hook_validate(const cJSON *r, char *err, size_t errlen)
{
	const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(r, "gpus");
	if (!cJSON_IsObject(r) || !(cJSON_IsArray(gpus) || empty_list(gpus)))
		return policy_check_fail(err, errlen,
		                         "want a table with a list 'gpus' of verdicts");
	int n = cJSON_GetArraySize(gpus);
	if (n > COMPAT_MAX_VERDICTS) {
		snprintf(err, errlen, "%d verdicts, more than %d", n, COMPAT_MAX_VERDICTS);
		return -1;
	}
	int i = 0;
	const cJSON *v;
	cJSON_ArrayForEach(v, gpus)
	{
		const cJSON *index = cJSON_GetObjectItemCaseSensitive(v, "index");
		const cJSON *ok = cJSON_GetObjectItemCaseSensitive(v, "compatible");
		const cJSON *reason = cJSON_GetObjectItemCaseSensitive(v, "reason");
		const cJSON *message = cJSON_GetObjectItemCaseSensitive(v, "message");
		char why[160];
		if (!cJSON_IsObject(v) || !cJSON_IsNumber(index) || index->valuedouble < 0 ||
		    index->valuedouble > 1e6 || index->valuedouble != floor(index->valuedouble)) {
			snprintf(err, errlen, "gpus[%d]: want a table with an integer 'index' >= 0",
			         i);
			return -1;
		}
		if (!cJSON_IsBool(ok)) {
			snprintf(err, errlen, "gpus[%d]: want a boolean 'compatible'", i);
			return -1;
		}
		if (cJSON_IsFalse(ok) && policy_check_verdict(v, why, sizeof(why)) != 0) {
			snprintf(err, errlen, "gpus[%d]: %s", i, why);
			return -1;
		}
		if ((reason &&
		     (!cJSON_IsString(reason) || !policy_check_reason(reason->valuestring))) ||
		    (message &&
		     (!cJSON_IsString(message) || strlen(message->valuestring) > 1024))) {
			snprintf(
			    err, errlen,
			    "gpus[%d]: 'reason' must be a CamelCase word and 'message' a string "
			    "of at most 1024 bytes",
			    i);
			return -1;
		}
		/* n <= 1024: the quadratic duplicate check stays small */
		const cJSON *w;
		int j = 0;
		cJSON_ArrayForEach(w, gpus)
		{
			if (j++ >= i)
				break;
			if (cJSON_GetObjectItemCaseSensitive(w, "index")->valuedouble ==
			    index->valuedouble) {
				snprintf(err, errlen, "gpus[%d]: index %.0f appears twice", i,
				         index->valuedouble);
				return -1;
			}
		}
		i++;
	}
	return 0;
}

ENGINE_HOOK(compat_hook, "compat", "compat", "evaluate", compat_hook_validate);
