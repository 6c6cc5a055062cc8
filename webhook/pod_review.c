/* Pod reviews on /mutate-pods: placement and image volumes.
 *
 * For every volume of the pod that mounts a cache (a csi.gkm.io volume, or
 * an image volume whose repository is the image of a GKMCache of the pod's
 * namespace or of a ClusterGKMCache):
 *  - an image volume is verified as a GKMCache is (the reviewer's checks and
 *    admission.lua): refused with the policy's reason, or pinned to the
 *    verified digest;
 *  - placement.lua decides the node affinity on the cache's Node label;
 *  - the pod is admitted with the affinity, annotation gkm.io/placement
 *    (what was decided for each volume and why), warnings for caches that
 *    are Ready nowhere, and an Event on each cache.
 * A pod with no such volume, or in an excluded namespace, is allowed
 * unchanged without reaching the loop. A failing placement policy admits
 * the pod without affinity (placement fails open); a failing verification
 * refuses it (an image is never mounted unchecked). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_label.h"
#include "log.h"
#include "pod_env.h"
#include "pod_patch.h"
#include "pod_volumes.h"
#include "pull_secret.h"
#include "review.h"

#define PLACEMENT_ANNOTATION "gkm.io/placement"
#define WARNINGS_MAX 8
/* "GKMCache ns/name": 16 + 63 + 1 + 253 */
#define CACHE_TEXT_MAX 340

/* One volume that mounts a cache, with what was known of the cache when
 * the review started (the catalog may change while checks run). */
struct pod_cache {
	const struct pod_volume *v;
	bool known, cluster, ready;
	char ns[64], name[256], label[CACHE_LABEL_KEY_MAX];
	long ready_nodes, total_nodes;
	struct check *check; /* image volumes */
	char *pinned_ref;    /* image volumes: the reference with the verified digest */
	/* the decision */
	enum pod_place_mode mode;
	int weight;
	char reason[520];
	char warning[400]; /* the policy's warning for the pod ("" for none) */
	char refuse[400];  /* the policy refuses the pod, saying why ("" to admit) */
};

struct pod_review {
	struct pod_info info;
	struct pod_cache *caches;
	size_t n;
	char who[600]; /* "ns/name" */
};

void pod_review_free(struct pod_review *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		free(p->caches[i].pinned_ref);
	free(p->caches);
	pod_info_clear(&p->info);
	free(p);
}

static bool excluded(const struct reviewer *r, const char *ns)
{
	for (const char *const *x = r->o.exclude_namespaces; x && *x; x++)
		if (strcmp(*x, ns) == 0)
			return true;
	return false;
}

int pod_review_prepare(struct review *rv, char *err, size_t errlen)
{
	const cJSON *obj = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(rv->req.doc, "request"), "object");
	struct pod_info info;
	if (excluded(rv->r, rv->req.namespace_))
		return 1;
	int rc = pod_info_read(obj, rv->req.namespace_, &info, err, errlen);
	if (rc != 0)
		return rc;
	if (info.n == 0) {
		pod_info_clear(&info);
		return 1;
	}
	struct pod_review *p = calloc(1, sizeof(*p));
	if (!p || !(p->caches = calloc(info.n, sizeof(*p->caches)))) {
		free(p);
		pod_info_clear(&info);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->info = info;
	pod_info_display(&p->info, p->who, sizeof(p->who));
	rv->pod = p;
	rv->req.annotations = info.annotations;
	return 0;
}

static const char *mount_name(const struct pod_cache *pc)
{
	return pc->v->mount == POD_MOUNT_IMAGE   ? "image"
	       : pc->v->mount == POD_MOUNT_CLAIM ? "claim"
	                                         : "csi";
}

static const char *kind_of(const struct pod_cache *pc)
{
	return pc->cluster ? "ClusterGKMCache" : "GKMCache";
}

/* "GKMCache ns/name" or "ClusterGKMCache name". */
static void cache_display(const struct pod_cache *pc, char *buf, size_t len)
{
	if (pc->cluster)
		snprintf(buf, len, "ClusterGKMCache %s", pc->name);
	else
		snprintf(buf, len, "GKMCache %s/%s", pc->ns, pc->name);
}

static void allow_unchanged(struct review *rv, const char *warning)
{
	struct admission_response ok = {.uid = rv->req.uid, .allowed = true, .warning = warning};
	review_finish(rv, &ok);
}

