/* Helpers for the validators of policy hook results (see ENGINE_HOOK). */
#ifndef GKM_POLICY_CHECK_H
#define GKM_POLICY_CHECK_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* Write msg into err and return -1. */
int policy_check_fail(char *err, size_t errlen, const char *msg);

/* A refusal must carry reason (a CamelCase word of at most 64 characters, as
 * Kubernetes condition reasons are) and message (a string of at most 1024
 * bytes). 0 or -1 with err filled. */
int policy_check_verdict(const cJSON *r, char *err, size_t errlen);

/* Is s a CamelCase reason (letters and digits, starting with a capital)? */
int policy_check_reason(const char *s);

#endif
