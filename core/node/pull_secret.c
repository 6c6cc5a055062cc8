#include "pull_secret.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oci_auth.h"

#define DOCKERCONFIGJSON "kubernetes.io/dockerconfigjson"

int pull_secret_names(const cJSON *obj, char *buf, size_t len, char *err, size_t errlen)
{
	const cJSON *spec = cJSON_GetObjectItemCaseSensitive(obj, "spec");
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(spec, "pullSecrets");
	size_t used = 0, n = 0;
	buf[0] = '\0';
	if (!list)
		return 0;
	if (!cJSON_IsArray(list)) {
		snprintf(err, errlen, "spec.pullSecrets must be a list of {name: SECRET}");
		return -EINVAL;
	}
	const cJSON *it;
	cJSON_ArrayForEach(it, list)
	{
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
		if (!cJSON_IsString(name) || !obj_valid_name(name->valuestring)) {
			snprintf(err, errlen,
			         "spec.pullSecrets[%zu] needs a name that is a Secret name", n);
			return -EINVAL;
		}
		if (++n > PULL_SECRET_MAX) {
			snprintf(err, errlen, "spec.pullSecrets: at most %d Secrets",
			         PULL_SECRET_MAX);
			return -EINVAL;
		}
		int w =
		    snprintf(buf + used, len - used, "%s%s", used ? "," : "", name->valuestring);
		if (w < 0 || (size_t)w >= len - used) {
			snprintf(err, errlen, "spec.pullSecrets: names too long");
			return -EINVAL;
		}
		used += (size_t)w;
	}
	return 0;
}

/* "", "*" or "a,b" of namespace names. */
bool pull_secret_global_valid(const char *s)
{
	char buf[1024], *save = NULL;
	if (strcmp(s, "*") == 0 || !*s)
		return true;
	if (strlen(s) >= sizeof(buf))
		return false;
	snprintf(buf, sizeof(buf), "%s", s);
	for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
		if (!obj_valid_label(p))
			return false;
	return s[strlen(s) - 1] != ',' && s[0] != ',';
}

const char *pull_secret_home(const char *home)
{
	const char *env = getenv("POD_NAMESPACE");
	return home ? home : env && *env ? env : "gkm";
}

bool pull_secret_global(const char *global, const char *ns)
{
	if (!*ns || (global && strcmp(global, "*") == 0))
		return true;
	size_t n = strlen(ns);
	for (const char *p = global; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, ns, n) == 0)
			return true;
		p = end ? end + 1 : p + len;
	}
	return false;
}

void pull_secret_ref_of(const cJSON *cache, const char *home, const char *global,
                        struct pull_secret_ref *out)
{
	const char *ns = obj_str(cache, "metadata.namespace");
	out->global = pull_secret_global(global, ns);
	if (!*ns)
		ns = pull_secret_home(home);
	snprintf(out->ns, sizeof(out->ns), "%s", ns);
	if (pull_secret_names(cache, out->names, sizeof(out->names), out->err, sizeof(out->err)) ==
	    0)
		out->err[0] = '\0';
}

bool pull_secret_ref_same(const struct pull_secret_ref *a, const struct pull_secret_ref *b)
{
	if (a->err[0] || b->err[0])
		return false;
	if (!a->names[0] || !b->names[0])
		return !a->names[0] && !b->names[0] && a->global == b->global;
	return !strcmp(a->names, b->names) && !strcmp(a->ns, b->ns);
}

#define ANONYMOUS_KEY "(anonymous)"

bool pull_secret_ref_key(const struct pull_secret_ref *ref, const char **key)
{
	if (ref->err[0] || ref->names[0])
		return false;
	*key = ref->global ? "" : ANONYMOUS_KEY;
	return true;
}