static void fill_from_catalog(struct pod_cache *pc, const struct catalog_cache *e)
{
	pc->known = true;
	pc->ready = e->ready;
	pc->ready_nodes = e->ready_nodes;
	pc->total_nodes = e->total_nodes;
}

/* An image volume: the cache whose image it names, and the check of it.
 * false when it names no cache (it is left alone). */
static bool match_image(struct review *rv, struct pod_cache *pc, struct check *c)
{
	struct oci_err oerr;
	const struct catalog_cache *e;
	if (oci_ref_parse(pc->v->reference, &c->ref, &oerr) != 0)
		return false;
	if (c->ref.kind != OCI_REF_REGISTRY ||
	    !(e = cache_catalog_find_image(rv->r->o.catalog, rv->req.namespace_, &c->ref))) {
		oci_ref_clear(&c->ref);
		return false;
	}
	pc->cluster = e->cluster;
	snprintf(pc->ns, sizeof(pc->ns), "%s", e->ns);
	snprintf(pc->name, sizeof(pc->name), "%s", e->name);
	snprintf(pc->label, sizeof(pc->label), "%s", e->label);
	fill_from_catalog(pc, e);
	c->rv = rv;
	c->image = pc->v->reference;
	/* the tag the cache was admitted with is checked at the digest the
	 * nodes pulled for it, so the label means what is mounted */
	if (!c->ref.digest && c->ref.tag && e->ref.tag && strcmp(c->ref.tag, e->ref.tag) == 0 &&
	    e->digest[0])
		snprintf(c->pinned, sizeof(c->pinned), "%s", e->digest);
	c->ref_text = oci_ref_format(&c->ref);
	pc->check = c;
	c->global = pull_secret_global(rv->r->o.global_credentials, e->cluster ? "" : e->ns);
	return true;
}

void pod_review_start(struct review *rv)
{
	struct reviewer *r = rv->r;
	struct pod_review *p = rv->pod;
	const struct pod_info *info = &p->info;
	bool images = false, csi = false;
	size_t n = 0;
	for (size_t i = 0; i < info->n; i++) {
		images = images || info->vols[i].mount == POD_MOUNT_IMAGE;
		csi = csi || info->vols[i].mount == POD_MOUNT_CSI;
	}
	if (!r->catalog_synced) {
		if (images) {
			review_deny(
			    rv, "WebhookNotReady",
			    "the admission webhook has not loaded the list of caches yet, so "
			    "it cannot tell whether an image volume of this pod names a cache "
			    "image that must be verified; try again shortly");
			return;
		}
		allow_unchanged(rv, csi ? "gkm placement skipped: the admission webhook has not "
		                          "loaded the list of caches yet"
		                        : NULL);
		return;
	}
	if (images && !(rv->checks = calloc(info->n, sizeof(*rv->checks)))) {
		review_deny(rv, "WebhookError", "out of memory");
		return;
	}
	for (size_t i = 0; i < info->n; i++) {
		struct pod_cache *pc = &p->caches[n];
		memset(pc, 0, sizeof(*pc));
		pc->v = &info->vols[i];
		if (pc->v->mount == POD_MOUNT_IMAGE) {
			struct check *c = &rv->checks[rv->nchecks];
			if (!match_image(rv, pc, c))
				continue;
			rv->nchecks++;
			if (!c->ref_text) {
				review_deny(rv, "WebhookError", "out of memory");
				return;
			}
		} else if (pc->v->mount == POD_MOUNT_CLAIM) {
			const struct catalog_cache *e =
			    cache_catalog_find_claim(r->o.catalog, info->namespace_, pc->v->claim);
			if (!e)
				continue; /* a claim of no cache: left alone */
			pc->cluster = e->cluster;
			snprintf(pc->ns, sizeof(pc->ns), "%s", e->ns);
			snprintf(pc->name, sizeof(pc->name), "%s", e->name);
			snprintf(pc->label, sizeof(pc->label), "%s", e->label);
			fill_from_catalog(pc, e);
		} else {
			const char *ns = pc->v->cache_namespace;
			pc->cluster = !ns[0];
			snprintf(pc->ns, sizeof(pc->ns), "%s", ns);
			snprintf(pc->name, sizeof(pc->name), "%s", pc->v->cache_name);
			if (cache_label_key(ns, pc->name, pc->label, sizeof(pc->label)) != 0)
				pc->label[0] = '\0'; /* the reader checked the name: not reached */
			const struct catalog_cache *e =
			    cache_catalog_get(r->o.catalog, ns, pc->v->cache_name);
			if (e)
				fill_from_catalog(pc, e);
		}
		n++;
	}
	p->n = n;
	if (n == 0) { /* image volumes and claims only, none of them a cache's */
		allow_unchanged(rv, NULL);
		return;
	}
	review_run_checks(rv);
}

