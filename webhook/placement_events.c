#include "placement_events.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_catalog.h"
#include "log.h"
#include "metrics.h"
#include "strmap.h"
#include "workers.h"

#define NOTES_MAX 4096
#define PODS_NAMED 3

/* What is known about one Event to write. */
struct note {
	char *key; /* cache kind and key, reason, mode */
	bool cluster, warning;
	char *ns, *name, *uid, *reason, *what;
	char *pods[PODS_NAMED];
	unsigned long count;
};

/* One Event on its way (a worker job). */
struct write {
	struct placement_events *pe;
	cJSON *regarding;
	char *reason, *message;
	bool warning;
	int rc;
};

struct placement_events {
	struct loop *loop;
	struct objstore *store;
	struct workers *writer;
	uint64_t interval_ms, timer;
	struct strmap notes;
	struct metric *m_events;
};

struct metric *placement_events_metric(void)
{
	static struct metric *m;
	if (!m)
		m = metrics_counter("gkm_webhook_events_total",
		                    "Events about pod placements recorded on caches, by result "
		                    "(written, failed, dropped)",
		                    "result");
	return m;
}

static void note_free(struct note *n)
{
	if (!n)
		return;
	free(n->key);
	free(n->ns);
	free(n->name);
	free(n->uid);
	free(n->reason);
	free(n->what);
	for (int i = 0; i < PODS_NAMED; i++)
		free(n->pods[i]);
	free(n);
}

static void notes_clear(struct placement_events *pe)
{
	size_t pos = 0;
	const char *key;
	void *val;
	while (strmap_next(&pe->notes, &pos, &key, &val))
		note_free(val);
	strmap_clear(&pe->notes);
}

static void write_free(struct write *w)
{
	cJSON_Delete(w->regarding);
	free(w->reason);
	free(w->message);
	free(w);
}

static void write_work(void *ud)
{
	struct write *w = ud;
	w->rc =
	    w->pe->store->ops->event(w->pe->store, w->regarding, w->warning ? "Warning" : "Normal",
	                             w->reason, w->message, "gkm-webhook");
}

static void write_done(struct loop *l, void *ud)
{
	struct write *w = ud;
	metrics_add(w->pe->m_events, METRICS_L(w->rc == 0 ? "written" : "failed"), 1);
	write_free(w);
}

/* "Pod team-a/vllm-0 <what>" or "4 pods (team-a/a, team-a/b, team-a/c and 1
 * more) <what>". */
static char *message_of(const struct note *n)
{
	char *m = NULL;
	int rc;
	if (n->count == 1) {
		rc = asprintf(&m, "Pod %s %s", n->pods[0] ? n->pods[0] : "(unnamed)", n->what);
	} else {
		char names[800] = "";
		size_t o = 0;
		for (int i = 0; i < PODS_NAMED && n->pods[i]; i++)
			o += (size_t)snprintf(names + o, o < sizeof(names) ? sizeof(names) - o : 0,
			                      "%s%s", i ? ", " : "", n->pods[i]);
		if (n->count > PODS_NAMED)
			snprintf(names + (o < sizeof(names) ? o : sizeof(names) - 1),
			         o < sizeof(names) ? sizeof(names) - o : 1, " and %lu more",
			         n->count - PODS_NAMED);
		rc = asprintf(&m, "%lu pods (%s) %s", n->count, names, n->what);
	}
	return rc < 0 ? NULL : m;
}

static struct write *write_of(struct placement_events *pe, const struct note *n)
{
	struct write *w = calloc(1, sizeof(*w));
	cJSON *o = cJSON_CreateObject(), *md;
	if (!w || !o || !cJSON_AddStringToObject(o, "apiVersion", GKM_API_VERSION) ||
	    !cJSON_AddStringToObject(o, "kind", n->cluster ? "ClusterGKMCache" : "GKMCache") ||
	    !(md = cJSON_AddObjectToObject(o, "metadata")) ||
	    !cJSON_AddStringToObject(md, "name", n->name) ||
	    (!n->cluster && !cJSON_AddStringToObject(md, "namespace", n->ns)) ||
	    (n->uid[0] && !cJSON_AddStringToObject(md, "uid", n->uid)) ||
	    !(w->reason = strdup(n->reason)) || !(w->message = message_of(n))) {
		cJSON_Delete(o);
		if (w)
			write_free(w);
		return NULL;
	}
	w->pe = pe;
	w->regarding = o;
	w->warning = n->warning;
	return w;
}

static void flush(struct loop *l, void *ud)
{
	struct placement_events *pe = ud;
	size_t pos = 0;
	const char *key;
	void *val;
	pe->timer = 0;
	while (strmap_next(&pe->notes, &pos, &key, &val)) {
		struct write *w = write_of(pe, val);
		if (!w || workers_submit(pe->writer, write_work, write_done, w) != 0) {
			metrics_add(pe->m_events, METRICS_L("dropped"), 1);
			if (w)
				write_free(w);
		}
	}
	notes_clear(pe);
}

int placement_events_new(struct loop *l, struct objstore *store, uint64_t interval_ms,
                         struct placement_events **out)
{
	struct placement_events *pe = calloc(1, sizeof(*pe));
	if (!pe)
		return -ENOMEM;
	int rc = workers_new(l, 1, &pe->writer);
	if (rc != 0) {
		free(pe);
		return rc;
	}
	pe->loop = l;
	pe->store = store;
	pe->interval_ms = interval_ms;
	pe->m_events = placement_events_metric();
	*out = pe;
	return 0;
}

void placement_events_free(struct placement_events *pe)
{
	if (!pe)
		return;
	if (pe->notes.len) {
		char n[24];
		snprintf(n, sizeof(n), "%zu", pe->notes.len);
		log_info("placement Events not written at shutdown", "count", n);
	}
	notes_clear(pe);
	workers_free(pe->writer);
	free(pe);
}

static struct note *note_new(const struct catalog_cache *c, const char *key, bool warning,
                             const char *reason)
{
	struct note *n = calloc(1, sizeof(*n));
	if (!n || !(n->key = strdup(key)) || !(n->ns = strdup(c->ns)) ||
	    !(n->name = strdup(c->name)) || !(n->uid = strdup(c->uid)) ||
	    !(n->reason = strdup(reason))) {
		note_free(n);
		return NULL;
	}
	n->cluster = c->cluster;
	n->warning = warning;
	return n;
}

void placement_events_note(struct placement_events *pe, const struct catalog_cache *c, bool warning,
                           const char *reason, const char *mode, const char *pod, const char *what)
{
	char key[800];
	snprintf(key, sizeof(key), "%d|%s|%s|%s", c->cluster, c->key, reason, mode);
	struct note *n = strmap_get(&pe->notes, key);
	if (!n) {
		if (pe->notes.len >= NOTES_MAX || !(n = note_new(c, key, warning, reason)) ||
		    strmap_put(&pe->notes, n->key, n) != 0) {
			note_free(n);
			metrics_add(pe->m_events, METRICS_L("dropped"), 1);
			return;
		}
	}
	char *w = strdup(what);
	if (w) {
		free(n->what);
		n->what = w;
	}
	if (n->count < PODS_NAMED)
		n->pods[n->count] = strdup(pod);
	n->count++;
	if (!n->what) /* out of memory before any text: write nothing wrong */
		n->what = strdup("");
	if (!pe->timer && !(pe->timer = loop_add_timer(pe->loop, pe->interval_ms, flush, pe)))
		log_warn("cannot schedule placement Events", "error", "out of memory");
}
