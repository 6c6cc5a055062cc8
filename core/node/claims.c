#include "claims.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_claim.h"
#include "log.h"
#include "strmap.h"

/* One cache's claim. */
struct rec {
	char key[320];
	char *sent;     /* the plan last applied (printed); NULL: none */
	cJSON *want_pv; /* its volume, to tell a hand edit */
	bool busy, recheck, gone;
	int rc; /* of the last apply; -EINVAL: spec.claim unusable */
	char err[640];
	char pvc_ns[64], pvc_name[254], pv_name[80], uid[64]; /* what was applied */
};

/* A volume the watch reports. */
struct pv {
	char name[80], key[320], uid[64], phase[32], ref_ns[64], ref_name[254];
	bool deleting, removing;
};

struct claims {
	struct workers *workers;
	struct objstore *os;
	const char *manager;
	void (*changed)(const char *key, void *ud);
	void *ud;
	struct strmap recs, pvs;
	bool pvs_synced, caches_known;
};

struct job {
	struct claims *cl;
	char key[320];
	bool remove;
	struct cache_claim plan;        /* apply */
	char pvc_ns[64], pvc_name[254]; /* remove (and a renamed claim's old one) */
	char pv_name[80], uid[64];
	char old_ns[64], old_name[254], old_pv[80];
	int rc;
	char err[640];
};

static void work(void *ud)
{
	struct job *j = ud;
	struct objstore *os = j->cl->os;
	if (j->remove) {
		j->rc = cache_claim_remove(os, j->pvc_ns, j->pvc_name, j->pv_name, j->uid, j->err,
		                           sizeof(j->err));
		return;
	}
	j->rc = cache_claim_apply(os, j->cl->manager, &j->plan, j->err, sizeof(j->err));
	if (j->rc == 0 && j->old_name[0]) { /* spec.claim renamed: the old one goes */
		char err[256];
		/* the volume is the same one (named by the cache's uid), now bound
		 * to the new claim */
		const char *pv = strcmp(j->old_pv, j->plan.pv_name) ? j->old_pv : "";
		if (cache_claim_remove(os, j->old_ns, j->old_name, pv, j->plan.uid, err,
		                       sizeof(err)) != 0)
			log_warn("cannot remove the former claim of a cache", "claim", j->old_name,
			         "error", err);
	}
}

static void free_rec(struct claims *cl, struct rec *r)
{
	strmap_del(&cl->recs, r->key);
	free(r->sent);
	cJSON_Delete(r->want_pv);
	free(r);
}

static int submit_remove(struct claims *cl, const char *key, const char *ns, const char *name,
                         const char *pv, const char *uid);

static void done(struct loop *l, void *ud)
{
	struct job *j = ud;
	struct claims *cl = j->cl;
	(void)l;
	struct rec *r = strmap_get(&cl->recs, j->key);
	struct pv *p = strmap_get(&cl->pvs, j->remove ? j->pv_name : j->plan.pv_name);
	if (j->rc)
		log_warn(j->remove ? "cannot remove the claim of a cache"
		                   : "cannot apply the claim of a cache",
		         "cache", j->key, "error", j->err);
	else
		log_info(j->remove ? "removed the claim of a cache"
		                   : "applied the claim of a cache",
		         "cache", j->key, "volume", j->remove ? j->pv_name : j->plan.pv_name);
	if (j->remove && p)
		p->removing = false;
	if (r && !j->remove) {
		r->busy = false;
		r->rc = j->rc;
		snprintf(r->err, sizeof(r->err), "%s", j->rc ? j->err : "");
		if (j->rc == 0) {
			snprintf(r->pvc_ns, sizeof(r->pvc_ns), "%s", j->plan.pvc_ns);
			snprintf(r->pvc_name, sizeof(r->pvc_name), "%s", j->plan.pvc_name);
			snprintf(r->pv_name, sizeof(r->pv_name), "%s", j->plan.pv_name);
			snprintf(r->uid, sizeof(r->uid), "%s", j->plan.uid);
		}
		if (r->gone) { /* deleted while applying */
			if (r->pv_name[0])
				submit_remove(cl, r->key, r->pvc_ns, r->pvc_name, r->pv_name,
				              r->uid);
			free_rec(cl, r);
		} else {
			cl->changed(j->key, cl->ud);
		}
	}
	cache_claim_clear(&j->plan);
	free(j);
}