/* ---- deciding ---- */

static void note_event(struct review *rv, const struct pod_cache *pc, bool warning,
                       const char *reason, const char *mode, const char *what)
{
	struct reviewer *r = rv->r;
	if (!r->o.events || rv->req.dry_run)
		return;
	const struct catalog_cache *e =
	    cache_catalog_get(r->o.catalog, pc->cluster ? NULL : pc->ns, pc->name);
	if (e) /* a cache that does not exist has nothing to record it on */
		placement_events_note(r->o.events, e, warning, reason, mode, rv->pod->who, what);
}

/* Verify each image volume as a GKMCache is. false when the review was denied. */
static bool verify_images(struct review *rv)
{
	struct pod_review *p = rv->pod;
	char reason[80], message[1024], cache[CACHE_TEXT_MAX], what[1200];
	for (size_t i = 0; i < p->n; i++) {
		struct pod_cache *pc = &p->caches[i];
		const struct check *c = pc->check;
		if (!c)
			continue;
		cache_display(pc, cache, sizeof(cache));
		if (c->fail_reason) {
			review_deny(rv, c->fail_reason, "volume '%s' (the image of %s): %s",
			            pc->v->name, cache, c->message);
			return false;
		}
		const char *name = p->info.name[0] ? p->info.name : p->info.generate_name;
		if (!review_admission_policy(rv, c, name, p->info.annotations, reason,
		                             sizeof(reason), message, sizeof(message))) {
			snprintf(what, sizeof(what), "refused: image volume '%s' (%s): %s: %s",
			         pc->v->name, c->image, reason, message);
			note_event(rv, pc, true, "PodRefused", "refused", what);
			review_deny(rv, reason, "volume '%s' mounts image %s of %s: %s",
			            pc->v->name, c->image, cache, message);
			return false;
		}
		if (!c->ref.digest && asprintf(&pc->pinned_ref, "%s@%s", c->image, c->digest) < 0) {
			pc->pinned_ref = NULL;
			review_deny(rv, "WebhookError", "out of memory");
			return false;
		}
	}
	return true;
}

/* The identity the cache's image records (the runtime versions it was
 * compiled by), as an object; nothing when unknown or none. false when out
 * of memory. */
static bool add_identity(const struct review *rv, const struct pod_cache *pc, cJSON *o)
{
	cJSON *id = NULL;
	if (pc->check) { /* an image volume: from its check */
		id = pc->check->verdict.identity[0] ? cJSON_Parse(pc->check->verdict.identity)
		                                    : NULL;
	} else {
		const struct catalog_cache *e =
		    cache_catalog_get(rv->r->o.catalog, pc->cluster ? NULL : pc->ns, pc->name);
		if (e && e->identity && !(id = cJSON_Duplicate(e->identity, true)))
			return false;
	}
	if (!cJSON_IsObject(id)) {
		cJSON_Delete(id);
		return true;
	}
	return cJSON_AddItemToObject(o, "identity", id);
}

/* The pod's annotation gkm.io/runtime ("triton=3.2.0,vllm=0.11.0") as
 * pod.runtime = {triton = "3.2.0", ...}; nothing when absent. */
static bool add_runtime(const cJSON *annotations, cJSON *pod)
{
	const cJSON *a =
	    cJSON_GetObjectItemCaseSensitive(annotations, CACHE_ENV_RUNTIME_ANNOTATION);
	if (!cJSON_IsString(a))
		return true;
	cJSON *rt = cJSON_AddObjectToObject(pod, "runtime");
	if (!rt)
		return false;
	for (const char *s = a->valuestring; s && *s;) {
		const char *end = strchr(s, ','), *eq;
		size_t len = end ? (size_t)(end - s) : strlen(s);
		char key[64], val[128];
		while (len && *s == ' ')
			s++, len--;
		if ((eq = memchr(s, '=', len)) && (size_t)(eq - s) < sizeof(key) &&
		    len - (size_t)(eq - s) - 1 < sizeof(val) && eq > s) {
			snprintf(key, sizeof(key), "%.*s", (int)(eq - s), s);
			snprintf(val, sizeof(val), "%.*s", (int)(len - (size_t)(eq - s) - 1),
			         eq + 1);
			if (!cJSON_GetObjectItemCaseSensitive(rt, key) &&
			    !cJSON_AddStringToObject(rt, key, val))
				return false;
		}
		s = end ? end + 1 : NULL;
	}
	return true;
}

