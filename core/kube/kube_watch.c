/* List + watch with resume, bookmarks, relist on 410 and backoff (see kube_watch.h). */
#include "kube_watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "bgthread.h"
#include "log.h"
#include "loop.h"

#define DEFAULT_MAX_EVENT ((size_t)4 << 20)
#define DEFAULT_TIMEOUT_S 300u
#define DEFAULT_BACKOFF_MS 500u
#define DEFAULT_BACKOFF_MAX_MS 30000u
#define HEALTHY_STREAM_MS 30000ull /* a stream this long resets the backoff */
#define RV_MAX 128

static const char *type_names[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"};

const char *kube_event_type_name(enum kube_event_type t)
{
	return (unsigned)t < sizeof(type_names) / sizeof(type_names[0]) ? type_names[t] : "?";
}

static int type_from_name(const char *s)
{
	for (unsigned i = 0; i < sizeof(type_names) / sizeof(type_names[0]); i++)
		if (!strcmp(s, type_names[i]))
			return (int)i;
	return -1;
}

/* ---- parser ---- */

void kube_watch_parser_init(struct kube_watch_parser *p, size_t max_line)
{
	memset(p, 0, sizeof(*p));
	p->max_line = max_line ? max_line : DEFAULT_MAX_EVENT;
}

void kube_watch_parser_reset(struct kube_watch_parser *p)
{
	p->len = 0;
	p->skipping = false;
}

void kube_watch_parser_free(struct kube_watch_parser *p)
{
	free(p->buf);
	p->buf = NULL;
	p->len = p->cap = 0;
}

/* One complete line. 0 go on, 1 stop, -EBADMSG. */
static int parse_line(const char *line, size_t n, kube_watch_event_fn on_event, void *ud, char *err,
                      size_t errlen)
{
	while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
		n--;
	size_t start = 0;
	while (start < n && (line[start] == ' ' || line[start] == '\t'))
		start++;
	if (start == n)
		return 0; /* blank line (keep-alive) */
	line += start;
	n -= start;
	cJSON *ev = cJSON_ParseWithLength(line, n);
	if (!ev || !cJSON_IsObject(ev)) {
		char ex[128];
		kube_text_excerpt(ex, sizeof(ex), line, n);
		snprintf(err, errlen, "watch event is not a JSON object (%zu bytes): %s", n, ex);
		cJSON_Delete(ev);
		return -EBADMSG;
	}
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
	cJSON *obj = cJSON_DetachItemFromObjectCaseSensitive(ev, "object");
	int t = cJSON_IsString(type) ? type_from_name(type->valuestring) : -1;
	if (t < 0 || !cJSON_IsObject(obj)) {
		char ex[128];
		kube_text_excerpt(ex, sizeof(ex), line, n);
		log_error("kube: skipping a watch event without a known type and an object",
		          "event", ex);
		cJSON_Delete(obj);
		cJSON_Delete(ev);
		return 2; /* skipped */
	}
	cJSON_Delete(ev);
	return on_event((enum kube_event_type)t, obj, ud) ? 0 : 1;
}

int kube_watch_parser_feed(struct kube_watch_parser *p, const char *data, size_t len,
                           kube_watch_event_fn on_event, void *ud, char *err, size_t errlen)
{
	size_t i = 0;
	while (i < len) {
		const char *nl = memchr(data + i, '\n', len - i);
		size_t seg = nl ? (size_t)(nl - (data + i)) : len - i;
		if (p->skipping) {
			i += seg + (nl ? 1 : 0);
			if (nl)
				p->skipping = false;
			continue;
		}
		if (p->len + seg > p->max_line) {
			char bound[24];
			snprintf(bound, sizeof(bound), "%zu", p->max_line);
			p->oversized++;
			log_error(
			    "kube: watch event larger than the bound, skipped (the cached copy "
			    "of that object may be stale until the next list)",
			    "bound_bytes", bound);
			p->len = 0;
			p->skipping = !nl;
			i += seg + (nl ? 1 : 0);
			continue;
		}
		int rc;
		if (nl && p->len == 0) {
			/* The whole line is in this chunk: parse it in place. */
			rc = parse_line(data + i, seg, on_event, ud, err, errlen);
		} else {
			if (p->len + seg + 1 > p->cap) {
				size_t ncap = p->cap ? p->cap : 65536;
				while (ncap < p->len + seg + 1)
					ncap *= 2;
				char *b = realloc(p->buf, ncap);
				if (!b) {
					snprintf(err, errlen,
					         "out of memory buffering a watch event");
					return -ENOMEM;
				}
				p->buf = b;
				p->cap = ncap;
			}
			memcpy(p->buf + p->len, data + i, seg);
			p->len += seg;
			if (!nl)
				return 0;
			rc = parse_line(p->buf, p->len, on_event, ud, err, errlen);
			p->len = 0;
		}
		i += seg + 1;
		if (rc == 2)
			p->skipped++;
		else if (rc != 0)
			return rc;
	}
	return 0;
}

/* ---- the watch thread ---- */

struct kube_watch {
	struct kube_client *c;
	struct kube_watch_opts o;
	struct kube_watch_handler h;
	char *label_selector, *field_selector, *ns;
	char name[128];
	struct bgthread t;
	atomic_bool synced;
	struct kube_watch_stats st;
	uint64_t seed;
	struct kube_watch_parser parser;
	char rv[RV_MAX];
	/* per stream */
	bool gone;
	bool error_event;
	bool malformed;
	uint64_t stream_events;
	char stream_err[1200];
};

static bool set_rv(struct kube_watch *w, const cJSON *obj)
{
	const char *rv = kube_obj_rv(obj);
	if (!rv || !*rv || strlen(rv) >= sizeof(w->rv))
		return false;
	memcpy(w->rv, rv, strlen(rv) + 1);
	return true;
}

static bool on_stream_event(enum kube_event_type type, cJSON *obj, void *ud)
{
	struct kube_watch *w = ud;
	switch (type) {
	case KUBE_BOOKMARK:
		if (set_rv(w, obj))
			atomic_fetch_add_explicit(&w->st.bookmarks, 1, memory_order_relaxed);
		else
			atomic_fetch_add_explicit(&w->st.skipped, 1, memory_order_relaxed);
		w->stream_events++;
		cJSON_Delete(obj);
		return true;
	case KUBE_ERROR: {
		struct kube_error e;
		char *text = cJSON_PrintUnformatted(obj);
		kube_error_from_response(0, text, text ? strlen(text) : 0, &e);
		free(text);
		cJSON_Delete(obj);
		if (e.http_code == 410 || e.reason == KUBE_GONE) {
			w->gone = true;
		} else {
			w->error_event = true;
			snprintf(w->stream_err, sizeof(w->stream_err), "ERROR event: %s (%s, %ld)",
			         e.message, e.reason_text, e.http_code);
		}
		return false;
	}
	default:
		break;
	}
	const char *name = kube_obj_name(obj);
	if (!name || !*name || !kube_obj_rv(obj)) {
		atomic_fetch_add_explicit(&w->st.skipped, 1, memory_order_relaxed);
		log_error(
		    "kube: skipping a watch event whose object has no name or resourceVersion",
		    "watch", w->name, "type", kube_event_type_name(type));
		cJSON_Delete(obj);
		return true;
	}
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
	const cJSON *nsv = cJSON_GetObjectItemCaseSensitive(meta, "namespace");
	if (nsv && !cJSON_IsString(nsv)) {
		atomic_fetch_add_explicit(&w->st.skipped, 1, memory_order_relaxed);
		log_error("kube: skipping a watch event whose metadata.namespace is not a string",
		          "watch", w->name, "name", name);
		cJSON_Delete(obj);
		return true;
	}
	set_rv(w, obj);
	w->stream_events++;
	atomic_fetch_add_explicit(&w->st.events, 1, memory_order_relaxed);
	w->h.event(type, obj, w->h.ud);
	return true;
}

static bool on_stream_data(const char *buf, size_t len, void *ud)
{
	struct kube_watch *w = ud;
	char err[256] = "";
	uint64_t over = w->parser.oversized, skip = w->parser.skipped;
	int rc = kube_watch_parser_feed(&w->parser, buf, len, on_stream_event, w, err, sizeof(err));
	atomic_fetch_add_explicit(&w->st.oversized, w->parser.oversized - over,
	                          memory_order_relaxed);
	atomic_fetch_add_explicit(&w->st.skipped, w->parser.skipped - skip, memory_order_relaxed);
	if (rc < 0) {
		w->malformed = true;
		snprintf(w->stream_err, sizeof(w->stream_err), "%s", err);
		atomic_fetch_add_explicit(&w->st.malformed, 1, memory_order_relaxed);
		return false;
	}
	return rc != 1 && !bgthread_stopping(&w->t);
}

static int build_watch_path(struct kube_watch *w, unsigned timeout_s, char *path, size_t len)
{
	char t[16];
	snprintf(t, sizeof(t), "%u", timeout_s);
	if (kube_resource_path(&w->o.resource, w->ns, NULL, NULL, path, len) < 0 ||
	    (w->label_selector &&
	     kube_query_add(path, len, "labelSelector", w->label_selector) < 0) ||
	    (w->field_selector &&
	     kube_query_add(path, len, "fieldSelector", w->field_selector) < 0) ||
	    kube_query_add(path, len, "watch", "1") < 0 ||
	    kube_query_add(path, len, "allowWatchBookmarks", "true") < 0 ||
	    kube_query_add(path, len, "resourceVersion", w->rv) < 0 ||
	    kube_query_add(path, len, "timeoutSeconds", t) < 0)
		return -ENAMETOOLONG;
	return 0;
}

static int do_list(struct kube_watch *w)
{
	struct kube_list_opts lo = {
	    .label_selector = w->label_selector,
	    .field_selector = w->field_selector,
	    .limit = w->o.list_limit,
	    .on_page = w->h.page,
	    .page_ud = w->h.ud,
	};
	cJSON *items = NULL;
	char rv[RV_MAX];
	struct kube_error err;
	int rc = kube_client_list(w->c, &w->o.resource, w->ns, &lo, &items, rv, sizeof(rv), &err);
	if (rc < 0) {
		log_warn("kube: list failed", "watch", w->name, "error", err.message);
		return rc;
	}
	cJSON_Delete(items); /* NULL: the pages went to h.page */
	memcpy(w->rv, rv, sizeof(rv));
	atomic_fetch_add_explicit(&w->st.lists, 1, memory_order_relaxed);
	log_debug("kube: listed", "watch", w->name, "resourceVersion", rv);
	w->h.listed(rv, w->h.ud);
	atomic_store(&w->synced, true);
	return 0;
}

static void *watch_main(void *ud)
{
	struct kube_watch *w = ud;
	bool need_list = true;
	unsigned attempt = 0;
	char path[8192];
	while (!bgthread_stopping(&w->t)) {
		if (need_list) {
			if (do_list(w) < 0) {
				atomic_fetch_add_explicit(&w->st.failures, 1, memory_order_relaxed);
				bgthread_nap(&w->t, backoff_ms(attempt++, w->o.backoff_initial_ms,
				                               w->o.backoff_max_ms, &w->seed));
				continue;
			}
			need_list = false;
		}
		/* Server-side timeout spread over [t, 2t) so that watches of many
		 * clients do not all reconnect at once. */
		unsigned timeout_s =
		    w->o.timeout_s + (unsigned)(backoff_rand(&w->seed) % w->o.timeout_s);
		if (build_watch_path(w, timeout_s, path, sizeof(path)) < 0) {
			log_error("kube: watch path too long; selectors too large?", "watch",
			          w->name);
			bgthread_nap(&w->t, w->o.backoff_max_ms);
			continue;
		}
		w->gone = w->error_event = w->malformed = false;
		w->stream_events = 0;
		w->stream_err[0] = '\0';
		kube_watch_parser_reset(&w->parser);
		struct kube_stream s = {
		    .path = path,
		    .timeout_ms = (long)(timeout_s + 60) * 1000L,
		    .idle_timeout_ms = (long)(timeout_s + 30) * 1000L,
		    .stall_timeout_ms = (long)w->o.stall_timeout_ms,
		    .pending = &w->parser.len,
		    .on_data = on_stream_data,
		    .ud = w,
		    .stop = &w->t.stop,
		};
		struct kube_error err;
		unsigned long long t0 = loop_now_ms();
		atomic_fetch_add_explicit(&w->st.connects, 1, memory_order_relaxed);
		int rc = kube_client_stream(w->c, &s, &err);
		unsigned long long lasted = loop_now_ms() - t0;
		if (bgthread_stopping(&w->t))
			break;
		bool healthy = w->stream_events > 0 || lasted >= HEALTHY_STREAM_MS;
		if (w->gone || rc == -ESTALE) {
			atomic_fetch_add_explicit(&w->st.relists_gone, 1, memory_order_relaxed);
			log_info("kube: watch resourceVersion expired (410 Gone), listing again",
			         "watch", w->name, "resourceVersion", w->rv);
			need_list = true;
			/* A server that answers 410 right after every list must not
			 * make us list in a tight loop. */
			if (!healthy && attempt > 0 &&
			    !bgthread_nap(&w->t, backoff_ms(attempt - 1, w->o.backoff_initial_ms,
			                                    w->o.backoff_max_ms, &w->seed)))
				break;
			attempt = healthy ? 0 : attempt + 1;
			continue;
		}
		const char *why = NULL;
		bool broken = w->malformed || w->parser.len > 0;
		if (w->malformed || w->error_event)
			why = w->stream_err;
		else if (w->parser.len > 0)
			why = rc < 0 ? err.message : "the stream ended in the middle of an event";
		else if (rc < 0)
			why = err.message;
		if (w->parser.len > 0 && !w->malformed)
			atomic_fetch_add_explicit(&w->st.malformed, 1, memory_order_relaxed);
		if (!why && rc == 0 && healthy) {
			attempt = 0; /* the server ended a good stream (its timeout) */
			continue;
		}
		if (why) {
			atomic_fetch_add_explicit(&w->st.failures, 1, memory_order_relaxed);
			if (broken)
				log_error("kube: bad watch stream, reconnecting from the last "
				          "resourceVersion",
				          "watch", w->name, "resourceVersion", w->rv, "error", why);
			else
				log_warn("kube: watch failed, reconnecting", "watch", w->name,
				         "resourceVersion", w->rv, "error", why);
		}
		if (healthy)
			attempt = 0;
		if (!bgthread_nap(&w->t, backoff_ms(attempt++, w->o.backoff_initial_ms,
		                                    w->o.backoff_max_ms, &w->seed)))
			break;
	}
	return NULL;
}

int kube_watch_start(struct kube_client *c, const struct kube_watch_opts *o,
                     const struct kube_watch_handler *h, struct kube_watch **out)
{
	if (!h || !h->event || !h->page || !h->listed)
		return -EINVAL;
	struct kube_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->c = c;
	w->o = *o;
	w->h = *h;
	if (!w->o.timeout_s)
		w->o.timeout_s = DEFAULT_TIMEOUT_S;
	if (!w->o.backoff_initial_ms)
		w->o.backoff_initial_ms = DEFAULT_BACKOFF_MS;
	if (!w->o.backoff_max_ms)
		w->o.backoff_max_ms = DEFAULT_BACKOFF_MAX_MS;
	if (!w->o.stall_timeout_ms)
		w->o.stall_timeout_ms = 30000;
	if (w->o.backoff_max_ms < w->o.backoff_initial_ms)
		w->o.backoff_max_ms = w->o.backoff_initial_ms;
	snprintf(w->name, sizeof(w->name), "%s", o->name ? o->name : o->resource.plural);
	w->o.name = w->name;
	int rc = -ENOMEM;
	if ((o->label_selector && *o->label_selector &&
	     !(w->label_selector = strdup(o->label_selector))) ||
	    (o->field_selector && *o->field_selector &&
	     !(w->field_selector = strdup(o->field_selector))) ||
	    (o->ns && !(w->ns = strdup(o->ns))))
		goto fail;
	w->o.label_selector = w->label_selector;
	w->o.field_selector = w->field_selector;
	w->o.ns = w->ns;
	kube_watch_parser_init(&w->parser, o->max_event_bytes);
	w->seed = (uint64_t)loop_now_ms() ^ (uint64_t)(uintptr_t)w;
	rc = bgthread_start(&w->t, watch_main, w);
	if (rc < 0) {
		kube_watch_parser_free(&w->parser);
		goto fail;
	}
	*out = w;
	return 0;
fail:
	free(w->label_selector);
	free(w->field_selector);
	free(w->ns);
	free(w);
	return rc;
}

void kube_watch_stop(struct kube_watch *w)
{
	if (!w)
		return;
	bgthread_stop(&w->t);
	kube_watch_parser_free(&w->parser);
	free(w->label_selector);
	free(w->field_selector);
	free(w->ns);
	free(w);
}

const struct kube_watch_stats *kube_watch_stats(const struct kube_watch *w)
{
	return &w->st;
}

const struct kube_watch_opts *kube_watch_options(const struct kube_watch *w)
{
	return &w->o;
}

bool kube_watch_synced(const struct kube_watch *w)
{
	return atomic_load(&w->synced);
}