static int submit(struct claims *cl, struct job *j)
{
	j->cl = cl;
	if (workers_submit(cl->workers, work, done, j) != 0) {
		cache_claim_clear(&j->plan);
		free(j);
		return -ENOMEM;
	}
	return 0;
}

static int submit_remove(struct claims *cl, const char *key, const char *ns, const char *name,
                         const char *pv, const char *uid)
{
	struct job *j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->remove = true;
	snprintf(j->key, sizeof(j->key), "%s", key);
	snprintf(j->pvc_ns, sizeof(j->pvc_ns), "%s", ns);
	snprintf(j->pvc_name, sizeof(j->pvc_name), "%s", name);
	snprintf(j->pv_name, sizeof(j->pv_name), "%s", pv);
	snprintf(j->uid, sizeof(j->uid), "%s", uid);
	struct pv *p = strmap_get(&cl->pvs, pv);
	if (p)
		p->removing = true;
	return submit(cl, j);
}

static struct rec *get_rec(struct claims *cl, const char *key)
{
	struct rec *r = strmap_get(&cl->recs, key);
	if (r)
		return r;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	snprintf(r->key, sizeof(r->key), "%s", key);
	if (strmap_put(&cl->recs, r->key, r) != 0) {
		free(r);
		return NULL;
	}
	return r;
}

/* ---- the Claim condition ---- */

static void add_condition(cJSON *status, const cJSON *cache, const cJSON *old, const char *st,
                          const char *reason, const char *message)
{
	char now[32];
	const char *since = NULL;
	const cJSON *c;
	cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(old, "conditions"))
	{
		if (!strcmp(obj_str(c, "type"), "Claim") && !strcmp(obj_str(c, "status"), st))
			since = obj_str(c, "lastTransitionTime");
	}
	if (!since || !*since) {
		obj_now(now, sizeof(now));
		since = now;
	}
	const cJSON *gen = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cache, "metadata"), "generation");
	cJSON *conds = cJSON_GetObjectItemCaseSensitive(status, "conditions");
	if (!cJSON_IsArray(conds))
		conds = cJSON_AddArrayToObject(status, "conditions");
	cJSON *n = cJSON_CreateObject();
	cJSON_AddStringToObject(n, "type", "Claim");
	cJSON_AddStringToObject(n, "status", st);
	cJSON_AddStringToObject(n, "reason", reason);
	cJSON_AddStringToObject(n, "message", message);
	cJSON_AddStringToObject(n, "lastTransitionTime", since);
	cJSON_AddNumberToObject(n, "observedGeneration",
	                        cJSON_IsNumber(gen) ? gen->valuedouble : 0);
	cJSON_AddItemToArray(conds, n);
}

static void condition(struct claims *cl, const struct rec *r, const struct cache_claim *plan,
                      const cJSON *cache, const cJSON *old, cJSON *status)
{
	char msg[1024];
	if (r->rc == -EINVAL) {
		add_condition(status, cache, old, "False", "InvalidClaim", r->err);
		return;
	}
	if (r->rc == -EEXIST) {
		add_condition(status, cache, old, "False", "ClaimConflict", r->err);
		return;
	}
	if (r->rc) {
		snprintf(msg, sizeof(msg), "cannot apply PersistentVolumeClaim %s/%s: %s",
		         plan->pvc_ns, plan->pvc_name, r->err);
		add_condition(status, cache, old, "False", "ClaimFailed", msg);
		return;
	}
	const struct pv *p = strmap_get(&cl->pvs, plan->pv_name);
	if (p && p->deleting) {
		snprintf(
		    msg, sizeof(msg),
		    "PersistentVolume %s is being deleted (not by gkm): Kubernetes keeps it while "
		    "PersistentVolumeClaim %s/%s is bound to it; delete the claim too and gkm "
		    "makes both again",
		    plan->pv_name, plan->pvc_ns, plan->pvc_name);
		add_condition(status, cache, old, "False", "VolumeDeleting", msg);
		return;
	}
	if (p && !strcmp(p->phase, "Bound") && !strcmp(r->pv_name, plan->pv_name)) {
		snprintf(msg, sizeof(msg),
		         "PersistentVolumeClaim %s/%s is bound to PersistentVolume %s",
		         plan->pvc_ns, plan->pvc_name, plan->pv_name);
		add_condition(status, cache, old, "True", "Bound", msg);
		return;
	}
	snprintf(msg, sizeof(msg), "PersistentVolumeClaim %s/%s and PersistentVolume %s: %s",
	         plan->pvc_ns, plan->pvc_name, plan->pv_name,
	         r->busy || !r->pv_name[0] ? "being applied"
	         : p && *p->phase          ? p->phase
	                                   : "waiting for the volume");
	add_condition(status, cache, old, "Unknown", "Pending", msg);
}