static cJSON *placement_input(const struct review *rv)
{
	const struct pod_review *p = rv->pod;
	cJSON *in = cJSON_CreateObject(), *pod, *caches, *o;
	if (!in || !(pod = cJSON_AddObjectToObject(in, "pod")) ||
	    !cJSON_AddStringToObject(pod, "namespace", p->info.namespace_) ||
	    !cJSON_AddStringToObject(pod, "name", p->info.name) ||
	    !cJSON_AddStringToObject(pod, "generateName", p->info.generate_name) ||
	    !cJSON_AddItemToObject(pod, "labels",
	                           p->info.labels ? cJSON_Duplicate(p->info.labels, true)
	                                          : cJSON_CreateObject()) ||
	    !cJSON_AddItemToObject(pod, "annotations",
	                           p->info.annotations ? cJSON_Duplicate(p->info.annotations, true)
	                                               : cJSON_CreateObject()) ||
	    !(caches = cJSON_AddArrayToObject(in, "caches")))
		goto fail;
	for (size_t i = 0; i < p->n; i++) {
		const struct pod_cache *pc = &p->caches[i];
		bool image = pc->v->mount == POD_MOUNT_IMAGE;
		if (!(o = cJSON_CreateObject()) || !cJSON_AddItemToArray(caches, o) ||
		    !cJSON_AddStringToObject(o, "volume", pc->v->name) ||
		    !cJSON_AddStringToObject(o, "mount", mount_name(pc)) ||
		    !cJSON_AddStringToObject(o, "kind", kind_of(pc)) ||
		    (!pc->cluster && !cJSON_AddStringToObject(o, "namespace", pc->ns)) ||
		    !cJSON_AddStringToObject(o, "name", pc->name) ||
		    !cJSON_AddStringToObject(o, "label", pc->label) ||
		    !cJSON_AddBoolToObject(o, "known", pc->known) ||
		    !cJSON_AddNumberToObject(o, "readyNodes", (double)pc->ready_nodes) ||
		    !cJSON_AddNumberToObject(o, "totalNodes", (double)pc->total_nodes) ||
		    !cJSON_AddBoolToObject(o, "ready", pc->ready) ||
		    (pc->v->attributes &&
		     !cJSON_AddItemToObject(o, "attributes",
		                            cJSON_Duplicate(pc->v->attributes, true))) ||
		    (image && !cJSON_AddStringToObject(o, "image",
		                                       pc->pinned_ref ? pc->pinned_ref
		                                                      : pc->v->reference)) ||
		    !add_identity(rv, pc, o))
			goto fail;
	}
	if (!add_runtime(p->info.annotations, pod))
		goto fail;
	return in;
fail:
	cJSON_Delete(in);
	return NULL;
}

/* Run placement.lua into each cache's mode, weight and reason. NULL, or
 * why it failed (the pod is then placed nowhere in particular). */
