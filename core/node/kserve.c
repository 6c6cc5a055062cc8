#include "kserve.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "strmap.h"

#define PREFIX "kserve-"

/* One LocalModelCache; obj NULL once it is deleted. A job at a time each:
 * what arrives meanwhile is synced when it is done. */
struct lmc {
	char name[254];
	cJSON *obj;
	bool busy, again;
};

struct kserve {
	struct workers *workers;
	struct objstore *os;
	const char *manager;
	struct strmap lmcs;
};

struct job {
	struct kserve *k;
	char name[254];
	cJSON *obj; /* NULL: deleted */
};

static void warn(struct objstore *os, const cJSON *lmc, const char *reason, const char *msg)
{
	log_warn("kernel cache of a LocalModelCache", "localModelCache",
	         obj_str(lmc, "metadata.name"), "reason", reason, "message", msg);
	os->ops->event(os, lmc, "Warning", reason, msg, "gkm-operator");
}

/* The image asked for: the annotation, else spec.kernelCache.image. */
static const char *image_of(const cJSON *lmc)
{
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(lmc, "metadata"), "annotations");
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(ann, KSERVE_IMAGE_ANNOTATION);
	if (cJSON_IsString(a) && *a->valuestring)
		return a->valuestring;
	return obj_str(lmc, "spec.kernelCache.image");
}

/* Is the stored ClusterGKMCache ours, made for the LocalModelCache name? */
static bool made_for(const cJSON *cache, const char *name)
{
	const cJSON *labels = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cache, "metadata"), "labels");
	const cJSON *l = cJSON_GetObjectItemCaseSensitive(labels, KSERVE_CACHE_LABEL);
	return cJSON_IsString(l) && !strcmp(l->valuestring, name);
}

static void remove_cache(struct kserve *k, const char *name)
{
	char cname[300], err[256];
	cJSON *live = NULL;
	snprintf(cname, sizeof(cname), PREFIX "%s", name);
	int rc = k->os->ops->get(k->os, GKM_API_VERSION, "ClusterGKMCache", "", cname, &live, err,
	                         sizeof(err));
	if (rc == 0 && made_for(live, name)) {
		rc = k->os->ops->remove(k->os, GKM_API_VERSION, "ClusterGKMCache", "", cname, err,
		                        sizeof(err));
		if (rc == 0)
			log_info("removed the kernel cache of a LocalModelCache", "localModelCache",
			         name, "cache", cname);
	}
	if (rc && rc != -ENOENT)
		log_warn("cannot remove the kernel cache of a LocalModelCache", "localModelCache",
		         name, "error", err);
	cJSON_Delete(live);
}

/* The node group's entry of spec.localModel.nodeGroups, or NULL (said in a
 * Warning Event on the LocalModelCache). */
static cJSON *node_group(struct kserve *k, const cJSON *lmc, const char *group)
{
	char err[256], msg[700];
	cJSON *ng = NULL;
	int rc = k->os->ops->get(k->os, KSERVE_API_VERSION, "LocalModelNodeGroup", "", group, &ng,
	                         err, sizeof(err));
	if (rc) {
		snprintf(msg, sizeof(msg), "node group %s: %s", group,
		         rc == -ENOENT ? "there is no LocalModelNodeGroup of that name" : err);
		warn(k->os, lmc, rc == -ENOENT ? "NodeGroupNotFound" : "NodeGroupUnreadable", msg);
		return NULL;
	}
	const cJSON *pv = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(ng, "spec"), "persistentVolumeSpec");
	const char *path = obj_str(pv, "local.path");
	if (!*path)
		path = obj_str(pv, "hostPath.path");
	if (*path != '/') {
		snprintf(
		    msg, sizeof(msg),
		    "node group %s: its persistentVolumeSpec has no local.path or hostPath.path "
		    "(an absolute path): no place for kernel caches on its nodes",
		    group);
		warn(k->os, lmc, "NodeGroupNoLocalPath", msg);
		cJSON_Delete(ng);
		return NULL;
	}
	cJSON *out = cJSON_CreateObject();
	cJSON_AddStringToObject(out, "name", group);
	cJSON_AddStringToObject(out, "path", path);
	const cJSON *terms = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pv, "nodeAffinity"),
	                                     "required"),
	    "nodeSelectorTerms");
	if (cJSON_IsArray(terms))
		cJSON_AddItemToObject(out, "nodeSelectorTerms", cJSON_Duplicate(terms, 1));
	cJSON_Delete(ng);
	return out;
}

