#include "cache_claim.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cache_label.h"

#define DRIVER "csi.gkm.io"
/* A nominal size: the cache's size is known on nodes only, and nothing
 * provisions or expands these volumes. */
#define SIZE "1Mi"

void cache_claim_clear(struct cache_claim *c)
{
	cJSON_Delete(c->pvc);
	cJSON_Delete(c->pv);
	memset(c, 0, sizeof(*c));
}

static cJSON *strings(const char *a, const char *b)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, a, b);
	return o;
}

static cJSON *access_modes(void)
{
	const char *m[] = {"ReadOnlyMany"};
	return cJSON_CreateStringArray(m, 1);
}

int cache_claim_plan(const cJSON *cache, struct cache_claim *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	const cJSON *claim = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cache, "spec"), "claim");
	if (!cJSON_IsObject(claim))
		return -ENOENT;
	const char *kind = obj_str(cache, "kind"), *ns = obj_str(cache, "metadata.namespace");
	const char *name = obj_str(cache, "metadata.name"), *uid = obj_str(cache, "metadata.uid");
	const char *pvc = obj_str(claim, "name"), *pvc_ns = obj_str(claim, "namespace");
	const char *on_miss = obj_str(claim, "onMiss");
	const cJSON *ro = cJSON_GetObjectItemCaseSensitive(claim, "readOnly");
	const cJSON *placement = cJSON_GetObjectItemCaseSensitive(claim, "placement");
	char label[CACHE_LABEL_KEY_MAX];
	if (!*pvc)
		pvc = name;
	if (*ns && *pvc_ns && strcmp(ns, pvc_ns) != 0) {
		snprintf(err, errlen,
		         "spec.claim.namespace %s: the claim of a GKMCache is in the cache's own "
		         "namespace (%s)",
		         pvc_ns, ns);
		return -EINVAL;
	}
	if (!*ns && !*pvc_ns) {
		snprintf(err, errlen,
		         "spec.claim.namespace is required for a ClusterGKMCache: the namespace of "
		         "the pods that mount the claim");
		return -EINVAL;
	}
	if (!*ns)
		ns = "";
	const char *claim_ns = *ns ? ns : pvc_ns;
	if (!obj_valid_name(pvc) || strlen(pvc) >= sizeof(out->pvc_name) ||
	    !obj_valid_label(claim_ns) || !*uid || strlen(uid) >= sizeof(out->uid) ||
	    (*on_miss && strcmp(on_miss, "fail") != 0 && strcmp(on_miss, "empty") != 0) ||
	    cache_label_key(ns, name, label, sizeof(label)) != 0) {
		snprintf(err, errlen, "spec.claim: not a usable claim name, namespace or onMiss");
		return -EINVAL;
	}
	snprintf(out->pvc_ns, sizeof(out->pvc_ns), "%s", claim_ns);
	snprintf(out->pvc_name, sizeof(out->pvc_name), "%s", pvc);
	snprintf(out->pv_name, sizeof(out->pv_name), "gkm-%s", uid);
	snprintf(out->uid, sizeof(out->uid), "%s", uid);

	cJSON *pv = cJSON_CreateObject();
	cJSON_AddStringToObject(pv, "apiVersion", "v1");
	cJSON_AddStringToObject(pv, "kind", "PersistentVolume");
	cJSON *meta = cJSON_AddObjectToObject(pv, "metadata");
	cJSON_AddStringToObject(meta, "name", out->pv_name);
	cJSON_AddItemToObject(meta, "labels", strings(CACHE_CLAIM_LABEL, "true"));
	cJSON *ann = cJSON_AddObjectToObject(meta, "annotations");
	cJSON_AddStringToObject(ann, "gkm.io/cache-namespace", ns);
	cJSON_AddStringToObject(ann, "gkm.io/cache-name", name);
	cJSON_AddStringToObject(ann, "gkm.io/cache-uid", uid);
	cJSON *spec = cJSON_AddObjectToObject(pv, "spec");
	cJSON_AddItemToObject(spec, "capacity", strings("storage", SIZE));
	cJSON_AddItemToObject(spec, "accessModes", access_modes());
	cJSON_AddStringToObject(spec, "persistentVolumeReclaimPolicy", "Retain");
	cJSON_AddStringToObject(spec, "storageClassName", "");
	cJSON_AddStringToObject(spec, "volumeMode", "Filesystem");
	if (cJSON_IsTrue(placement)) { /* only where the operator labels it Ready */
		cJSON *expr = cJSON_CreateObject();
		const char *ready[] = {CACHE_LABEL_VALUE};
		cJSON_AddStringToObject(expr, "key", label);
		cJSON_AddStringToObject(expr, "operator", "In");
		cJSON_AddItemToObject(expr, "values", cJSON_CreateStringArray(ready, 1));
		cJSON *term = cJSON_CreateObject();
		cJSON_AddItemToArray(cJSON_AddArrayToObject(term, "matchExpressions"), expr);
		cJSON *req = cJSON_AddObjectToObject(cJSON_AddObjectToObject(spec, "nodeAffinity"),
		                                     "required");
		cJSON_AddItemToArray(cJSON_AddArrayToObject(req, "nodeSelectorTerms"), term);
	}
	cJSON *ref = cJSON_AddObjectToObject(spec, "claimRef");
	cJSON_AddStringToObject(ref, "apiVersion", "v1");
	cJSON_AddStringToObject(ref, "kind", "PersistentVolumeClaim");
	cJSON_AddStringToObject(ref, "namespace", out->pvc_ns);
	cJSON_AddStringToObject(ref, "name", out->pvc_name);
	cJSON *csi = cJSON_AddObjectToObject(spec, "csi");
	cJSON_AddStringToObject(csi, "driver", DRIVER);
	cJSON_AddStringToObject(csi, "volumeHandle", out->pv_name);
	cJSON *attrs = cJSON_AddObjectToObject(csi, "volumeAttributes");
	cJSON_AddStringToObject(attrs, "cacheName", name);
	if (*ns)
		cJSON_AddStringToObject(attrs, "cacheNamespace", ns);
	if (cJSON_IsBool(ro))
		cJSON_AddStringToObject(attrs, "readOnly", cJSON_IsTrue(ro) ? "true" : "false");
	if (*on_miss)
		cJSON_AddStringToObject(attrs, "onMiss", on_miss);

	cJSON *c = cJSON_CreateObject();
	cJSON_AddStringToObject(c, "apiVersion", "v1");
	cJSON_AddStringToObject(c, "kind", "PersistentVolumeClaim");
	meta = cJSON_AddObjectToObject(c, "metadata");
	cJSON_AddStringToObject(meta, "name", out->pvc_name);
	cJSON_AddStringToObject(meta, "namespace", out->pvc_ns);
	cJSON_AddItemToObject(meta, "labels", strings(CACHE_CLAIM_LABEL, "true"));
	cJSON *owner = cJSON_CreateObject();
	cJSON_AddStringToObject(owner, "apiVersion", GKM_API_VERSION);
	cJSON_AddStringToObject(owner, "kind", kind);
	cJSON_AddStringToObject(owner, "name", name);
	cJSON_AddStringToObject(owner, "uid", uid);
	cJSON_AddBoolToObject(owner, "controller", true);
	cJSON_AddItemToArray(cJSON_AddArrayToObject(meta, "ownerReferences"), owner);
	spec = cJSON_AddObjectToObject(c, "spec");
	cJSON_AddItemToObject(spec, "accessModes", access_modes());
	cJSON_AddStringToObject(spec, "storageClassName", "");
	cJSON_AddStringToObject(spec, "volumeMode", "Filesystem");
	cJSON_AddStringToObject(spec, "volumeName", out->pv_name);
	cJSON_AddItemToObject(cJSON_AddObjectToObject(spec, "resources"), "requests",
	                      strings("storage", SIZE));
	out->pv = pv;
	out->pvc = c;
	return 0;
}

