#include "pod_env.h"

#include "admission_review.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define ENV_VALUE_MAX 1024

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

/* Where tree tr is for a container that mounts its volume at mp with
 * subPath sub ("" for none): written to want; false when the tree is not
 * inside what the mount shows. */
static bool tree_path(const char *mp, const char *sub, const struct cache_env_tree *tr, char *want,
                      size_t len)
{
	const char *rest = tr->subpath;
	size_t sl = strlen(sub);
	while (sl && sub[sl - 1] == '/')
		sl--;
	if (sl) {
		if (strncmp(rest, sub, sl) != 0 || (rest[sl] != '\0' && rest[sl] != '/'))
			return false;
		rest += sl;
		while (*rest == '/')
			rest++;
	}
	size_t l = strlen(mp);
	while (l > 1 && mp[l - 1] == '/')
		l--;
	bool root = l == 1 && mp[0] == '/';
	int w = snprintf(want, len, "%.*s%s%s", (int)l, mp, rest[0] && !root ? "/" : "", rest);
	return w > 0 && (size_t)w < len;
}

/* One tree's variable for container cname mounting it at want: added to
 * env (1), already there (0), or set otherwise (0, warned, *conflict set);
 * -ENOMEM. */
static int tree_env(cJSON *env, const char *cname, const char *want,
                    const struct cache_env_tree *tr, bool *conflict, char *warn, size_t warnlen)
{
	bool from = false;
	const char *have = env_value(env, tr->variable, &from);
	if (have && !from && strcmp(have, want) == 0)
		return 0;
	if (have) {
		warn_add(warn, warnlen, cname, tr->variable, from ? "(from a source)" : have, want);
		*conflict = true;
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

static bool listed(const char *const *names, const char *name)
{
	if (!names)
		return true;
	for (; *names; names++)
		if (strcmp(*names, name) == 0)
			return true;
	return false;
}

/* The variables for one container: added to env (a copy of its list).
 * Returns how many were added, or -ENOMEM. */
static int container_env(const cJSON *c, cJSON *env, struct pod_env_volume *vols, size_t n,
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
		const cJSON *sp = cJSON_GetObjectItemCaseSensitive(m, "subPath");
		/* subPathExpr is expanded by the kubelet: where it points is not known here */
		if (!cJSON_IsString(mn) || !cJSON_IsString(mp) ||
		    cJSON_GetObjectItemCaseSensitive(m, "subPathExpr"))
			continue;
		for (size_t v = 0; v < n; v++) {
			if (strcmp(vols[v].volume, mn->valuestring) != 0 ||
			    !listed(vols[v].containers, cname))
				continue;
			for (size_t t = 0; t < vols[v].n; t++) {
				char want[ENV_VALUE_MAX];
				if (!tree_path(mp->valuestring,
				               cJSON_IsString(sp) ? sp->valuestring : "",
				               &vols[v].trees[t], want, sizeof(want)))
					continue;
				int rc = tree_env(env, cname, want, &vols[v].trees[t],
				                  &vols[v].conflict, warn, warnlen);
				if (rc < 0)
					return rc;
				added += rc;
			}
		}
	}
	return added;
}

static int list_patch(const cJSON *spec, const char *list, struct pod_env_volume *vols, size_t n,
                      cJSON *ops, char *warn, size_t warnlen)
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
			snprintf(path, sizeof(path), "/spec/%s/%d/env", list, i);
			cJSON *o = admission_patch_op(ops, "add", path);
			if (!o) {
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

int pod_env_patch(const cJSON *pod, struct pod_env_volume *vols, size_t n, cJSON *ops, char *warn,
                  size_t warnlen)
{
	const cJSON *spec = cJSON_GetObjectItemCaseSensitive(pod, "spec");
	if (warnlen)
		warn[0] = '\0';
	int rc = list_patch(spec, "initContainers", vols, n, ops, warn, warnlen);
	return rc ? rc : list_patch(spec, "containers", vols, n, ops, warn, warnlen);
}