static const char *decide_placements(struct review *rv, char *err, size_t errlen)
{
	struct pod_review *p = rv->pod;
	struct engine *e = rv->r->o.policy->current;
	struct engine_error eerr;
	cJSON *out = NULL, *in = placement_input(rv);
	if (!in)
		return "out of memory";
	enum engine_status st = e ? engine_call(e, "placement", in, &out, &eerr) : ENGINE_NO_HOOK;
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		snprintf(err, errlen, "%s: %.400s", engine_status_name(st),
		         e ? eerr.message : "no policy loaded");
		return err;
	}
	const cJSON *ps = cJSON_GetObjectItemCaseSensitive(out, "placements");
	for (size_t i = 0; i < p->n; i++) {
		struct pod_cache *pc = &p->caches[i];
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(ps, pc->v->name);
		const cJSON *mode = cJSON_GetObjectItemCaseSensitive(d, "mode");
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(d, "weight");
		const cJSON *why = cJSON_GetObjectItemCaseSensitive(d, "reason");
		if (!cJSON_IsString(mode)) {
			snprintf(err, errlen, "placement.evaluate gave no decision for volume '%s'",
			         pc->v->name);
			cJSON_Delete(out);
			return err;
		}
		pc->mode = !strcmp(mode->valuestring, "required")    ? POD_PLACE_REQUIRED
		           : !strcmp(mode->valuestring, "preferred") ? POD_PLACE_PREFERRED
		                                                     : POD_PLACE_NONE;
		pc->weight = cJSON_IsNumber(w) ? (int)w->valuedouble : 0;
		snprintf(pc->reason, sizeof(pc->reason), "%s",
		         cJSON_IsString(why) ? why->valuestring : "");
		const cJSON *warn = cJSON_GetObjectItemCaseSensitive(d, "warning");
		const cJSON *refuse = cJSON_GetObjectItemCaseSensitive(d, "refuse");
		snprintf(pc->warning, sizeof(pc->warning), "%s",
		         cJSON_IsString(warn) ? warn->valuestring : "");
		snprintf(pc->refuse, sizeof(pc->refuse), "%s",
		         cJSON_IsString(refuse) ? refuse->valuestring : "");
	}
	cJSON_Delete(out);
	return NULL;
}

static const char *const mode_names[] = {"none", "required", "preferred"};

/* The annotation: what was decided for each volume and why, as JSON. */
static char *annotation_of(const struct pod_review *p)
{
	cJSON *a = cJSON_CreateArray(), *o;
	char cache[CACHE_TEXT_MAX];
	char *text = NULL;
	for (size_t i = 0; a && i < p->n; i++) {
		const struct pod_cache *pc = &p->caches[i];
		cache_display(pc, cache, sizeof(cache));
		if (!(o = cJSON_CreateObject()) || !cJSON_AddItemToArray(a, o) ||
		    !cJSON_AddStringToObject(o, "volume", pc->v->name) ||
		    !cJSON_AddStringToObject(o, "cache", cache) ||
		    !cJSON_AddStringToObject(o, "label", pc->label) ||
		    !cJSON_AddStringToObject(o, "mode", mode_names[pc->mode]) ||
		    (pc->mode == POD_PLACE_PREFERRED &&
		     !cJSON_AddNumberToObject(o, "weight", pc->weight)) ||
		    !cJSON_AddStringToObject(o, "reason", pc->reason) ||
		    (pc->pinned_ref && !cJSON_AddStringToObject(o, "image", pc->pinned_ref)))
			goto out;
	}
	text = a ? cJSON_PrintUnformatted(a) : NULL;
out:
	cJSON_Delete(a);
	return text;
}

/* "required node affinity K=ready" and the like, for Events and warnings. */
static void affinity_text(const struct pod_cache *pc, char *buf, size_t len)
{
	if (pc->mode == POD_PLACE_REQUIRED)
		snprintf(buf, len, "required node affinity %s=" CACHE_LABEL_VALUE, pc->label);
	else if (pc->mode == POD_PLACE_PREFERRED)
		snprintf(buf, len, "preferred node affinity %s=" CACHE_LABEL_VALUE " (weight %d)",
		         pc->label, pc->weight);
	else
		snprintf(buf, len, "no node affinity");
}

/* A warning for a cache that no node has Ready, saying what that means for
 * the pod; "" when some node has it. */
static void readiness_warning(const struct pod_cache *pc, char *buf, size_t len)
{
	char cache[CACHE_TEXT_MAX];
	buf[0] = '\0';
	if (pc->known && pc->ready_nodes > 0)
		return;
	cache_display(pc, cache, sizeof(cache));
	const char *effect =
	    pc->mode == POD_PLACE_REQUIRED    ? "the pod stays Pending until a node has it Ready"
	    : pc->mode == POD_PLACE_PREFERRED ? "the pod may start on a node without it"
	                                      : "no node affinity was added";
	if (!pc->known)
		snprintf(buf, len, "%s (volume %.63s) does not exist; %s", cache, pc->v->name,
		         effect);
	else
		snprintf(buf, len, "no node has %s (volume %.63s) Ready yet; %s", cache,
		         pc->v->name, effect);
}