/* Is the stored claim owned by the cache with this uid? */
static bool owned(const cJSON *obj, const char *uid)
{
	const cJSON *o;
	cJSON_ArrayForEach(
	    o, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(obj, "metadata"),
	                                        "ownerReferences"))
	{
		if (!strcmp(obj_str(o, "uid"), uid))
			return true;
	}
	return false;
}

int cache_claim_apply(struct objstore *os, const char *manager, struct cache_claim *c, char *err,
                      size_t errlen)
{
	cJSON *live = NULL;
	int rc = os->ops->get(os, "v1", "PersistentVolumeClaim", c->pvc_ns, c->pvc_name, &live, err,
	                      errlen);
	if (rc == 0 && !owned(live, c->uid)) {
		cJSON_Delete(live);
		snprintf(
		    err, errlen,
		    "PersistentVolumeClaim %s/%s exists and was not made by gkm for this cache: "
		    "it is left as it is (name another in spec.claim.name, or delete it)",
		    c->pvc_ns, c->pvc_name);
		return -EEXIST;
	}
	cJSON_Delete(live);
	live = NULL;
	if (rc && rc != -ENOENT)
		return rc;
	rc = os->ops->apply(os, c->pvc, manager, false, &live, err, errlen);
	if (rc)
		return rc;
	/* bound to this claim and no other of the same name */
	cJSON *ref = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(c->pv, "spec"), "claimRef");
	obj_set(ref, "uid", cJSON_CreateString(obj_str(live, "metadata.uid")));
	cJSON_Delete(live);
	return os->ops->apply(os, c->pv, manager, false, NULL, err, errlen);
}

