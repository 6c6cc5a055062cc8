/* The agent's captures of pods' writable volumes (node_capture.h). */

#include "agent_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node_capture.h"

struct capture_job {
	struct agent *a;
	char key[320];
	struct node_capture k;
};

static void capture_work(void *ud)
{
	struct capture_job *cj = ud;
	node_capture_run(&cj->k);
}

static void capture_done(struct loop *l, void *ud)
{
	struct capture_job *cj = ud;
	struct agent *a = cj->a;
	(void)l;
	a->jobs--;
	a->capturing = false;
	struct cache *c = agent_find_cache(a, cj->key);
	if (c && cj->k.record) {
		if (!c->captures)
			c->captures = cJSON_CreateArray();
		cJSON_AddItemToArray(c->captures, cj->k.record);
		cj->k.record = NULL;
		while (cJSON_GetArraySize(c->captures) > NODE_CAPTURE_RECORDS)
			cJSON_DeleteItemFromArray(c->captures, 0);
		node_capture_records_save(a->root, c->ns, c->name, c->captures);
		agent_mark_dirty(a, c->ns);
	}
	node_capture_clear(&cj->k);
	free(cj);
	agent_captures_start(a);
}

/* The writable volumes of c live on this node, [{dir, pod}], for a capture
 * on demand (their layers are in the CSI plugin's state directory, ROOT/csi). */
static cJSON *live_volumes(struct agent *a, const struct cache *c)
{
	struct cache_view_usage u;
	cJSON *list = cJSON_CreateArray();
	if (cache_view_usage_read(a->run_dir, c->ns, c->name, &u) != 0)
		return list;
	for (size_t i = 0; i < u.npods; i++) {
		const struct cache_view_pod *p = &u.pods[i];
		char dir[PATH_MAX];
		if (p->read_only || p->fallback ||
		    agent_volume_dir(a, p->volume_id, NULL, dir, sizeof(dir)) != 0)
			continue;
		cJSON *v = cJSON_CreateObject(), *pod = cJSON_AddObjectToObject(v, "pod");
		cJSON_AddStringToObject(v, "dir", dir);
		cJSON_AddStringToObject(pod, "name", p->name);
		cJSON_AddStringToObject(pod, "namespace", p->namespace);
		cJSON_AddStringToObject(pod, "uid", p->uid);
		cJSON_AddStringToObject(pod, "node", a->node);
		cJSON_AddItemToArray(list, v);
	}
	cache_view_usage_free(&u);
	return list;
}

/* The next capture, once the cache is published here (its image is the
 * capture's base): a live volume a capture on demand asked for, else a
 * volume the CSI plugin handed over at unpublish. */
void agent_captures_start(struct agent *a)
{
	char dir[PATH_MAX], repo[512];
	for (struct cache *c = a->caches; c && !a->capturing && !a->stopping; c = c->next) {
		bool repo_set = c->obj && node_capture_repository(c->obj, repo, sizeof(repo));
		bool pending = node_capture_pending(a->root, c->ns, c->name, dir, sizeof(dir)) == 0;
		if (pending && !repo_set) {
			node_capture_discard(dir, "the cache does not capture");
			continue;
		}
		if (!repo_set || !c->ref[0] || !c->view_digest[0] ||
		    strcmp(c->view_digest, c->digest) != 0)
			continue;
		if (node_capture_demanded(a->root, c->ns, c->name, c->obj, &c->demand)) {
			cJSON_Delete(c->live);
			c->live = live_volumes(a, c);
		}
		cJSON *live = cJSON_DetachItemFromArray(c->live, 0);
		if (!live && !pending)
			continue;
		struct capture_job *cj = calloc(1, sizeof(*cj));
		if (!cj) {
			cJSON_Delete(live);
			return;
		}
		cj->a = a;
		snprintf(cj->key, sizeof(cj->key), "%s", c->key);
		snprintf(cj->k.dir, sizeof(cj->k.dir), "%s", live ? obj_str(live, "dir") : dir);
		cj->k.live = live != NULL;
		cj->k.pod = live ? cJSON_DetachItemFromObjectCaseSensitive(live, "pod") : NULL;
		cJSON_Delete(live);
		snprintf(cj->k.work, sizeof(cj->k.work), "%s/%s/.work-XXXXXX", a->root,
		         CACHE_VIEW_CAPTURES);
		snprintf(cj->k.base, sizeof(cj->k.base), "%s", c->ref);
		snprintf(cj->k.repository, sizeof(cj->k.repository), "%s", repo);
		cj->k.gpus_json = cJSON_PrintUnformatted(a->gpus);
		cj->k.os = a->os;
		cj->k.cancel = &a->cancel;
		cj->k.cache = cJSON_Duplicate(c->obj, 1);
		pull_secret_ref_of(c->obj, a->o.namespace_, a->o.global_credentials,
		                   &cj->k.secrets);
		a->capturing = true;
		a->jobs++;
		if (workers_submit(a->workers, capture_work, capture_done, cj) != 0) {
			a->jobs--;
			a->capturing = false;
			node_capture_clear(&cj->k);
			free(cj);
		}
	}
}