/* ---- the operator's calls ---- */

void claims_sync(struct claims *cl, const char *key, const cJSON *cache, const cJSON *old,
                 cJSON *status)
{
	struct cache_claim plan;
	char err[640];
	int rc = cache_claim_plan(cache, &plan, err, sizeof(err));
	struct rec *r = strmap_get(&cl->recs, key);
	if (rc == -ENOENT) { /* none (any more) */
		if (r && !r->busy) {
			if (r->pv_name[0])
				submit_remove(cl, key, r->pvc_ns, r->pvc_name, r->pv_name, r->uid);
			free_rec(cl, r);
		}
		return;
	}
	if (!(r = r ? r : get_rec(cl, key))) {
		cache_claim_clear(&plan);
		return;
	}
	if (rc) {
		r->rc = rc;
		snprintf(r->err, sizeof(r->err), "%s", err);
		add_condition(status, cache, old, "False", "InvalidClaim", err);
		return;
	}
	char *a = cJSON_PrintUnformatted(plan.pvc), *b = cJSON_PrintUnformatted(plan.pv);
	char *text = NULL;
	if (a && b && asprintf(&text, "%s\n%s", a, b) < 0)
		text = NULL;
	free(a);
	free(b);
	if (r->rc == -EINVAL) /* the spec was fixed: apply */
		r->rc = 0;
	if (text && !r->busy && (!r->sent || strcmp(text, r->sent) || r->recheck)) {
		struct job *j = calloc(1, sizeof(*j));
		if (j) {
			snprintf(j->key, sizeof(j->key), "%s", key);
			if (r->pv_name[0] && (strcmp(r->pvc_name, plan.pvc_name) ||
			                      strcmp(r->pvc_ns, plan.pvc_ns))) {
				snprintf(j->old_ns, sizeof(j->old_ns), "%s", r->pvc_ns);
				snprintf(j->old_name, sizeof(j->old_name), "%s", r->pvc_name);
				snprintf(j->old_pv, sizeof(j->old_pv), "%s", r->pv_name);
			}
			cJSON_Delete(r->want_pv);
			r->want_pv = cJSON_Duplicate(plan.pv, 1);
			j->plan = plan;
			j->plan.pvc = cJSON_Duplicate(plan.pvc, 1);
			j->plan.pv = cJSON_Duplicate(plan.pv, 1);
			r->busy = submit(cl, j) == 0;
			if (r->busy) {
				r->recheck = false;
				free(r->sent);
				r->sent = text;
				text = NULL;
			}
		}
	}
	free(text);
	condition(cl, r, &plan, cache, old, status);
	cache_claim_clear(&plan);
}

void claims_cache_deleted(struct claims *cl, const char *key)
{
	struct rec *r = strmap_get(&cl->recs, key);
	if (!r)
		return;
	if (r->busy) { /* removed when the apply is done */
		r->gone = true;
		return;
	}
	if (r->pv_name[0])
		submit_remove(cl, key, r->pvc_ns, r->pvc_name, r->pv_name, r->uid);
	free_rec(cl, r);
}

void claims_resync(struct claims *cl)
{
	size_t pos = 0;
	void *v;
	while (strmap_next(&cl->recs, &pos, NULL, &v))
		((struct rec *)v)->recheck = true;
}

/* ---- the volumes ---- */

static void orphan_check(struct claims *cl, struct pv *p)
{
	if (!cl->pvs_synced || !cl->caches_known || p->deleting || p->removing)
		return;
	struct rec *r = strmap_get(&cl->recs, p->key);
	if (r && !r->gone && (!strcmp(r->uid, p->uid) || r->busy))
		return;
	log_info("removing the claim of a cache that is gone", "volume", p->name, "cache", p->key);
	submit_remove(cl, p->key, p->ref_ns, p->ref_name, p->name, p->uid);
}