int cache_claim_remove(struct objstore *os, const char *pvc_ns, const char *pvc_name,
                       const char *pv_name, const char *uid, char *err, size_t errlen)
{
	cJSON *live = NULL;
	int rc =
	    os->ops->get(os, "v1", "PersistentVolumeClaim", pvc_ns, pvc_name, &live, err, errlen);
	if (rc == 0 && owned(live, uid))
		rc = os->ops->remove(os, "v1", "PersistentVolumeClaim", pvc_ns, pvc_name, err,
		                     errlen);
	cJSON_Delete(live);
	if (rc && rc != -ENOENT)
		return rc;
	if (!*pv_name)
		return 0;
	rc = os->ops->remove(os, "v1", "PersistentVolume", "", pv_name, err, errlen);
	return rc == -ENOENT ? 0 : rc;
}

static bool contains(const cJSON *want, const cJSON *live)
{
	if (!cJSON_IsObject(want))
		return live && cJSON_Compare(want, live, 1);
	if (!cJSON_IsObject(live))
		return false;
	const cJSON *w;
	cJSON_ArrayForEach(w, want)
	{
		if (!contains(w, cJSON_GetObjectItemCaseSensitive(live, w->string)))
			return false;
	}
	return true;
}

bool cache_claim_pv_matches(const cJSON *want, const cJSON *live)
{
	const cJSON *ws = cJSON_GetObjectItemCaseSensitive(want, "spec");
	const cJSON *ls = cJSON_GetObjectItemCaseSensitive(live, "spec");
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(want, "metadata");
	const cJSON *lm = cJSON_GetObjectItemCaseSensitive(live, "metadata");
	/* the uid in claimRef is set when applied: compare the rest */
	cJSON *w = obj_without(ws, "claimRef");
	bool same = contains(w, ls) &&
	            contains(cJSON_GetObjectItemCaseSensitive(wm, "labels"),
	                     cJSON_GetObjectItemCaseSensitive(lm, "labels")) &&
	            contains(cJSON_GetObjectItemCaseSensitive(wm, "annotations"),
	                     cJSON_GetObjectItemCaseSensitive(lm, "annotations"));
	cJSON_Delete(w);
	if (!same)
		return false;
	const cJSON *wr = cJSON_GetObjectItemCaseSensitive(ws, "claimRef");
	const cJSON *lr = cJSON_GetObjectItemCaseSensitive(ls, "claimRef");
	return !strcmp(obj_str(wr, "namespace"), obj_str(lr, "namespace")) &&
	       !strcmp(obj_str(wr, "name"), obj_str(lr, "name"));
}
