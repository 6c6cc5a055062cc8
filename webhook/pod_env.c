#include "pod_env.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define ENV_VALUE_MAX 1024

static void tree_set(struct pod_env_tree *t, const char *var, size_t varlen, const char *sub)
{
	if (varlen >= sizeof(t->variable))
		varlen = sizeof(t->variable) - 1;
	memcpy(t->variable, var, varlen);
	t->variable[varlen] = '\0';
	while (*sub == '/')
		sub++;
	snprintf(t->subpath, sizeof(t->subpath), "%s", sub);
	size_t l = strlen(t->subpath);
	while (l && t->subpath[l - 1] == '/')
		t->subpath[--l] = '\0';
}

static bool have_variable(const struct pod_env_tree *t, size_t n, const char *var)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(t[i].variable, var) == 0)
			return true;
	return false;
}

/* An environment variable name as Kubernetes accepts one (C identifier). */
static bool env_name(const char *s, size_t len)
{
	if (!len || len >= 64 || (s[0] >= '0' && s[0] <= '9'))
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9')))
			return false;
	}
	return true;
}

size_t pod_env_trees(const cJSON *labels, const char *format, struct pod_env_tree *out, size_t cap)
{
	size_t n = 0;
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(labels, POD_ENV_LABEL_ROOT_ENV);
	const cJSON *sub = cJSON_GetObjectItemCaseSensitive(labels, POD_ENV_LABEL_SUBPATH);
	if (cJSON_IsString(env) && n < cap) {
		const char *eq = strchr(env->valuestring, '=');
		size_t len = eq ? (size_t)(eq - env->valuestring) : strlen(env->valuestring);
		if (env_name(env->valuestring, len))
			tree_set(&out[n++], env->valuestring, len,
			         cJSON_IsString(sub) ? sub->valuestring : "");
	}
	static const struct {
		const char *format, *variable, *subpath;
	} known[] = {
	    {"triton", "TRITON_CACHE_DIR", "io.triton.cache"},
	    {"vllm", "VLLM_CACHE_ROOT", "io.vllm.cache"},
	    {"inductor", "TORCHINDUCTOR_CACHE_DIR", "io.inductor.cache"},
	};
	for (size_t i = 0; format && i < sizeof(known) / sizeof(known[0]); i++) {
		if (strcmp(format, known[i].format) != 0 || n >= cap ||
		    have_variable(out, n, known[i].variable))
			continue;
		tree_set(&out[n++], known[i].variable, strlen(known[i].variable), known[i].subpath);
	}
	return n;
}

static void warn_add(char *warn, size_t warnlen, const char *container, const char *var,
                     const char *have, const char *want)
{
	size_t l = strlen(warn);
	if (l + 3 >= warnlen)
		return;
	snprintf(warn + l, warnlen - l,
	         "%scontainer %s sets %s to %s, so the cache mounted at %s will never be read",
	         l ? "; " : "", container, var, have, want);
}

/* c's env entry named var: its value ("" when set from a source), or NULL. */
static const char *env_value(const cJSON *env, const char *var, bool *from)
{
	const cJSON *e;
	cJSON_ArrayForEach(e, env)
	{
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
		if (!cJSON_IsString(name) || strcmp(name->valuestring, var) != 0)
			continue;
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "value");
		*from = !cJSON_IsString(v);
		return cJSON_IsString(v) ? v->valuestring : "";
	}
	return NULL;
}

/* One tree's variable for container cname mounting it at mp: added to env
 * (1), already there (0), or set otherwise (0, warned); -ENOMEM. */
