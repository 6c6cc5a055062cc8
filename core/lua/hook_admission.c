/* The admission policy hook (policies/admission.lua) and its validator. */
#include <string.h>

#include "engine.h"
#include "policy_check.h"

static int validate_admission(const cJSON *r, char *err, size_t errlen)
{
	const cJSON *allowed = cJSON_GetObjectItemCaseSensitive(r, "allowed");
	if (!cJSON_IsObject(r) || !cJSON_IsBool(allowed))
		return policy_check_fail(err, errlen, "want a table with a boolean 'allowed'");
	if (cJSON_IsTrue(allowed))
		return 0;
	return policy_check_verdict(r, err, errlen);
}

ENGINE_HOOK(admission_hook, "admission", "admission", "evaluate", validate_admission);
