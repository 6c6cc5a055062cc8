#include "node_labels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "cache_label.h"
#include "log.h"
#include "metrics.h"
#include "oci_digest.h"
#include "soon_timer.h"
#include "strmap.h"

/* A failed apply is retried with backoff from the first to the second. */
#define RETRY_MIN_MS 500
#define RETRY_MAX_MS 30000
/* Applies in flight at once: a thousand Nodes to label (the first start)
 * go through a window, not a thousand queued requests at the API server
 * and in memory. */
#define MAX_INFLIGHT 16

struct lcache {
	char *key;
	char **nodes; /* sorted, unique; one block (pack()) */
	size_t n;
};

struct lnode {
	char *name;
	char uid[64];
	/* what the manager owns on the Node: set_digest() of its keys (a
	 * thousand nodes with a hundred labels each: 136 bytes, not 5 KB) */
	char owned[OCI_DIGEST_MAX];
	bool dirty, applying;
	unsigned failures;   /* applies failed in a row */
	uint64_t not_before; /* loop_now_ms() before which no apply starts */
};

struct node_labels {
	struct workers *workers;
	struct objstore *os;
	unsigned debounce_ms;
	struct strmap caches; /* label key -> struct lcache */
	struct strmap nodes;  /* Node name -> struct lnode */
	struct soon_timer flush_timer;
	uint64_t seed;
	bool started, stopping;
	unsigned inflight; /* applies submitted, not done */
	bool held;         /* a flush stopped at MAX_INFLIGHT: go on when one is done */
};

static struct metric *m_applies;

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool same_keys(char *const *a, size_t na, const char *const *b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++)
		if (strcmp(a[i], b[i]) != 0)
			return false;
	return true;
}

void node_labels_owned_free(char **keys, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
}

void node_labels_keys_free(const char **keys)
{
	free((void *)keys);
}

/* Sort v[0..n) and drop repeats (freeing them when owned); the new count. */
static size_t sort_unique(char **v, size_t n, bool owned)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_str);
	size_t k = 1;
	for (size_t i = 1; i < n; i++) {
		if (strcmp(v[i], v[k - 1]) != 0)
			v[k++] = v[i];
		else if (owned)
			free(v[i]);
	}
	return k;
}

/* ---- pure helpers ---- */

int node_labels_owned(const cJSON *node, char ***keys, size_t *n)
{
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(node, "metadata");
	const cJSON *labels = cJSON_GetObjectItemCaseSensitive(meta, "labels"), *mf, *f;
	char **v = NULL;
	size_t cnt = 0, cap = 0;
	cJSON_ArrayForEach(mf, cJSON_GetObjectItemCaseSensitive(meta, "managedFields"))
	{
		if (strcmp(obj_str(mf, "manager"), NODE_LABELS_MANAGER) != 0 ||
		    strcmp(obj_str(mf, "operation"), "Apply") != 0 || *obj_str(mf, "subresource"))
			continue;
		const cJSON *owned = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(
		        cJSON_GetObjectItemCaseSensitive(mf, "fieldsV1"), "f:metadata"),
		    "f:labels");
		cJSON_ArrayForEach(f, owned)
		{
			if (!f->string || strncmp(f->string, "f:", 2) != 0)
				continue;
			const char *key = f->string + 2;
			const cJSON *val = cJSON_GetObjectItemCaseSensitive(labels, key);
			if (!cJSON_IsString(val) ||
			    strcmp(val->valuestring, CACHE_LABEL_VALUE) != 0)
				continue;
			if (cnt == cap) {
				size_t ncap = cap ? cap * 2 : 8;
				char **nv = realloc(v, ncap * sizeof(*v));
				if (!nv)
					goto oom;
				v = nv;
				cap = ncap;
			}
			if (!(v[cnt] = strdup(key)))
				goto oom;
			cnt++;
		}
	}
	*keys = v;
	*n = sort_unique(v, cnt, true);
	return 0;
oom:
	node_labels_owned_free(v, cnt);
	return -ENOMEM;
}

