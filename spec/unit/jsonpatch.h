/* A small RFC 6902 applier (add and replace, the operations the webhooks
 * answer with) for tests: the patch is applied as the API server would, so a
 * test asserts the object a user gets, not the text of the patch. */
#ifndef GKM_SPEC_JSONPATCH_H
#define GKM_SPEC_JSONPATCH_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Unescape one RFC 6901 segment in place ("~1" -> '/', "~0" -> '~'). */
static inline void jsonpatch_unescape(char *s)
{
	char *o = s;
	for (; *s; s++) {
		if (s[0] == '~' && (s[1] == '0' || s[1] == '1')) {
			*o++ = s[1] == '0' ? '~' : '/';
			s++;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
}

/* Apply one operation to doc. 0, or -1 when it does not apply. */
static inline int jsonpatch_apply_op(cJSON *doc, const cJSON *op)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(op, "op");
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(op, "path");
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(op, "value");
	if (!cJSON_IsString(o) || !cJSON_IsString(p) || !v || p->valuestring[0] != '/')
		return -1;
	bool replace = strcmp(o->valuestring, "replace") == 0;
	if (!replace && strcmp(o->valuestring, "add") != 0)
		return -1;
	char *path = strdup(p->valuestring + 1), *seg = path, *slash;
	cJSON *parent = doc;
	int rc = -1;
	while ((slash = strchr(seg, '/'))) {
		*slash = '\0';
		jsonpatch_unescape(seg);
		parent = cJSON_IsArray(parent) ? cJSON_GetArrayItem(parent, atoi(seg))
		                               : cJSON_GetObjectItemCaseSensitive(parent, seg);
		if (!parent)
			goto out;
		seg = slash + 1;
	}
	jsonpatch_unescape(seg);
	cJSON *val = cJSON_Duplicate(v, 1);
	if (cJSON_IsArray(parent)) {
		int i = atoi(seg);
		if (i < 0 || i >= cJSON_GetArraySize(parent) || !replace) {
			cJSON_Delete(val);
			goto out;
		}
		cJSON_ReplaceItemInArray(parent, i, val);
	} else if (cJSON_IsObject(parent)) {
		bool have = cJSON_GetObjectItemCaseSensitive(parent, seg) != NULL;
		if (replace && !have) {
			cJSON_Delete(val);
			goto out;
		}
		if (have)
			cJSON_ReplaceItemInObjectCaseSensitive(parent, seg, val);
		else
			cJSON_AddItemToObject(parent, seg, val);
	} else {
		cJSON_Delete(val);
		goto out;
	}
	rc = 0;
out:
	free(path);
	return rc;
}

/* Apply a whole patch (JSON text). 0, or -1 at the first failure. */
static inline int jsonpatch_apply(cJSON *doc, const char *patch)
{
	cJSON *ops = cJSON_Parse(patch);
	const cJSON *op;
	int rc = cJSON_IsArray(ops) ? 0 : -1;
	cJSON_ArrayForEach(op, ops) if (rc == 0) rc = jsonpatch_apply_op(doc, op);
	cJSON_Delete(ops);
	return rc;
}

#endif