static void image_warning(const struct pod_cache *pc, char *buf, size_t len)
{
	char subject[600]; /* at least the warning's size: nothing is cut twice */
	buf[0] = '\0';
	if (!pc->check)
		return;
	snprintf(subject, sizeof(subject), "image volume %s", pc->v->name);
	review_image_warning(pc->check, subject, buf, len);
}

static void record(struct review *rv)
{
	struct pod_review *p = rv->pod;
	char aff[400], what[1200];
	for (size_t i = 0; i < p->n; i++) {
		const struct pod_cache *pc = &p->caches[i];
		bool nowhere = pc->ready_nodes == 0;
		metrics_add(rv->r->m_placements, METRICS_L(mode_names[pc->mode], mount_name(pc)),
		            1);
		affinity_text(pc, aff, sizeof(aff));
		snprintf(what, sizeof(what), "admitted with %s: %s", aff, pc->reason);
		note_event(rv, pc, nowhere, nowhere ? "NoReadyNode" : "PodPlaced",
		           mode_names[pc->mode], what);
	}
}

/* What the placement policy said beyond placement: a refusal (the pod is
 * denied: false) or warnings, each also an Event on its cache. */
static bool policy_verdicts(struct review *rv, char warn[][512], const char **warnings, size_t *nw)
{
	struct pod_review *p = rv->pod;
	char cache[CACHE_TEXT_MAX], what[1000];
	for (size_t i = 0; i < p->n; i++) {
		const struct pod_cache *pc = &p->caches[i];
		cache_display(pc, cache, sizeof(cache));
		if (pc->refuse[0]) {
			snprintf(what, sizeof(what), "refused: volume '%.63s': %s", pc->v->name,
			         pc->refuse);
			note_event(rv, pc, true, "RuntimeMismatch", "refused", what);
			review_deny(rv, "RuntimeMismatch", "volume '%s' mounts %s: %s", pc->v->name,
			            cache, pc->refuse);
			return false;
		}
		if (!pc->warning[0])
			continue;
		note_event(rv, pc, true, "RuntimeMismatch", mode_names[pc->mode], pc->warning);
		if (*nw < WARNINGS_MAX) {
			snprintf(warn[*nw], sizeof(warn[*nw]), "gkm: %.400s", pc->warning);
			warnings[*nw] = warn[*nw];
			(*nw)++;
		}
	}
	return true;
}

/* ---- the runtime's variables ---- */

/* The trees pc's image declares, and the containers that get them; false
 * when nobody knows them yet (a cache admitted before the webhook read
 * images' labels, or whose image config could not be read). */
static bool env_of(const struct review *rv, const struct pod_cache *pc, struct pod_env_volume *out)
{
	memset(out, 0, sizeof(*out));
	out->volume = pc->v->name;
	if (pc->check) {
		out->trees = pc->check->verdict.trees;
		out->n = pc->check->verdict.ntrees;
		out->containers = NULL;
		return pc->check->verdict.trees_known;
	}
	const struct catalog_cache *e =
	    cache_catalog_get(rv->r->o.catalog, pc->cluster ? NULL : pc->ns, pc->name);
	if (!e || !e->env_known)
		return false;
	out->trees = e->env;
	out->n = e->nenv;
	out->containers = (const char *const *)e->env_containers;
	return true;
}

/* The env operations for every container that mounts a cache, into *ops
 * (NULL when none); warnings for variables set otherwise (with an Event on
 * the cache) and for caches whose variables are not known. false when out
 * of memory. */
