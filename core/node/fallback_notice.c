#include "fallback_notice.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* One fallback volume the pod was told about. */
struct told {
	char cache[320];
	char volume_id[260];
	bool seen; /* in the usage just read */
};

struct fallback_notice {
	struct workers *w;
	struct objstore *os;
	struct told *told;
	size_t n, cap;
};

struct event_job {
	struct objstore *os;
	cJSON *regarding;
	const char *reason;
	char msg[1024];
};

int fallback_notice_new(struct workers *w, struct objstore *os, struct fallback_notice **out)
{
	struct fallback_notice *fn = calloc(1, sizeof(*fn));
	if (!fn)
		return -ENOMEM;
	fn->w = w;
	fn->os = os;
	*out = fn;
	return 0;
}

void fallback_notice_free(struct fallback_notice *fn)
{
	if (!fn)
		return;
	free(fn->told);
	free(fn);
}

/* The Pod ns/name (uid) as an Event's regarding object; NULL when out of
 * memory. */
static cJSON *pod_object(const char *name, const char *ns, const char *uid)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *meta = o ? cJSON_AddObjectToObject(o, "metadata") : NULL;
	if (meta && cJSON_AddStringToObject(o, "apiVersion", "v1") &&
	    cJSON_AddStringToObject(o, "kind", "Pod") &&
	    cJSON_AddStringToObject(meta, "name", name) &&
	    cJSON_AddStringToObject(meta, "namespace", ns) &&
	    cJSON_AddStringToObject(meta, "uid", uid ? uid : ""))
		return o;
	cJSON_Delete(o);
	return NULL;
}

int fallback_notice_event(const struct cache_view_pod *p, cJSON **regarding, char *msg,
                          size_t msglen)
{
	if (!p->fallback || !p->name || !*p->name || !p->namespace || !*p->namespace)
		return -EINVAL;
	cJSON *o = pod_object(p->name, p->namespace, p->uid);
	if (!o)
		return -ENOMEM;
	snprintf(msg, msglen,
	         "%s; volume %s is an empty, writable directory instead (onMiss: empty), so the "
	         "kernels are compiled as without a cache",
	         p->fallback_message && *p->fallback_message ? p->fallback_message
	                                                     : "the cache is not usable here",
	         p->volume_id ? p->volume_id : "");
	*regarding = o;
	return 0;
}

static void event_work(void *ud)
{
	struct event_job *j = ud;
	/* Best effort, like every Event: a failure is logged by the store. */
	(void)j->os->ops->event(j->os, j->regarding, "Warning", j->reason, j->msg, NULL);
}

static void event_done(struct loop *l, void *ud)
{
	struct event_job *j = ud;
	(void)l;
	cJSON_Delete(j->regarding);
	free(j);
}

/* Queue a Warning Event about regarding (taken); 0 when it is on its way. */
static int queue_event(struct fallback_notice *fn, cJSON *regarding, const char *reason,
                       const char *msg)
{
	struct event_job *j = calloc(1, sizeof(*j));
	if (!j) {
		cJSON_Delete(regarding);
		return -ENOMEM;
	}
	j->os = fn->os;
	j->regarding = regarding;
	j->reason = reason;
	snprintf(j->msg, sizeof(j->msg), "%s", msg);
	int rc = workers_submit(fn->w, event_work, event_done, j);
	if (rc) {
		cJSON_Delete(j->regarding);
		free(j);
	}
	return rc;
}

/* Queue the Event of p; 0 when it is on its way. */
static int send_event(struct fallback_notice *fn, const struct cache_view_pod *p)
{
	cJSON *regarding = NULL;
	char msg[1024];
	int rc = fallback_notice_event(p, &regarding, msg, sizeof(msg));
	return rc ? rc : queue_event(fn, regarding, FALLBACK_NOTICE_REASON, msg);
}

void fallback_notice_pod_event(struct fallback_notice *fn, const char *name, const char *ns,
                               const char *uid, const char *reason, const char *msg)
{
	cJSON *regarding = *name && *ns ? pod_object(name, ns, uid) : NULL;
	if (regarding)
		(void)queue_event(fn, regarding, reason, msg);
}

static struct told *find(struct fallback_notice *fn, const char *cache, const char *volume_id)
{
	for (size_t i = 0; i < fn->n; i++)
		if (!strcmp(fn->told[i].cache, cache) && !strcmp(fn->told[i].volume_id, volume_id))
			return &fn->told[i];
	return NULL;
}

static int remember(struct fallback_notice *fn, const char *cache, const char *volume_id)
{
	if (fn->n == fn->cap) {
		size_t ncap = fn->cap ? fn->cap * 2 : 16;
		struct told *nt = realloc(fn->told, ncap * sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		fn->told = nt;
		fn->cap = ncap;
	}
	struct told *t = &fn->told[fn->n++];
	snprintf(t->cache, sizeof(t->cache), "%s", cache);
	snprintf(t->volume_id, sizeof(t->volume_id), "%s", volume_id);
	t->seen = true;
	return 0;
}

/* Mark the volumes told of cache (NULL: of every cache) as not seen yet. */
static void unsee(struct fallback_notice *fn, const char *cache)
{
	for (size_t i = 0; i < fn->n; i++)
		if (!cache || !strcmp(fn->told[i].cache, cache))
			fn->told[i].seen = false;
}

/* Forget the volumes of cache (NULL: of every cache) not seen since unsee(). */
static void forget_unseen(struct fallback_notice *fn, const char *cache)
{
	size_t kept = 0;
	for (size_t i = 0; i < fn->n; i++)
		if (fn->told[i].seen || (cache && strcmp(fn->told[i].cache, cache) != 0))
			fn->told[kept++] = fn->told[i];
	fn->n = kept;
}

void fallback_notice_usage(struct fallback_notice *fn, const char *cache_key,
                           const struct cache_view_usage *u)
{
	unsee(fn, cache_key);
	for (size_t i = 0; u && i < u->npods; i++) {
		const struct cache_view_pod *p = &u->pods[i];
		if (!p->fallback || !p->volume_id)
			continue;
		struct told *t = find(fn, cache_key, p->volume_id);
		if (t) {
			t->seen = true;
			continue;
		}
		int rc = send_event(fn, p);
		if (rc == -EINVAL) /* no pod named (the CSIDriver lacks podInfoOnMount) */
			rc = 0;
		if (rc == 0)
			rc = remember(fn, cache_key, p->volume_id);
		if (rc)
			log_warn("cannot tell a pod that its volume is a fallback", "pod", p->name,
			         "namespace", p->namespace, "volume", p->volume_id, "error",
			         strerror(-rc));
	}
	forget_unseen(fn, cache_key);
}

void fallback_notice_scan(struct fallback_notice *fn, const char *run_dir)
{
	struct cache_view_usage *list = NULL;
	size_t n = 0;
	char key[320];
	int rc = cache_view_usage_list(run_dir, &list, &n);
	if (rc) {
		log_warn("cannot list the usage files", "dir", run_dir, "error", strerror(-rc));
		return;
	}
	unsee(fn, NULL);
	for (size_t i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "%s/%s",
		         list[i].namespace[0] ? list[i].namespace : CACHE_VIEW_CLUSTER,
		         list[i].name);
		fallback_notice_usage(fn, key, &list[i]);
	}
	cache_view_usage_list_free(list, n);
	/* fallback_notice_usage() marked what it found in each file */
	forget_unseen(fn, NULL);
}