static int tree_env(cJSON *env, const char *cname, const char *mp, const struct pod_env_tree *tr,
                    char *warn, size_t warnlen)
{
	char want[ENV_VALUE_MAX];
	size_t l = strlen(mp);
	while (l > 1 && mp[l - 1] == '/')
		l--;
	bool root = l == 1 && mp[0] == '/';
	snprintf(want, sizeof(want), "%.*s%s%s", (int)l, mp, tr->subpath[0] && !root ? "/" : "",
	         tr->subpath);
	bool from = false;
	const char *have = env_value(env, tr->variable, &from);
	if (have && !from && strcmp(have, want) == 0)
		return 0;
	if (have) {
		warn_add(warn, warnlen, cname, tr->variable, from ? "(from a source)" : have, want);
		return 0;
	}
	cJSON *e = cJSON_CreateObject();
	if (!e || !cJSON_AddItemToArray(env, e)) {
		cJSON_Delete(e);
		return -ENOMEM;
	}
	if (!cJSON_AddStringToObject(e, "name", tr->variable) ||
	    !cJSON_AddStringToObject(e, "value", want))
		return -ENOMEM;
	return 1;
}

/* The variables for one container: added to env (a copy of its list).
 * Returns how many were added, or -ENOMEM. */
static int container_env(const cJSON *c, cJSON *env, const struct pod_env_volume *vols, size_t n,
                         char *warn, size_t warnlen)
{
	const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
	const cJSON *mounts = cJSON_GetObjectItemCaseSensitive(c, "volumeMounts"), *m;
	const char *cname = cJSON_IsString(name) ? name->valuestring : "?";
	int added = 0;
	cJSON_ArrayForEach(m, mounts)
	{
		const cJSON *mn = cJSON_GetObjectItemCaseSensitive(m, "name");
		const cJSON *mp = cJSON_GetObjectItemCaseSensitive(m, "mountPath");
		if (!cJSON_IsString(mn) || !cJSON_IsString(mp))
			continue;
		for (size_t v = 0; v < n; v++) {
			if (strcmp(vols[v].volume, mn->valuestring) != 0)
				continue;
			for (size_t t = 0; t < vols[v].n; t++) {
				int rc = tree_env(env, cname, mp->valuestring, &vols[v].trees[t],
				                  warn, warnlen);
				if (rc < 0)
					return rc;
				added += rc;
			}
		}
	}
	return added;
}

static int list_patch(const cJSON *spec, const char *list, const struct pod_env_volume *vols,
                      size_t n, cJSON *ops, char *warn, size_t warnlen)
{
	const cJSON *cs = cJSON_GetObjectItemCaseSensitive(spec, list), *c;
	int i = 0;
	cJSON_ArrayForEach(c, cs)
	{
		const cJSON *have = cJSON_GetObjectItemCaseSensitive(c, "env");
		cJSON *env =
		    cJSON_IsArray(have) ? cJSON_Duplicate(have, true) : cJSON_CreateArray();
		int added = env ? container_env(c, env, vols, n, warn, warnlen) : -ENOMEM;
		if (added > 0) {
			char path[96];
			cJSON *o = cJSON_CreateObject();
			snprintf(path, sizeof(path), "/spec/%s/%d/env", list, i);
			if (!o || !cJSON_AddItemToArray(ops, o) ||
			    !cJSON_AddStringToObject(o, "op", "add") ||
			    !cJSON_AddStringToObject(o, "path", path)) {
				cJSON_Delete(env);
				return -ENOMEM;
			}
			cJSON_AddItemToObject(o, "value", env);
			env = NULL;
		}
		cJSON_Delete(env);
		if (added < 0)
			return added;
		i++;
	}
	return 0;
}

int pod_env_patch(const cJSON *pod, const struct pod_env_volume *vols, size_t n, cJSON *ops,
                  char *warn, size_t warnlen)
{
	const cJSON *spec = cJSON_GetObjectItemCaseSensitive(pod, "spec");
	if (warnlen)
		warn[0] = '\0';
	int rc = list_patch(spec, "initContainers", vols, n, ops, warn, warnlen);
	return rc ? rc : list_patch(spec, "containers", vols, n, ops, warn, warnlen);
}
