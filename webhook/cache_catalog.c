#include "cache_catalog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission_review.h"

static const cJSON *at(const cJSON *o, const char *a, const char *b)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
	return b ? cJSON_GetObjectItemCaseSensitive(v, b) : v;
}

static const char *str(const cJSON *v)
{
	return cJSON_IsString(v) ? v->valuestring : "";
}

static long count(const cJSON *v)
{
	return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e9
	           ? (long)v->valuedouble
	           : 0;
}

/* The map key: "ns/name" for a GKMCache, "name" for a ClusterGKMCache. */
static void key_of(bool cluster, const char *ns, const char *name, char *key, size_t cap)
{
	if (cluster)
		snprintf(key, cap, "%s", name);
	else
		snprintf(key, cap, "%s/%s", ns, name);
}

static void entry_free(struct catalog_cache *e)
{
	if (!e)
		return;
	free(e->key);
	free(e->ns);
	free(e->name);
	free(e->uid);
	free(e->image);
	free(e->repo);
	oci_ref_clear(&e->ref);
	for (char **n = e->env_containers; n && *n; n++)
		free(*n);
	free(e->env_containers);
	cJSON_Delete(e->identity);
	free(e->claim_ns);
	free(e->claim_name);
	free(e);
}

void cache_catalog_init(struct cache_catalog *c)
{
	memset(c, 0, sizeof(*c));
}

void cache_catalog_clear(struct cache_catalog *c)
{
	for (int k = 0; k < 2; k++) {
		size_t pos = 0;
		const char *key;
		void *val;
		while (strmap_next(&c->caches[k], &pos, &key, &val))
			entry_free(val);
		strmap_clear(&c->caches[k]);
	}
}

static bool condition_true(const cJSON *status, const char *type)
{
	const cJSON *cond;
	cJSON_ArrayForEach(cond, at(status, "conditions", NULL))
	{
		if (strcmp(str(at(cond, "type", NULL)), type) == 0)
			return strcmp(str(at(cond, "status", NULL)), "True") == 0;
	}
	return false;
}

/* The digest the nodes pull: what the webhook recorded, else what the
 * operator resolved (verification off), else the one in spec.image. */
static void recorded_digest(const cJSON *obj, const struct catalog_cache *e, char *out)
{
	const char *ann =
	    str(at(at(obj, "metadata", "annotations"), ADMISSION_ANNOTATION_DIGEST, NULL));
	const char *st = str(at(obj, "status", "resolvedDigest"));
	const char *d = oci_digest_valid(ann)  ? ann
	                : oci_digest_valid(st) ? st
	                : e->ref.digest        ? e->ref.digest
	                                       : "";
	snprintf(out, OCI_DIGEST_MAX, "%s", d);
}

/* spec.runtimeEnv, else the annotation the webhook wrote from the image.
 * -ENOMEM, else 0 (entries that are not usable are left out). */
static int read_env(const cJSON *obj, struct catalog_cache *e)
{
	const cJSON *re = at(obj, "spec", "runtimeEnv"), *v;
	const cJSON *vars = at(re, "variables", NULL), *names = at(re, "containers", NULL);
	const cJSON *ann = at(at(obj, "metadata", "annotations"), CACHE_ENV_ANNOTATION, NULL);
	if (cJSON_IsArray(vars)) {
		e->env_known = true;
		cJSON_ArrayForEach(v, vars)
		{
			const char *name = str(at(v, "name", NULL)),
			           *sub = str(at(v, "subPath", NULL));
			if (e->nenv < CACHE_ENV_TREES_MAX)
				e->nenv += (size_t)cache_env_tree_set(
				    &e->env[e->nenv], name, strlen(name), sub, strlen(sub));
		}
	} else if (cJSON_IsString(ann)) {
		e->env_known = true;
		e->nenv = cache_env_parse(ann->valuestring, e->env, CACHE_ENV_TREES_MAX);
	}
	if (!cJSON_IsArray(names))
		return 0;
	size_t n = 0;
	if (!(e->env_containers = calloc((size_t)cJSON_GetArraySize(names) + 1, sizeof(char *))))
		return -ENOMEM;
	cJSON_ArrayForEach(v, names)
	{
		if (cJSON_IsString(v) && !(e->env_containers[n++] = strdup(v->valuestring)))
			return -ENOMEM;
	}
	return 0;
}

/* spec.claim: in the cache's namespace (a ClusterGKMCache's names its
 * own), named as the cache unless it says. -ENOMEM, else 0. */
static int read_claim(const cJSON *obj, struct catalog_cache *e)
{
	const cJSON *claim = at(obj, "spec", "claim");
	if (!cJSON_IsObject(claim))
		return 0;
	const char *ns = e->cluster ? str(at(claim, "namespace", NULL)) : e->ns;
	const char *name = str(at(claim, "name", NULL));
	if (!*ns)
		return 0; /* refused by the operator (InvalidClaim): no claim is made */
	if (!(e->claim_ns = strdup(ns)) || !(e->claim_name = strdup(*name ? name : e->name)))
		return -ENOMEM;
	return 0;
}