static void sync(struct kserve *k, const char *name, const cJSON *lmc)
{
	const char *image = lmc ? image_of(lmc) : "";
	if (!*image) {
		remove_cache(k, name);
		return;
	}
	char cname[300], err[512], msg[1024];
	if (strlen(PREFIX) + strlen(name) > 253) {
		snprintf(
		    msg, sizeof(msg),
		    "the ClusterGKMCache for it would be named %s%s, longer than 253 characters",
		    PREFIX, name);
		warn(k->os, lmc, "NameTooLong", msg);
		return;
	}
	snprintf(cname, sizeof(cname), PREFIX "%s", name);
	cJSON *live = NULL;
	int rc = k->os->ops->get(k->os, GKM_API_VERSION, "ClusterGKMCache", "", cname, &live, err,
	                         sizeof(err));
	bool foreign = rc == 0 && !made_for(live, name);
	cJSON_Delete(live);
	if (foreign) {
		snprintf(
		    msg, sizeof(msg),
		    "ClusterGKMCache %s exists and was not made by gkm for this LocalModelCache: "
		    "it is left as it is",
		    cname);
		warn(k->os, lmc, "KernelCacheConflict", msg);
		return;
	}
	cJSON *c = cJSON_CreateObject();
	cJSON_AddStringToObject(c, "apiVersion", GKM_API_VERSION);
	cJSON_AddStringToObject(c, "kind", "ClusterGKMCache");
	cJSON *meta = cJSON_AddObjectToObject(c, "metadata");
	cJSON_AddStringToObject(meta, "name", cname);
	cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "labels"), KSERVE_CACHE_LABEL, name);
	cJSON *owner = cJSON_CreateObject();
	cJSON_AddStringToObject(owner, "apiVersion", KSERVE_API_VERSION);
	cJSON_AddStringToObject(owner, "kind", "LocalModelCache");
	cJSON_AddStringToObject(owner, "name", name);
	cJSON_AddStringToObject(owner, "uid", obj_str(lmc, "metadata.uid"));
	cJSON_AddItemToArray(cJSON_AddArrayToObject(meta, "ownerReferences"), owner);
	cJSON *spec = cJSON_AddObjectToObject(c, "spec");
	cJSON_AddStringToObject(spec, "image", image);
	cJSON *lm = cJSON_AddObjectToObject(spec, "localModel");
	cJSON_AddStringToObject(lm, "cacheName", name);
	cJSON *groups = cJSON_AddArrayToObject(lm, "nodeGroups");
	const cJSON *g;
	cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(
	                          cJSON_GetObjectItemCaseSensitive(lmc, "spec"), "nodeGroups"))
	{
		cJSON *e = cJSON_IsString(g) ? node_group(k, lmc, g->valuestring) : NULL;
		if (e)
			cJSON_AddItemToArray(groups, e);
	}
	rc = k->os->ops->apply(k->os, c, k->manager, false, NULL, err, sizeof(err));
	if (rc) {
		snprintf(msg, sizeof(msg), "cannot apply ClusterGKMCache %s: %s", cname, err);
		warn(k->os, lmc, "KernelCacheFailed", msg);
	}
	cJSON_Delete(c);
}

static void work(void *ud)
{
	struct job *j = ud;
	sync(j->k, j->name, j->obj);
}

static void start(struct kserve *k, struct lmc *m);

static void done(struct loop *l, void *ud)
{
	struct job *j = ud;
	(void)l;
	struct lmc *m = strmap_get(&j->k->lmcs, j->name);
	if (m) {
		m->busy = false;
		if (m->again)
			start(j->k, m);
		else if (!m->obj) {
			strmap_del(&j->k->lmcs, m->name);
			free(m);
		}
	}
	cJSON_Delete(j->obj);
	free(j);
}

static void start(struct kserve *k, struct lmc *m)
{
	if (m->busy) {
		m->again = true;
		return;
	}
	struct job *j = calloc(1, sizeof(*j));
	if (!j)
		return;
	j->k = k;
	snprintf(j->name, sizeof(j->name), "%s", m->name);
	j->obj = m->obj ? cJSON_Duplicate(m->obj, 1) : NULL;
	m->again = false;
	m->busy = workers_submit(k->workers, work, done, j) == 0;
	if (!m->busy) {
		cJSON_Delete(j->obj);
		free(j);
	}
}

static void on_lmc(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct kserve *k = ud;
	const char *name = obj_str(obj, "metadata.name");
	struct lmc *m = strmap_get(&k->lmcs, name);
	if (!m) { /* a deletion too: its cache may be there */
		if (!(m = calloc(1, sizeof(*m))))
			return;
		snprintf(m->name, sizeof(m->name), "%s", name);
		if (strmap_put(&k->lmcs, m->name, m) != 0) {
			free(m);
			return;
		}
	}
	cJSON_Delete(m->obj);
	m->obj = t == OBJSTORE_DELETED ? NULL : cJSON_Duplicate(obj, 1);
	start(k, m);
}

void kserve_resync(struct kserve *k)
{
	size_t pos = 0;
	void *v;
	while (strmap_next(&k->lmcs, &pos, NULL, &v))
		if (((struct lmc *)v)->obj)
			start(k, v);
}

cJSON *kserve_owner(const cJSON *cache)
{
	const cJSON *o;
	cJSON_ArrayForEach(
	    o, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cache, "metadata"),
	                                        "ownerReferences"))
	{
		if (strcmp(obj_str(o, "apiVersion"), KSERVE_API_VERSION) ||
		    strcmp(obj_str(o, "kind"), "LocalModelCache"))
			continue;
		cJSON *r = cJSON_CreateObject();
		cJSON_AddStringToObject(r, "apiVersion", KSERVE_API_VERSION);
		cJSON_AddStringToObject(r, "kind", "LocalModelCache");
		cJSON *meta = cJSON_AddObjectToObject(r, "metadata");
		cJSON_AddStringToObject(meta, "name", obj_str(o, "name"));
		cJSON_AddStringToObject(meta, "uid", obj_str(o, "uid"));
		return r;
	}
	return NULL;
}

int kserve_new(struct workers *w, struct objstore *os, const char *manager, struct kserve **out)
{
	struct kserve *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	k->workers = w;
	k->os = os;
	k->manager = manager;
	struct objstore_watch watch = {.api_version = KSERVE_API_VERSION,
	                               .kind = "LocalModelCache",
	                               .on_event = on_lmc,
	                               .ud = k,
	                               .no_cache = true};
	int rc = os->ops->watch(os, &watch);
	if (rc) {
		free(k);
		return rc;
	}
	*out = k;
	return 0;
}

void kserve_free(struct kserve *k)
{
	if (!k)
		return;
	size_t pos = 0;
	void *v;
	while (strmap_next(&k->lmcs, &pos, NULL, &v)) {
		cJSON_Delete(((struct lmc *)v)->obj);
		free(v);
	}
	strmap_clear(&k->lmcs);
	free(k);
}