cJSON *node_labels_apply_obj(const char *name, const char *uid, const char *const *keys, size_t n)
{
	cJSON *obj = cJSON_CreateObject(), *meta, *labels = NULL;
	bool ok = obj && cJSON_AddStringToObject(obj, "apiVersion", "v1") &&
	          cJSON_AddStringToObject(obj, "kind", "Node") &&
	          (meta = cJSON_AddObjectToObject(obj, "metadata")) &&
	          cJSON_AddStringToObject(meta, "name", name) &&
	          cJSON_AddStringToObject(meta, "uid", uid) &&
	          (n == 0 || (labels = cJSON_AddObjectToObject(meta, "labels")));
	for (size_t i = 0; ok && i < n; i++)
		ok = cJSON_AddStringToObject(labels, keys[i], CACHE_LABEL_VALUE) != NULL;
	if (!ok) {
		cJSON_Delete(obj);
		return NULL;
	}
	return obj;
}

/* out: the SHA-256 of keys[0..n) (sorted), each with its NUL; "" when it
 * cannot be computed (out of memory): then it matches nothing. */
static void set_digest(const char *const *keys, size_t n, char out[OCI_DIGEST_MAX])
{
	struct oci_hasher h;
	out[0] = '\0';
	if (oci_hasher_init(&h, NULL) != 0)
		return;
	for (size_t i = 0; i < n; i++)
		oci_hasher_update(&h, keys[i], strlen(keys[i]) + 1);
	if (oci_hasher_final(&h, out) != 0)
		out[0] = '\0';
	oci_hasher_free(&h);
}

/* set_digest() of the labels node carries under the manager. */
static int owned_digest(const cJSON *node, char out[OCI_DIGEST_MAX])
{
	char **keys = NULL;
	size_t n = 0;
	int rc = node_labels_owned(node, &keys, &n);
	if (rc)
		return rc;
	set_digest((const char *const *)keys, n, out);
	node_labels_owned_free(keys, n);
	return 0;
}

/* ---- state ---- */

static void flush(struct loop *l, void *ud);

/* Flush in delay_ms, or sooner if one is already due sooner. */
static void arm(struct node_labels *nl, uint64_t delay_ms)
{
	if (nl->started && !nl->stopping)
		soon_timer_arm(&nl->flush_timer, delay_ms);
}

/* Check n in delay_ms (or sooner, with other nodes). */
static void mark_node(struct node_labels *nl, struct lnode *n, uint64_t delay_ms)
{
	n->dirty = true;
	arm(nl, delay_ms);
}

static void mark(struct node_labels *nl, const char *node, uint64_t delay_ms)
{
	struct lnode *n = strmap_get(&nl->nodes, node);
	if (n) /* no Node (yet): its ADDED marks it */
		mark_node(nl, n, delay_ms);
}

static void mark_all(struct node_labels *nl, uint64_t delay_ms)
{
	size_t pos = 0;
	void *v;
	while (strmap_next(&nl->nodes, &pos, NULL, &v))
		((struct lnode *)v)->dirty = true;
	arm(nl, delay_ms);
}

static void free_cache(struct lcache *c)
{
	free(c->nodes);
	free(c->key);
	free(c);
}

static void free_node(struct lnode *n)
{
	free(n->name);
	free(n);
}

int node_labels_new(struct loop *l, struct workers *w, struct objstore *os, unsigned debounce_ms,
                    struct node_labels **out)
{
	struct node_labels *nl = calloc(1, sizeof(*nl));
	if (!nl)
		return -ENOMEM;
	m_applies = metrics_counter("gkm_operator_node_label_applies_total",
	                            "Server-side applies of the cache labels of a Node, by result "
	                            "(applied, failed)",
	                            "result");
	nl->workers = w;
	nl->os = os;
	nl->debounce_ms = debounce_ms;
	soon_timer_init(&nl->flush_timer, l, flush, nl);
	*out = nl;
	return 0;
}

void node_labels_quiesce(struct node_labels *nl)
{
	if (!nl)
		return;
	nl->stopping = true;
	soon_timer_cancel(&nl->flush_timer);
}

void node_labels_free(struct node_labels *nl)
{
	if (!nl)
		return;
	node_labels_quiesce(nl);
	size_t pos = 0;
	void *v;
	while (strmap_next(&nl->caches, &pos, NULL, &v))
		free_cache(v);
	pos = 0;
	while (strmap_next(&nl->nodes, &pos, NULL, &v))
		free_node(v);
	strmap_clear(&nl->caches);
	strmap_clear(&nl->nodes);
	free(nl);
}

/* sorted[0..n) (unique) packed into one block: the pointer array, then the
 * strings; one free(). NULL when out of memory. */
static char **pack(const char *const *sorted, size_t n)
{
	size_t bytes = n * sizeof(char *);
	for (size_t i = 0; i < n; i++)
		bytes += strlen(sorted[i]) + 1;
	char **v = malloc(bytes);
	if (!v)
		return NULL;
	char *p = (char *)(v + n);
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(sorted[i]) + 1;
		memcpy(p, sorted[i], len);
		v[i] = p;
		p += len;
	}
	return v;
}