static bool env_patch(struct review *rv, cJSON **ops, char warn[][512], const char **warnings,
                      size_t *nw)
{
	struct pod_review *p = rv->pod;
	struct pod_env_volume vols[POD_CACHE_VOLUMES_MAX];
	char cache[CACHE_TEXT_MAX], conflict[1024];
	size_t n = 0;
	const cJSON *pod = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(rv->req.doc, "request"), "object");
	*ops = NULL;
	for (size_t i = 0; i < p->n && n < POD_CACHE_VOLUMES_MAX; i++) {
		const struct pod_cache *pc = &p->caches[i];
		if (env_of(rv, pc, &vols[n])) {
			n++;
			continue;
		}
		if (!pc->known || *nw >= WARNINGS_MAX)
			continue; /* a cache that does not exist is warned of already */
		cache_display(pc, cache, sizeof(cache));
		snprintf(warn[*nw], sizeof(warn[*nw]),
		         "gkm cannot tell the runtime where %.160s (volume %.63s) is: its image's "
		         "labels were not read (apply the cache again), so set TRITON_CACHE_DIR or "
		         "VLLM_CACHE_ROOT to its tree under the mount yourself",
		         cache, pc->v->name);
		warnings[*nw] = warn[*nw];
		(*nw)++;
	}
	if (!n)
		return true;
	if (!(*ops = cJSON_CreateArray()) ||
	    pod_env_patch(pod, vols, n, *ops, conflict, sizeof(conflict)) != 0)
		return false;
	if (!conflict[0])
		return true;
	for (size_t i = 0, k = 0; i < p->n && k < n; i++) {
		if (strcmp(vols[k].volume, p->caches[i].v->name) != 0)
			continue;       /* its variables are not known: not among vols */
		if (vols[k++].conflict) /* a container sets its variable otherwise */
			note_event(rv, &p->caches[i], true, "CacheNotRead",
			           mode_names[p->caches[i].mode], conflict);
	}
	if (*nw < WARNINGS_MAX) {
		snprintf(warn[*nw], sizeof(warn[*nw]), "gkm: %.500s", conflict);
		warnings[*nw] = warn[*nw];
		(*nw)++;
	}
	return true;
}

void pod_review_decide(struct review *rv)
{
	struct pod_review *p = rv->pod;
	char perr[600], *annotation = NULL, *patch = NULL;
	char warn[WARNINGS_MAX][512];
	const char *warnings[WARNINGS_MAX];
	size_t nw = 0, npins = 0, npl = 0;
	struct pod_place pl[POD_CACHE_VOLUMES_MAX];
	struct pod_pin pins[POD_CACHE_VOLUMES_MAX];
	if (!verify_images(rv))
		return;
	const char *failed = decide_placements(rv, perr, sizeof(perr));
	if (failed) {
		/* placement fails open: verified, pinned, placed nowhere in particular */
		log_warn("placement policy failed; pod admitted without node affinity", "pod",
		         p->who, "error", failed);
		for (size_t i = 0; i < p->n; i++) {
			p->caches[i].mode = POD_PLACE_NONE;
			snprintf(p->caches[i].reason, sizeof(p->caches[i].reason),
			         "the placement policy failed: %.400s", failed);
		}
		snprintf(warn[nw], sizeof(warn[nw]),
		         "gkm placement policy failed (%.300s); no node affinity added", failed);
		warnings[nw] = warn[nw];
		nw++;
	}
	if (!policy_verdicts(rv, warn, warnings, &nw))
		return;
	for (size_t i = 0; i < p->n; i++) {
		const struct pod_cache *pc = &p->caches[i];
		if (pc->mode != POD_PLACE_NONE && pc->label[0])
			pl[npl++] = (struct pod_place){pc->label, pc->mode, pc->weight};
		if (pc->pinned_ref)
			pins[npins++] = (struct pod_pin){pc->v->index, pc->pinned_ref};
		for (int k = 0; k < 2 && nw < WARNINGS_MAX; k++) {
			if (k == 0)
				readiness_warning(pc, warn[nw], sizeof(warn[nw]));
			else
				image_warning(pc, warn[nw], sizeof(warn[nw]));
			if (warn[nw][0]) {
				warnings[nw] = warn[nw];
				nw++;
			}
		}
	}
	cJSON *env = NULL;
	if (!env_patch(rv, &env, warn, warnings, &nw) || !(annotation = annotation_of(p))) {
		cJSON_Delete(env);
		review_deny(rv, "WebhookError", "out of memory");
		return;
	}
	int rc = pod_patch_build(&p->info, pl, npl, pins, npins, PLACEMENT_ANNOTATION, annotation,
	                         env, &patch, perr, sizeof(perr));
	cJSON_Delete(env);
	free(annotation);
	if (rc != 0) {
		if (rc == -EINVAL)
			review_deny(rv, "InvalidPod", "%s", perr);
		else
			review_deny(rv, "WebhookError", "out of memory");
		return;
	}
	record(rv);
	struct admission_response ok = {.uid = rv->req.uid,
	                                .allowed = true,
	                                .patch = patch,
	                                .warnings = warnings,
	                                .nwarnings = nw};
	review_finish(rv, &ok);
	free(patch);
}
