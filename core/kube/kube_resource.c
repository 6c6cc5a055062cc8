/* Kubernetes resources: built-in kinds, paths, queries (see kube_client.h). */
#include "kube_client_impl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- resources ---- */

static const struct {
	const char *api_version, *kind, *plural;
	bool namespaced;
} builtin[] = {
    {"v1", "Namespace", "namespaces", false},
    {"v1", "Node", "nodes", false},
    {"v1", "Pod", "pods", true},
    {"v1", "ConfigMap", "configmaps", true},
    {"v1", "Secret", "secrets", true},
    {"v1", "Event", "events", true},
    {"v1", "Service", "services", true},
    {"v1", "ServiceAccount", "serviceaccounts", true},
    {"v1", "PersistentVolume", "persistentvolumes", false},
    {"v1", "PersistentVolumeClaim", "persistentvolumeclaims", true},
    {"serving.kserve.io/v1alpha1", "LocalModelCache", "localmodelcaches", false},
    {"serving.kserve.io/v1alpha1", "LocalModelNodeGroup", "localmodelnodegroups", false},
    {"events.k8s.io/v1", "Event", "events", true},
    {"coordination.k8s.io/v1", "Lease", "leases", true},
    {"rbac.authorization.k8s.io/v1", "Role", "roles", true},
    {"rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", true},
    {"apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", false},
    {"gkm.io/v1alpha1", "GKMCache", "gkmcaches", true},
    {"gkm.io/v1alpha1", "ClusterGKMCache", "clustergkmcaches", false},
    {"gkm.io/v1alpha1", "GKMCacheNode", "gkmcachenodes", true},
    {"gkm.io/v1alpha1", "ClusterGKMCacheNode", "clustergkmcachenodes", false},
};

int kc_split_api_version(const char *av, struct kube_resource *r)
{
	const char *slash = strchr(av, '/');
	if (slash) {
		size_t gl = (size_t)(slash - av);
		if (gl == 0 || gl >= sizeof(r->group) || strchr(slash + 1, '/'))
			return -EINVAL;
		memcpy(r->group, av, gl);
		r->group[gl] = '\0';
		av = slash + 1;
	} else {
		r->group[0] = '\0';
	}
	if (!*av || strlen(av) >= sizeof(r->version))
		return -EINVAL;
	kc_copy_str(r->version, sizeof(r->version), av);
	return 0;
}

int kube_resource_builtin(const char *api_version, const char *kind, struct kube_resource *out)
{
	if (!api_version || !kind)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++) {
		if (strcmp(builtin[i].api_version, api_version) || strcmp(builtin[i].kind, kind))
			continue;
		struct kube_resource r;
		memset(&r, 0, sizeof(r));
		if (kc_split_api_version(api_version, &r) < 0)
			return -EINVAL;
		kc_copy_str(r.plural, sizeof(r.plural), builtin[i].plural);
		kc_copy_str(r.kind, sizeof(r.kind), builtin[i].kind);
		r.namespaced = builtin[i].namespaced;
		*out = r;
		return 0;
	}
	return -ENOENT;
}

void kube_resource_api_version(const struct kube_resource *r, char *buf, size_t len)
{
	if (r->group[0])
		snprintf(buf, len, "%s/%s", r->group, r->version);
	else
		snprintf(buf, len, "%s", r->version);
}

/* Names in paths: what Kubernetes names allow, plus ':' (RBAC names) and
 * upper case (some kinds); never '/', '%', '?', '#', '..', or control bytes. */
bool kc_path_segment_ok(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 253 || !strcmp(s, ".") || !strcmp(s, ".."))
		return false;
	for (const char *p = s; *p; p++) {
		char ch = *p;
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
		      ch == ':' || ch == '@'))
			return false;
	}
	return true;
}

int kube_resource_path(const struct kube_resource *r, const char *ns, const char *name,
                       const char *sub, char *buf, size_t len)
{
	if ((name && !kc_path_segment_ok(name)) ||
	    (ns && r->namespaced && !kc_path_segment_ok(ns)) || (sub && !kc_path_segment_ok(sub)) ||
	    !kc_path_segment_ok(r->plural))
		return -EINVAL;
	int n;
	const char *prefix = r->group[0] ? "/apis/" : "/api";
	const char *group = r->group[0] ? r->group : "";
	if (r->namespaced && ns)
		n = snprintf(buf, len, "%s%s/%s/namespaces/%s/%s", prefix, group, r->version, ns,
		             r->plural);
	else
		n = snprintf(buf, len, "%s%s/%s/%s", prefix, group, r->version, r->plural);
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	if (name) {
		int m = snprintf(buf + n, len - (size_t)n, "/%s%s%s", name, sub ? "/" : "",
		                 sub ? sub : "");
		if (m < 0 || (size_t)(n + m) >= len)
			return -ENAMETOOLONG;
	}
	return 0;
}

int kube_query_add(char *buf, size_t len, const char *key, const char *value)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(buf);
	size_t need = n + 1 + strlen(key) + 1;
	for (const char *p = value; *p; p++) {
		unsigned char ch = (unsigned char)*p;
		bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		             (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
		             ch == '~';
		need += plain ? 1 : 3;
	}
	if (need + 1 > len)
		return -ENAMETOOLONG;
	char *w = buf + n;
	*w++ = strchr(buf, '?') ? '&' : '?';
	for (const char *p = key; *p; p++)
		*w++ = *p;
	*w++ = '=';
	for (const char *p = value; *p; p++) {
		unsigned char ch = (unsigned char)*p;
		bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		             (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
		             ch == '~';
		if (plain) {
			*w++ = (char)ch;
		} else {
			*w++ = '%';
			*w++ = hex[ch >> 4];
			*w++ = hex[ch & 15];
		}
	}
	*w = '\0';
	return 0;
}

const char *kube_obj_str(const cJSON *obj, const char *section, const char *field)
{
	const cJSON *s = section ? cJSON_GetObjectItemCaseSensitive(obj, section) : obj;
	return kc_jstr(s, field);
}
