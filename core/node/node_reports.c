/* Compact node reports (see node_reports.h). */
#include "node_reports.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "intern.h"
#include "objstore.h"
#include "strmap.h"

#define NAME_MAX_LEN 253

struct nr_entry {
	const char *cache, *body, *updated; /* interned; updated may be NULL */
};

struct nr_node {
	struct nr_entry *e; /* sorted by cache name */
	size_t n;
	size_t nslen;
	char key[]; /* "<ns>/<node>" */
};

struct node_reports {
	struct strmap nodes; /* key -> struct nr_node */
	struct intern strings;
	size_t entries;
};

int node_reports_new(struct node_reports **out)
{
	struct node_reports *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	*out = r;
	return 0;
}

/* Drop the entry's references to its strings. */
static void put_entry(struct node_reports *r, const struct nr_entry *e)
{
	intern_put(&r->strings, e->cache);
	intern_put(&r->strings, e->body);
	intern_put(&r->strings, e->updated);
}

static void release_entries(struct node_reports *r, struct nr_entry *e, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put_entry(r, &e[i]);
	free(e);
}

void node_reports_free(struct node_reports *r)
{
	if (!r)
		return;
	size_t pos = 0;
	void *v;
	while (strmap_next(&r->nodes, &pos, NULL, &v)) {
		struct nr_node *nd = v;
		release_entries(r, nd->e, nd->n);
		free(nd);
	}
	strmap_clear(&r->nodes);
	intern_clear(&r->strings);
	free(r);
}

static int make_key(const char *ns, const char *node, char *buf, size_t len)
{
	if (strlen(ns) > NAME_MAX_LEN || strlen(node) > NAME_MAX_LEN)
		return -EINVAL;
	snprintf(buf, len, "%s/%s", ns, node);
	return 0;
}

static struct nr_node *lookup(const struct node_reports *r, const char *ns, const char *node)
{
	char key[2 * NAME_MAX_LEN + 2];
	if (make_key(ns, node, key, sizeof(key)) != 0)
		return NULL;
	return strmap_get(&r->nodes, key);
}

/* One entry: the value without lastUpdated as compact JSON, and lastUpdated. */
static int entry_of(struct node_reports *r, const cJSON *v, struct nr_entry *out)
{
	const cJSON *u =
	    cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "lastUpdated") : NULL;
	char *text = NULL;
	if (cJSON_IsString(u)) {
		cJSON *rest = obj_without(v, "lastUpdated");
		text = rest ? cJSON_PrintUnformatted(rest) : NULL;
		cJSON_Delete(rest);
	} else {
		text = cJSON_PrintUnformatted(v);
	}
	out->cache = intern_get(&r->strings, v->string);
	out->body = text ? intern_get(&r->strings, text) : NULL;
	out->updated = cJSON_IsString(u) ? intern_get(&r->strings, u->valuestring) : NULL;
	free(text);
	if (!out->cache || !out->body || (cJSON_IsString(u) && !out->updated)) {
		put_entry(r, out);
		return -ENOMEM;
	}
	return 0;
}

static int by_cache(const void *a, const void *b)
{
	return strcmp(((const struct nr_entry *)a)->cache, ((const struct nr_entry *)b)->cache);
}

/* Tell changed() about every cache whose entry differs between a and b
 * (both sorted; interned strings compare by pointer). */
static void diff(const struct nr_entry *a, size_t na, const struct nr_entry *b, size_t nb,
                 const char *ns, node_reports_changed_fn changed, void *ud)
{
	size_t i = 0, j = 0;
	if (!changed)
		return;
	while (i < na && j < nb) {
		int c = strcmp(a[i].cache, b[j].cache);
		if (c < 0) {
			changed(ns, a[i++].cache, ud);
		} else if (c > 0) {
			changed(ns, b[j++].cache, ud);
		} else {
			if (a[i].body != b[j].body || a[i].updated != b[j].updated)
				changed(ns, a[i].cache, ud);
			i++;
			j++;
		}
	}
	for (; i < na; i++)
		changed(ns, a[i].cache, ud);
	for (; j < nb; j++)
		changed(ns, b[j].cache, ud);
}