int node_labels_set(struct node_labels *nl, const char *key, const char *const *nodes, size_t n)
{
	struct lcache *old = strmap_get(&nl->caches, key), *c = old;
	const char **sorted = n ? malloc(n * sizeof(*sorted)) : NULL;
	char **v = NULL;
	if (n && !sorted)
		return -ENOMEM;
	if (n)
		memcpy(sorted, nodes, n * sizeof(*sorted));
	n = sort_unique((char **)sorted, n, false);
	/* a thousand nodes reported again as before: nothing to do */
	if (old ? same_keys(old->nodes, old->n, sorted, n) : n == 0)
		goto out;
	if (n && !(v = pack(sorted, n)))
		goto oom;
	if (!old) {
		c = calloc(1, sizeof(*c));
		if (!c || !(c->key = strdup(key)) || strmap_put(&nl->caches, c->key, c) != 0) {
			if (c)
				free(c->key);
			free(c);
			goto oom;
		}
	}
	/* the nodes in one set and not the other gain or lose the label */
	char **o = old ? old->nodes : NULL;
	size_t on = old ? old->n : 0, i = 0, j = 0;
	while (i < on || j < n) {
		int d = i == on ? 1 : j == n ? -1 : strcmp(o[i], v[j]);
		if (d != 0)
			mark(nl, d < 0 ? o[i] : v[j], 0);
		i += d <= 0;
		j += d >= 0;
	}
	free(c->nodes);
	c->nodes = v;
	c->n = n;
	if (n == 0) {
		strmap_del(&nl->caches, key);
		free_cache(c);
	}
out:
	free(sorted);
	return 0;
oom:
	free(v);
	free(sorted);
	return -ENOMEM;
}

void node_labels_drop(struct node_labels *nl, const char *key)
{
	struct lcache *c = strmap_del(&nl->caches, key);
	if (!c)
		return;
	/* debounced: caches deleted together give one apply per node */
	for (size_t i = 0; i < c->n; i++)
		mark(nl, c->nodes[i], nl->debounce_ms);
	free_cache(c);
}

void node_labels_node(struct node_labels *nl, const cJSON *node)
{
	const char *name = obj_str(node, "metadata.name"), *uid = obj_str(node, "metadata.uid");
	char owned[OCI_DIGEST_MAX];
	if (!nl)
		return;
	if (!*name || owned_digest(node, owned) != 0) {
		log_error("cannot read the labels of a Node", "node", name, "error",
		          *name ? "out of memory" : "no name");
		return;
	}
	struct lnode *n = strmap_get(&nl->nodes, name);
	bool changed = !n || strcmp(n->uid, uid) != 0 || strcmp(n->owned, owned) != 0;
	if (!n) {
		n = calloc(1, sizeof(*n));
		if (!n || !(n->name = strdup(name)) || strmap_put(&nl->nodes, n->name, n) != 0) {
			if (n)
				free(n->name);
			free(n);
			log_error("out of memory keeping a Node", "node", name);
			return;
		}
	}
	if (strcmp(n->uid, uid) != 0) { /* a new Node of that name: no backoff carried over */
		snprintf(n->uid, sizeof(n->uid), "%s", uid);
		n->failures = 0;
		n->not_before = 0;
	}
	memcpy(n->owned, owned, sizeof(owned));
	if (changed)
		mark(nl, name, nl->debounce_ms);
}

void node_labels_node_deleted(struct node_labels *nl, const char *name)
{
	struct lnode *n = nl ? strmap_del(&nl->nodes, name) : NULL;
	if (n)
		free_node(n);
}

void node_labels_start(struct node_labels *nl)
{
	if (nl->started)
		return;
	nl->started = true;
	mark_all(nl, 0);
}

void node_labels_resync(struct node_labels *nl)
{
	mark_all(nl, nl->debounce_ms);
}