static void on_pv(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct claims *cl = ud;
	const char *name = obj_str(obj, "metadata.name");
	struct pv *p = strmap_get(&cl->pvs, name);
	if (t == OBJSTORE_DELETED) {
		if (!p)
			return;
		struct rec *r = strmap_get(&cl->recs, p->key);
		if (r && !r->gone) { /* deleted by hand: made again */
			r->recheck = true;
			cl->changed(p->key, cl->ud);
		}
		strmap_del(&cl->pvs, p->name);
		free(p);
		return;
	}
	if (!p) {
		if (!(p = calloc(1, sizeof(*p))))
			return;
		snprintf(p->name, sizeof(p->name), "%s", name);
		if (strmap_put(&cl->pvs, p->name, p) != 0) {
			free(p);
			return;
		}
	}
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "annotations");
	const cJSON *cns = cJSON_GetObjectItemCaseSensitive(ann, "gkm.io/cache-namespace");
	const cJSON *cname = cJSON_GetObjectItemCaseSensitive(ann, "gkm.io/cache-name");
	const cJSON *cuid = cJSON_GetObjectItemCaseSensitive(ann, "gkm.io/cache-uid");
	snprintf(p->key, sizeof(p->key), "%s/%s",
	         cJSON_IsString(cns) && *cns->valuestring ? cns->valuestring : "_cluster",
	         cJSON_IsString(cname) ? cname->valuestring : "");
	snprintf(p->uid, sizeof(p->uid), "%s", cJSON_IsString(cuid) ? cuid->valuestring : "");
	const char *phase = obj_str(obj, "status.phase");
	bool phase_changed = strcmp(p->phase, phase) != 0;
	snprintf(p->phase, sizeof(p->phase), "%s", phase);
	snprintf(p->ref_ns, sizeof(p->ref_ns), "%s", obj_str(obj, "spec.claimRef.namespace"));
	snprintf(p->ref_name, sizeof(p->ref_name), "%s", obj_str(obj, "spec.claimRef.name"));
	bool deleting = *obj_str(obj, "metadata.deletionTimestamp") != '\0';
	phase_changed = phase_changed || deleting != p->deleting;
	p->deleting = deleting;
	struct rec *r = strmap_get(&cl->recs, p->key);
	bool ours = r && !r->gone && !strcmp(r->uid, p->uid) && r->want_pv && !r->busy;
	if (ours && !deleting &&
	    (!cache_claim_pv_matches(r->want_pv, obj) || !strcmp(phase, "Released"))) {
		/* edited, or its claim deleted by hand */
		log_warn("the claim of a cache or its volume was changed by hand: applying them "
		         "again",
		         "volume", p->name, "cache", p->key, "phase", phase);
		r->recheck = true;
		cl->changed(p->key, cl->ud);
	} else if (r && phase_changed) {
		cl->changed(p->key, cl->ud);
	}
	orphan_check(cl, p);
}

static void check_all(struct claims *cl)
{
	size_t pos = 0;
	void *v;
	while (strmap_next(&cl->pvs, &pos, NULL, &v))
		orphan_check(cl, v);
}

static void on_pv_synced(void *ud)
{
	struct claims *cl = ud;
	cl->pvs_synced = true;
	check_all(cl);
}

void claims_caches_known(struct claims *cl)
{
	cl->caches_known = true;
	check_all(cl);
}

int claims_new(struct workers *w, struct objstore *os, const char *manager,
               void (*changed)(const char *key, void *ud), void *ud, struct claims **out)
{
	struct claims *cl = calloc(1, sizeof(*cl));
	if (!cl)
		return -ENOMEM;
	cl->workers = w;
	cl->os = os;
	cl->manager = manager;
	cl->changed = changed;
	cl->ud = ud;
	struct objstore_watch watch = {.api_version = "v1",
	                               .kind = "PersistentVolume",
	                               .label_selector = CACHE_CLAIM_LABEL,
	                               .on_event = on_pv,
	                               .on_synced = on_pv_synced,
	                               .ud = cl,
	                               .no_cache = true};
	int rc = os->ops->watch(os, &watch);
	if (rc) {
		free(cl);
		return rc;
	}
	*out = cl;
	return 0;
}

void claims_free(struct claims *cl)
{
	if (!cl)
		return;
	size_t pos = 0;
	void *v;
	while (strmap_next(&cl->recs, &pos, NULL, &v)) {
		free(((struct rec *)v)->sent);
		cJSON_Delete(((struct rec *)v)->want_pv);
		free(v);
	}
	strmap_clear(&cl->recs);
	pos = 0;
	while (strmap_next(&cl->pvs, &pos, NULL, &v))
		free(v);
	strmap_clear(&cl->pvs);
	free(cl);
}
