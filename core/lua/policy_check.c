#include "policy_check.h"

#include <stdio.h>
#include <string.h>

int policy_check_fail(char *err, size_t errlen, const char *msg)
{
	snprintf(err, errlen, "%s", msg);
	return -1;
}

int policy_check_reason(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64 || s[0] < 'A' || s[0] > 'Z')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
		      (s[i] >= '0' && s[i] <= '9')))
			return 0;
	return 1;
}

int policy_check_verdict(const cJSON *r, char *err, size_t errlen)
{
	const cJSON *reason = cJSON_GetObjectItemCaseSensitive(r, "reason");
	const cJSON *message = cJSON_GetObjectItemCaseSensitive(r, "message");
	if (!cJSON_IsString(reason) || !policy_check_reason(reason->valuestring))
		return policy_check_fail(err, errlen,
		                         "a refusal needs 'reason', a CamelCase word of at most 64 "
		                         "letters and digits");
	if (!cJSON_IsString(message) || strlen(message->valuestring) > 1024)
		return policy_check_fail(
		    err, errlen, "a refusal needs 'message', a string of at most 1024 bytes");
	return 0;
}