int pull_secret_opts(struct objstore *os, const struct pull_secret_ref *ref, const char *registry,
                     const struct oci_registry_opts *base, struct pull_secret *ps,
                     struct oci_registry_opts *out, char *err, size_t errlen)
{
	*out = *base;
	memset(ps, 0, sizeof(*ps));
	if (ref->err[0]) {
		snprintf(err, errlen, "%s", ref->err);
		return -EINVAL;
	}
	if (!ref->names[0] && !ref->global) {
		/* the daemon's own credentials are not this namespace's */
		out->username = out->password = out->auth_file = out->auth_json = NULL;
		out->no_default_auth_files = true;
		out->auth_source = PULL_SECRET_NONE_WHY;
		snprintf(ps->key, sizeof(ps->key), ANONYMOUS_KEY);
		return 0;
	}
	if (!ref->names[0] || !registry)
		return 0;
	int rc = pull_secret_read(os, ref->ns, ref->names, registry, ps, err, errlen);
	if (rc)
		return rc;
	out->username = out->password = out->auth_file = NULL;
	out->auth_json = ps->auth_json;
	out->auth_source = ps->source;
	return 0;
}

void pull_secret_clear(struct pull_secret *ps)
{
	if (ps->auth_json) {
		explicit_bzero(ps->auth_json, strlen(ps->auth_json));
		free(ps->auth_json);
	}
	memset(ps, 0, sizeof(*ps));
}

int pull_secret_read(struct objstore *os, const char *ns, const char *names, const char *host,
                     struct pull_secret *out, char *err, size_t errlen)
{
	struct pull_secret best;
	char list[1024], missing[512] = "";
	int rc = 0;
	bool best_has_host = false;
	memset(&best, 0, sizeof(best));
	snprintf(list, sizeof(list), "%s", names);
	for (char *save = NULL, *name = strtok_r(list, ",", &save); name && !best_has_host;
	     name = strtok_r(NULL, ",", &save)) {
		cJSON *s = NULL;
		char e[256] = "";
		rc = os->ops->get(os, "v1", "Secret", ns, name, &s, e, sizeof(e));
		if (rc == -ENOENT) {
			size_t m = strlen(missing);
			snprintf(missing + m, sizeof(missing) - m, "%s%s/%s", m ? ", " : "", ns,
			         name);
			rc = 0;
			continue;
		}
		if (rc) {
			snprintf(err, errlen, "cannot read pull Secret %s/%s: %s", ns, name, e);
			goto out;
		}
		if (strcmp(obj_str(s, "type"), DOCKERCONFIGJSON) != 0) {
			snprintf(err, errlen, "pull Secret %s/%s is of type '%s', not %s", ns, name,
			         obj_str(s, "type"), DOCKERCONFIGJSON);
			cJSON_Delete(s);
			rc = -EACCES;
			goto out;
		}
		char *json = cJSON_PrintUnformatted(s);
		struct oci_creds c;
		struct oci_err oe;
		memset(&c, 0, sizeof(c));
		memset(&oe, 0, sizeof(oe));
		int lrc = json ? oci_creds_lookup(json, strlen(json), host, &c, &oe) : -ENOMEM;
		oci_creds_clear(&c);
		if (lrc && lrc != -ENOENT) {
			snprintf(err, errlen, "pull Secret %s/%s: %s", ns, name,
			         lrc == -ENOMEM ? "out of memory" : oe.msg);
			if (json)
				explicit_bzero(json, strlen(json));
			free(json);
			cJSON_Delete(s);
			rc = lrc == -ENOMEM ? -ENOMEM : -EACCES;
			goto out;
		}
		if (!best.auth_json || lrc == 0) {
			pull_secret_clear(&best);
			best.auth_json = json;
			json = NULL;
			best_has_host = lrc == 0;
			snprintf(best.source, sizeof(best.source), "Secret %s/%s", ns, name);
			snprintf(best.key, sizeof(best.key), "%s/%s@%s", ns, name,
			         obj_str(s, "metadata.resourceVersion"));
		}
		if (json) {
			explicit_bzero(json, strlen(json));
			free(json);
		}
		cJSON_Delete(s);
	}
	if (!best.auth_json && names[0]) {
		snprintf(err, errlen, "pull Secret%s %s not found", strchr(names, ',') ? "s" : "",
		         missing);
		rc = -EACCES;
		goto out;
	}
	*out = best;
	memset(&best, 0, sizeof(best));
out:
	pull_secret_clear(&best);
	return rc;
}