int cache_catalog_put(struct cache_catalog *c, bool cluster, const cJSON *obj)
{
	const char *name = str(at(obj, "metadata", "name"));
	const char *ns = cluster ? "" : str(at(obj, "metadata", "namespace"));
	const cJSON *status = at(obj, "status", NULL);
	struct oci_err oerr;
	if (!name[0] || (!cluster && !ns[0]))
		return -EINVAL;
	struct catalog_cache *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->cluster = cluster;
	char key[600];
	key_of(cluster, ns, name, key, sizeof(key));
	if (!(e->key = strdup(key)) || !(e->ns = strdup(ns)) || !(e->name = strdup(name)) ||
	    !(e->uid = strdup(str(at(obj, "metadata", "uid")))) ||
	    !(e->image = strdup(str(at(obj, "spec", "image")))))
		goto nomem;
	if (e->image[0] && oci_ref_parse(e->image, &e->ref, &oerr) == 0 &&
	    e->ref.kind == OCI_REF_REGISTRY && !(e->repo = oci_ref_name(&e->ref)))
		goto nomem;
	recorded_digest(obj, e, e->digest);
	if (read_env(obj, e) != 0 || read_claim(obj, e) != 0)
		goto nomem;
	/* parsed once here, not at every pod review */
	const char *id =
	    str(at(at(obj, "metadata", "annotations"), CACHE_ENV_IDENTITY_ANNOTATION, NULL));
	e->identity = *id ? cJSON_Parse(id) : NULL;
	if (e->identity && !cJSON_IsObject(e->identity)) {
		cJSON_Delete(e->identity);
		e->identity = NULL;
	}
	e->ready_nodes = count(at(status, "readyNodes", NULL));
	e->total_nodes = count(at(status, "totalNodes", NULL));
	e->ready = condition_true(status, "Ready");
	if (cache_label_key(ns, name, e->label, sizeof(e->label)) != 0)
		e->label[0] = '\0';
	struct strmap *m = &c->caches[cluster];
	struct catalog_cache *old = strmap_get(m, e->key);
	if (strmap_put(m, e->key, e) != 0)
		goto nomem;
	entry_free(old);
	return 0;
nomem:
	entry_free(e);
	return -ENOMEM;
}

void cache_catalog_remove(struct cache_catalog *c, bool cluster, const cJSON *obj)
{
	char key[600];
	key_of(cluster, str(at(obj, "metadata", "namespace")), str(at(obj, "metadata", "name")),
	       key, sizeof(key));
	entry_free(strmap_del(&c->caches[cluster], key));
}

size_t cache_catalog_len(const struct cache_catalog *c)
{
	return c->caches[0].len + c->caches[1].len;
}

const struct catalog_cache *cache_catalog_get(const struct cache_catalog *c, const char *ns,
                                              const char *name)
{
	char key[600];
	bool cluster = !ns || !ns[0];
	key_of(cluster, ns, name, key, sizeof(key));
	return strmap_get(&c->caches[cluster], key);
}

/* Does the reference name the exact image the cache records? */
static bool exact(const struct catalog_cache *e, const struct oci_ref *ref)
{
	if (ref->digest)
		return strcmp(ref->digest, e->digest) == 0 ||
		       (e->ref.digest && strcmp(ref->digest, e->ref.digest) == 0);
	return ref->tag && e->ref.tag && strcmp(ref->tag, e->ref.tag) == 0;
}

/* Every cache, GKMCaches first: start with *k and *pos 0, until NULL. */
static const struct catalog_cache *next_cache(const struct cache_catalog *c, int *k, size_t *pos)
{
	const char *key;
	void *val;
	for (; *k < 2; (*k)++, *pos = 0)
		if (strmap_next(&c->caches[*k], pos, &key, &val))
			return val;
	return NULL;
}

const struct catalog_cache *cache_catalog_find_image(const struct cache_catalog *c, const char *ns,
                                                     const struct oci_ref *ref)
{
	const struct catalog_cache *best = NULL;
	int best_score = -1;
	char *repo = ref->kind == OCI_REF_REGISTRY ? oci_ref_name(ref) : NULL;
	if (!repo)
		return NULL;
	int k = 0;
	size_t pos = 0;
	for (const struct catalog_cache *e; (e = next_cache(c, &k, &pos));) {
		if (!e->repo || strcmp(e->repo, repo) != 0 ||
		    (!e->cluster && strcmp(e->ns, ns) != 0))
			continue;
		int score = (e->cluster ? 0 : 2) + (exact(e, ref) ? 1 : 0);
		if (score > best_score || (score == best_score && strcmp(e->key, best->key) < 0)) {
			best = e;
			best_score = score;
		}
	}
	free(repo);
	return best;
}

const struct catalog_cache *cache_catalog_find_claim(const struct cache_catalog *c, const char *ns,
                                                     const char *claim)
{
	int k = 0;
	size_t pos = 0;
	for (const struct catalog_cache *e; (e = next_cache(c, &k, &pos));)
		if (e->claim_name && !strcmp(e->claim_ns, ns) && !strcmp(e->claim_name, claim))
			return e;
	return NULL;
}