int node_reports_set(struct node_reports *r, const char *ns, const char *node, const cJSON *caches,
                     node_reports_changed_fn changed, void *ud, bool *added)
{
	char key[2 * NAME_MAX_LEN + 2];
	if (make_key(ns, node, key, sizeof(key)) != 0)
		return -EINVAL;
	size_t n = 0, k = 0;
	const cJSON *v;
	if (cJSON_IsObject(caches))
		cJSON_ArrayForEach(v, caches) n++;
	struct nr_entry *e = n ? calloc(n, sizeof(*e)) : NULL;
	if (n && !e)
		return -ENOMEM;
	if (cJSON_IsObject(caches)) {
		cJSON_ArrayForEach(v, caches)
		{
			if (!v->string)
				continue;
			if (entry_of(r, v, &e[k]) != 0) {
				release_entries(r, e, k);
				return -ENOMEM;
			}
			k++;
		}
	}
	if (k)
		qsort(e, k, sizeof(*e), by_cache);
	/* a name given twice: the first one counts */
	size_t u = 0;
	for (size_t i = 0; i < k; i++) {
		if (u && e[u - 1].cache == e[i].cache) {
			put_entry(r, &e[i]);
			continue;
		}
		e[u++] = e[i];
	}
	k = u;
	struct nr_node *nd = strmap_get(&r->nodes, key);
	bool fresh = !nd;
	if (fresh) {
		size_t kl = strlen(key);
		nd = calloc(1, sizeof(*nd) + kl + 1);
		if (!nd || strmap_put(&r->nodes, memcpy(nd->key, key, kl + 1), nd) != 0) {
			free(nd);
			release_entries(r, e, k);
			return -ENOMEM;
		}
		nd->nslen = strlen(ns);
	}
	diff(nd->e, nd->n, e, k, ns, changed, ud);
	r->entries = r->entries - nd->n + k;
	release_entries(r, nd->e, nd->n);
	nd->e = e;
	nd->n = k;
	if (added)
		*added = fresh;
	return 0;
}

bool node_reports_remove(struct node_reports *r, const char *ns, const char *node,
                         node_reports_changed_fn changed, void *ud)
{
	char key[2 * NAME_MAX_LEN + 2];
	if (make_key(ns, node, key, sizeof(key)) != 0)
		return false;
	struct nr_node *nd = strmap_del(&r->nodes, key);
	if (!nd)
		return false;
	diff(nd->e, nd->n, NULL, 0, ns, changed, ud);
	r->entries -= nd->n;
	release_entries(r, nd->e, nd->n);
	free(nd);
	return true;
}

bool node_reports_has(const struct node_reports *r, const char *ns, const char *node)
{
	return lookup(r, ns, node) != NULL;
}

cJSON *node_reports_entry(const struct node_reports *r, const char *ns, const char *node,
                          const char *cache)
{
	const struct nr_node *nd = lookup(r, ns, node);
	if (!nd)
		return NULL;
	size_t lo = 0, hi = nd->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(nd->e[mid].cache, cache);
		if (!c) {
			cJSON *v = cJSON_Parse(nd->e[mid].body);
			if (cJSON_IsObject(v) && nd->e[mid].updated)
				cJSON_AddStringToObject(v, "lastUpdated", nd->e[mid].updated);
			return v;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

void node_reports_foreach(const struct node_reports *r, const char *ns,
                          void (*fn)(const char *ns, const char *node, void *ud), void *ud)
{
	size_t pos = 0;
	void *v;
	while (strmap_next(&r->nodes, &pos, NULL, &v)) {
		struct nr_node *nd = v;
		if (ns && (strlen(ns) != nd->nslen || memcmp(ns, nd->key, nd->nslen) != 0))
			continue;
		char nsbuf[NAME_MAX_LEN + 1];
		snprintf(nsbuf, sizeof(nsbuf), "%.*s", (int)nd->nslen, nd->key);
		fn(nsbuf, nd->key + nd->nslen + 1, ud);
	}
}

void node_reports_stats(const struct node_reports *r, struct node_reports_stats *st)
{
	st->objects = r->nodes.len;
	st->entries = r->entries;
	st->strings = intern_count(&r->strings);
	st->string_bytes = r->strings.bytes;
}
