/* The compat policy hook, its validator, and the grouping of its verdicts
 * into node status id sets. */
#include "compat_hook.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
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

static const char *str_or_empty(const cJSON *o, const char *k)
{
	const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
	return s ? s : "";
}

static bool same_outcome(const cJSON *a, const cJSON *b)
{
	return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "compatible")) ==
	           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "compatible")) &&
	       strcmp(str_or_empty(a, "reason"), str_or_empty(b, "reason")) == 0 &&
	       strcmp(str_or_empty(a, "message"), str_or_empty(b, "message")) == 0;
}

/* A new id set for verdict v, appended to list; NULL on allocation failure. */
static cJSON *new_set(cJSON *list, const cJSON *v, bool compatible)
{
	cJSON *set = cJSON_CreateObject();
	if (!set || !cJSON_AddItemToArray(list, set)) {
		cJSON_Delete(set);
		return NULL;
	}
	if (!cJSON_AddArrayToObject(set, "ids"))
		return NULL;
	if (!compatible && (!cJSON_AddStringToObject(set, "reason", str_or_empty(v, "reason")) ||
	                    !cJSON_AddStringToObject(set, "message", str_or_empty(v, "message"))))
		return NULL;
	return set;
}

cJSON *compat_hook_group(const cJSON *result)
{
	const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(result, "gpus");
	int n = cJSON_GetArraySize(gpus);
	/* the first verdict of each set, per list, to compare later ones with */
	const cJSON **reps = calloc(n > 0 ? (size_t)n : 1, sizeof(*reps));
	int nyes = 0, nno = 0;
	cJSON *out = cJSON_CreateObject();
	cJSON *yes = out ? cJSON_AddArrayToObject(out, "compatibleGPUs") : NULL;
	cJSON *no = out ? cJSON_AddArrayToObject(out, "incompatibleGPUs") : NULL;
	if (!reps || !yes || !no)
		goto fail;
	const cJSON *v;
	cJSON_ArrayForEach(v, gpus)
	{
		bool compatible = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "compatible"));
		cJSON *list = compatible ? yes : no;
		/* compatible sets use reps[0..nyes), incompatible ones reps[n-1] downwards */
		int count = compatible ? nyes : nno;
		cJSON *set = NULL;
		for (int k = 0; k < count && !set; k++)
			if (same_outcome(reps[compatible ? k : n - 1 - k], v))
				set = cJSON_GetArrayItem(list, k);
		if (!set) {
			set = new_set(list, v, compatible);
			if (!set)
				goto fail;
			if (compatible)
				reps[nyes++] = v;
			else
				reps[n - 1 - nno++] = v;
		}
		cJSON *id =
		    cJSON_CreateNumber(cJSON_GetObjectItemCaseSensitive(v, "index")->valuedouble);
		if (!id ||
		    !cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(set, "ids"), id)) {
			cJSON_Delete(id);
			goto fail;
		}
	}
	free(reps);
	return out;
fail:
	free(reps);
	cJSON_Delete(out);
	return NULL;
}