int node_labels_wanted(const struct node_labels *nl, const char *node, const char ***keys,
                       size_t *n)
{
	const char **v = calloc(nl->caches.len + 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	size_t k = 0, pos = 0;
	void *val;
	while (strmap_next(&nl->caches, &pos, NULL, &val)) {
		const struct lcache *c = val;
		if (bsearch(&node, c->nodes, c->n, sizeof(*c->nodes), cmp_str))
			v[k++] = c->key;
	}
	qsort(v, k, sizeof(*v), cmp_str);
	*keys = v;
	*n = k;
	return 0;
}

/* ---- applies ---- */

struct apply_job {
	struct node_labels *nl;
	char name[256];
	size_t nkeys;
	cJSON *obj;
	char owned[OCI_DIGEST_MAX]; /* what the manager owns after the apply */
	int rc;
	char err[512];
};

static void apply_work(void *ud)
{
	struct apply_job *j = ud;
	struct objstore *os = j->nl->os;
	cJSON *result = NULL;
	j->rc =
	    os->ops->apply(os, j->obj, NODE_LABELS_MANAGER, false, &result, j->err, sizeof(j->err));
	/* read here: a thousand Nodes waiting for the loop would hold the peak */
	if (!j->rc && owned_digest(result, j->owned) != 0) {
		j->rc = -ENOMEM;
		snprintf(j->err, sizeof(j->err), "out of memory reading the applied Node");
	}
	cJSON_Delete(result);
	cJSON_Delete(j->obj);
	j->obj = NULL;
}

static void apply_done(struct loop *l, void *ud)
{
	struct apply_job *j = ud;
	struct node_labels *nl = j->nl;
	(void)l;
	struct lnode *n = strmap_get(&nl->nodes, j->name);
	nl->inflight--;
	if (nl->held) {
		nl->held = false;
		arm(nl, 0);
	}
	metrics_add(m_applies, METRICS_L(j->rc ? "failed" : "applied"), 1);
	char count[24];
	snprintf(count, sizeof(count), "%zu", j->nkeys);
	if (!j->rc)
		log_info("node labels applied", "node", j->name, "labels", count);
	if (n) {
		n->applying = false;
		if (!j->rc) {
			memcpy(n->owned, j->owned, sizeof(n->owned));
			n->failures = 0;
			n->not_before = 0;
		} else {
			unsigned delay =
			    backoff_ms(n->failures++, RETRY_MIN_MS, RETRY_MAX_MS, &nl->seed);
			char in[24];
			snprintf(in, sizeof(in), "%.1fs", delay / 1000.0);
			log_warn("cannot apply the cache labels of a Node; will retry", "node",
			         j->name, "labels", count, "in", in, "error", j->err);
			n->not_before = loop_now_ms() + delay;
			n->dirty = true;
		}
		if (n->dirty)
			arm(nl, n->not_before > loop_now_ms() ? n->not_before - loop_now_ms()
			                                      : nl->debounce_ms);
	}
	free(j);
}

/* Apply n's wanted set unless the manager owns exactly that already. */
static void check_node(struct node_labels *nl, struct lnode *n)
{
	const char **want = NULL;
	size_t nw = 0;
	if (node_labels_wanted(nl, n->name, &want, &nw) != 0) {
		mark_node(nl, n, nl->debounce_ms);
		return;
	}
	char digest[OCI_DIGEST_MAX];
	set_digest(want, nw, digest);
	if ((*digest && !strcmp(digest, n->owned)) || !*n->uid) {
		node_labels_keys_free(want);
		return;
	}
	struct apply_job *j = calloc(1, sizeof(*j));
	if (j) {
		j->nl = nl;
		j->nkeys = nw;
		snprintf(j->name, sizeof(j->name), "%s", n->name);
		j->obj = node_labels_apply_obj(n->name, n->uid, want, nw);
	}
	node_labels_keys_free(want);
	if (!j || !j->obj || workers_submit(nl->workers, apply_work, apply_done, j) != 0) {
		if (j)
			cJSON_Delete(j->obj);
		free(j);
		mark_node(nl, n, nl->debounce_ms);
		return;
	}
	n->applying = true;
	nl->inflight++;
}

static void flush(struct loop *l, void *ud)
{
	struct node_labels *nl = ud;
	(void)l;
	if (!nl->started || nl->stopping)
		return;
	uint64_t now = loop_now_ms();
	size_t pos = 0;
	void *v;
	while (strmap_next(&nl->nodes, &pos, NULL, &v)) {
		struct lnode *n = v;
		if (!n->dirty)
			continue;
		if (n->applying) /* one apply at a time per node; its done re-arms */
			continue;
		if (n->not_before > now) {
			arm(nl, n->not_before - now);
			continue;
		}
		if (nl->inflight >= MAX_INFLIGHT) {
			nl->held = true;
			break;
		}
		n->dirty = false;
		check_node(nl, n);
	}
}
