/* Helpers on plain Kubernetes objects (see objstore.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "objstore.h"
#include "textfmt.h"

const char *obj_str(const cJSON *obj, const char *path)
{
	char part[128];
	const cJSON *cur = obj;
	while (cur && *path) {
		const char *dot = strchr(path, '.');
		size_t n = dot ? (size_t)(dot - path) : strlen(path);
		if (n >= sizeof(part))
			return "";
		memcpy(part, path, n);
		part[n] = '\0';
		cur = cJSON_GetObjectItemCaseSensitive(cur, part);
		path += n + (dot ? 1 : 0);
	}
	return cJSON_IsString(cur) ? cur->valuestring : "";
}

void obj_key(const cJSON *obj, char *buf, size_t len)
{
	const char *ns = obj_str(obj, "metadata.namespace");
	if (*ns)
		snprintf(buf, len, "%s/%s", ns, obj_str(obj, "metadata.name"));
	else
		snprintf(buf, len, "%s", obj_str(obj, "metadata.name"));
}

static bool alnum_lower(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

bool obj_valid_label(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 63 || !alnum_lower(s[0]) || !alnum_lower(s[n - 1]))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!alnum_lower(s[i]) && s[i] != '-')
			return false;
	return true;
}

bool obj_valid_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 253)
		return false;
	char part[64];
	const char *p = s;
	while (*p) {
		const char *dot = strchr(p, '.');
		size_t m = dot ? (size_t)(dot - p) : strlen(p);
		if (m == 0 || m >= sizeof(part))
			return false;
		memcpy(part, p, m);
		part[m] = '\0';
		if (!obj_valid_label(part))
			return false;
		p += m + (dot ? 1 : 0);
		if (dot && !*p)
			return false;
	}
	return true;
}

void obj_drop_empty_maps(cJSON *obj)
{
	cJSON *m = obj ? obj->child : NULL;
	while (m) {
		cJSON *next = m->next;
		if (cJSON_IsObject(m) || cJSON_IsArray(m))
			obj_drop_empty_maps(m);
		if (cJSON_IsObject(obj) && cJSON_IsObject(m) && !m->child)
			cJSON_Delete(cJSON_DetachItemViaPointer(obj, m));
		m = next;
	}
}

void obj_empty_lists(cJSON *obj, const char *const *keys, size_t n)
{
	for (size_t i = 0; obj && i < n; i++) {
		cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, keys[i]);
		if (cJSON_IsObject(v) && !v->child)
			cJSON_ReplaceItemInObjectCaseSensitive(obj, keys[i], cJSON_CreateArray());
	}
}

void obj_now(char *buf, size_t len)
{
	rfc3339_now(buf, len);
}

cJSON *obj_without(const cJSON *obj, const char *key)
{
	cJSON *c = cJSON_Duplicate(obj, 1);
	cJSON_DeleteItemFromObjectCaseSensitive(c, key);
	return c;
}

void obj_set(cJSON *obj, const char *key, cJSON *item)
{
	if (!item)
		return;
	if (cJSON_GetObjectItemCaseSensitive(obj, key))
		cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item);
	else
		cJSON_AddItemToObject(obj, key, item);
}
