/* Watch streams: the parser on the recorded events, and the list+watch
 * thread against a loopback server replaying recorded and broken streams. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <time.h>

#include "backoff.h"
#include "kube_watch.h"
#include "kube_replay.h"

/* ---- parser ---- */

struct seen {
	pthread_mutex_t mu;
	char log[64][96]; /* "MODIFIED w3 333", "REPLACE 5 332" */
	unsigned n;
	unsigned replaces;
	unsigned listed; /* objects of the list being received */
	unsigned events;
};

static void seen_add(struct seen *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void seen_add(struct seen *s, const char *fmt, ...)
{
	pthread_mutex_lock(&s->mu);
	if (s->n < 64) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(s->log[s->n++], sizeof(s->log[0]), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&s->mu);
}

static bool collect(enum kube_event_type t, cJSON *obj, void *ud)
{
	struct seen *s = ud;
	const char *name = kube_obj_name(obj), *rv = kube_obj_rv(obj);
	seen_add(s, "%s %s %s", kube_event_type_name(t), name ? name : "-", rv ? rv : "-");
	cJSON_Delete(obj);
	return true;
}

static char *stream_of(const char *fixture, size_t *len)
{
	cJSON *fx = replay_load(fixture);
	assert_non_null(fx);
	char *s = replay_stream_of(fx, len);
	cJSON_Delete(fx);
	return s;
}

static void test_parser_recorded_any_chunking(void **state)
{
	(void)state;
	size_t len;
	char *stream = stream_of("30-watch-bookmarks.json", &len);
	for (size_t chunk = 1; chunk <= len; chunk += (chunk < 64 ? 1 : 97)) {
		struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
		struct kube_watch_parser p;
		kube_watch_parser_init(&p, 0);
		char err[256];
		for (size_t off = 0; off < len; off += chunk) {
			size_t n = len - off < chunk ? len - off : chunk;
			assert_int_equal(kube_watch_parser_feed(&p, stream + off, n, collect, &s,
			                                        err, sizeof(err)),
			                 0);
		}
		assert_int_equal(s.n, 4);
		assert_string_equal(s.log[0], "MODIFIED w3 333");
		assert_string_equal(s.log[1], "DELETED w4 334");
		assert_string_equal(s.log[2], "BOOKMARK - 334");
		assert_string_equal(s.log[3], "BOOKMARK - 334");
		assert_int_equal(p.len, 0);
		kube_watch_parser_free(&p);
	}
	free(stream);
}

static void test_parser_error_event(void **state)
{
	(void)state;
	size_t len;
	char *stream = stream_of("31-watch-too-old.json", &len);
	struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct kube_watch_parser p;
	kube_watch_parser_init(&p, 0);
	char err[256];
	assert_int_equal(kube_watch_parser_feed(&p, stream, len, collect, &s, err, sizeof(err)), 0);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.log[0], "ERROR - -");
	kube_watch_parser_free(&p);
	free(stream);
}

static void test_parser_bad_input(void **state)
{
	(void)state;
	struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct kube_watch_parser p;
	kube_watch_parser_init(&p, 256);
	char err[256];
	/* blank keep-alive lines and CRLF */
	const char *ok = "\n  "
	                 "\r\n{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\","
	                 "\"resourceVersion\":\"1\"}}}\r\n";
	assert_int_equal(kube_watch_parser_feed(&p, ok, strlen(ok), collect, &s, err, sizeof(err)),
	                 0);
	assert_int_equal(s.n, 1);
	/* JSON but not an event: skipped, counted, parsing goes on */
	const char *odd =
	    "{\"type\":\"EXPLODED\",\"object\":{}}\n{\"type\":\"ADDED\",\"object\":7}\n"
	    "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"b\",\"resourceVersion\":"
	    "\"2\"}}}\n";
	assert_int_equal(
	    kube_watch_parser_feed(&p, odd, strlen(odd), collect, &s, err, sizeof(err)), 0);
	assert_int_equal(s.n, 2);
	assert_int_equal(p.skipped, 2);
	/* oversized: dropped to its newline (split over feeds), the next event survives */
	char big[600];
	memset(big, 'x', sizeof(big));
	assert_int_equal(kube_watch_parser_feed(&p, "{\"type\":\"ADDED\",\"object\":{\"x\":\"", 32,
	                                        collect, &s, err, sizeof(err)),
	                 0);
	assert_int_equal(
	    kube_watch_parser_feed(&p, big, sizeof(big), collect, &s, err, sizeof(err)), 0);
	const char *tail = "\"}}\n{\"type\":\"DELETED\",\"object\":{\"metadata\":{\"name\":\"c\","
	                   "\"resourceVersion\":\"3\"}}}\n";
	assert_int_equal(
	    kube_watch_parser_feed(&p, tail, strlen(tail), collect, &s, err, sizeof(err)), 0);
	assert_int_equal(p.oversized, 1);
	assert_int_equal(s.n, 3);
	assert_string_equal(s.log[2], "DELETED c 3");
	/* not JSON: an error naming the problem */
	const char *junk = "{\"type\":\"ADDED\",\"obj\n";
	assert_int_equal(
	    kube_watch_parser_feed(&p, junk, strlen(junk), collect, &s, err, sizeof(err)),
	    -EBADMSG);
	assert_non_null(strstr(err, "not a JSON object"));
	kube_watch_parser_free(&p);
}

static void test_backoff(void **state)
{
	(void)state;
	uint64_t seed = 42;
	unsigned prev_max = 0;
	for (unsigned a = 0; a < 20; a++) {
		unsigned base = 100u << (a < 10 ? a : 10);
		if (base > 5000)
			base = 5000;
		unsigned d = backoff_ms(a, 100, 5000, &seed);
		assert_true(d >= base / 2 && d < base + base / 2);
		prev_max = d > prev_max ? d : prev_max;
	}
	assert_true(prev_max <= 7500);
	/* jitter: not all the same */
	unsigned a1 = backoff_ms(5, 100, 5000, &seed), a2 = backoff_ms(5, 100, 5000, &seed),
	         a3 = backoff_ms(5, 100, 5000, &seed);
	assert_false(a1 == a2 && a2 == a3);
}

/* ---- the list+watch thread ---- */

struct wenv {
	struct replay *srv;
	struct kube_config *cfg;
	struct kube_client *c;
	struct seen seen;
};

/* A list arrives page by page; once complete it is logged as
 * "REPLACE <objects> <resourceVersion>". */
static void h_page(cJSON *items, bool first, void *ud)
{
	struct seen *s = ud;
	pthread_mutex_lock(&s->mu);
	s->listed = (first ? 0 : s->listed) + (unsigned)cJSON_GetArraySize(items);
	pthread_mutex_unlock(&s->mu);
	cJSON_Delete(items);
}

static void h_listed(const char *rv, void *ud)
{
	struct seen *s = ud;
	seen_add(s, "REPLACE %u %s", s->listed, rv);
	pthread_mutex_lock(&s->mu);
	s->replaces++;
	pthread_mutex_unlock(&s->mu);
}

static void h_event(enum kube_event_type t, cJSON *obj, void *ud)
{
	struct seen *s = ud;
	collect(t, obj, s);
	pthread_mutex_lock(&s->mu);
	s->events++;
	pthread_mutex_unlock(&s->mu);
}

static int wsetup(void **state)
{
	struct wenv *e = calloc(1, sizeof(*e));
	pthread_mutex_init(&e->seen.mu, NULL);
	e->srv = replay_start();
	e->c = replay_client(e->srv, &e->cfg);
	*state = e;
	return 0;
}

static int wteardown(void **state)
{
	struct wenv *e = *state;
	replay_client_free(e->c, e->cfg);
	replay_stop(e->srv);
	free(e);
	return 0;
}

static struct kube_watch_opts widget_watch(void)
{
	struct kube_watch_opts o = {
	    .resource = {.group = "example.com",
	                 .version = "v1",
	                 .plural = "widgets",
	                 .kind = "Widget",
	                 .namespaced = true},
	    .ns = "default",
	    .backoff_initial_ms = 20,
	    .backoff_max_ms = 200,
	};
	return o;
}

/* Wait (bounded) until cond holds; the condition is re-read each 10 ms. */
#define WAIT_FOR(cond)                                                                             \
	do {                                                                                       \
		for (int _i = 0; _i < 1000 && !(cond); _i++)                                       \
			usleep(10000);                                                             \
		assert_true(cond);                                                                 \
	} while (0)

static unsigned nreq(struct replay *r)
{
	pthread_mutex_lock(&r->mu);
	unsigned n = r->nreq;
	pthread_mutex_unlock(&r->mu);
	return n;
}

static bool has_param(const char *path, const char *kv)
{
	const char *q = strchr(path, '?');
	if (!q)
		return false;
	size_t n = strlen(kv);
	for (const char *p = q + 1; p; p = strchr(p, '&')) {
		if (*p == '&')
			p++;
		if (!strncmp(p, kv, n) && (p[n] == '&' || p[n] == '\0'))
			return true;
	}
	return false;
}

static void push_file(struct replay *r, const char *name)
{
	cJSON *fx = replay_load(name);
	assert_non_null(fx);
	replay_push_fixture(r, fx);
	cJSON_Delete(fx);
}

static void test_watch_resume_and_relist_on_410_event(void **state)
{
	struct wenv *e = *state;
	push_file(e->srv, "29-list-for-rv.json");
	push_file(e->srv, "30-watch-bookmarks.json"); /* ends cleanly after the events */
	push_file(e->srv, "31-watch-too-old.json");   /* ERROR event with a 410 */
	push_file(e->srv, "29-list-for-rv.json");
	struct kube_watch_opts o = widget_watch();
	struct kube_watch_handler h = {
	    .page = h_page, .listed = h_listed, .event = h_event, .ud = &e->seen};
	struct kube_watch *w = NULL;
	assert_int_equal(kube_watch_start(e->c, &o, &h, &w), 0);
	WAIT_FOR(nreq(e->srv) >= 5);
	WAIT_FOR(e->seen.replaces == 2);
	const struct kube_watch_stats *st = kube_watch_stats(w);
	assert_int_equal(atomic_load(&st->relists_gone), 1);
	assert_int_equal(atomic_load(&st->bookmarks), 2);
	kube_watch_stop(w);
	assert_string_equal(e->seen.log[0], "REPLACE 5 332");
	assert_string_equal(e->seen.log[1], "MODIFIED w3 333");
	assert_string_equal(e->seen.log[2], "DELETED w4 334");
	assert_string_equal(e->seen.log[3], "REPLACE 5 332");
	struct replay_req *q = e->srv->req;
	assert_null(strstr(q[0].path, "watch"));
	assert_true(has_param(q[1].path, "watch=1"));
	assert_true(has_param(q[1].path, "allowWatchBookmarks=true"));
	assert_true(has_param(q[1].path, "resourceVersion=332"));
	/* resumed from the bookmark's resourceVersion */
	assert_true(has_param(q[2].path, "resourceVersion=334"));
	assert_null(strstr(q[3].path, "watch"));
	assert_true(has_param(q[4].path, "resourceVersion=332"));
}

static void test_watch_http_410_relists(void **state)
{
	struct wenv *e = *state;
	push_file(e->srv, "29-list-for-rv.json");
	const char *gone =
	    "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","
	    "\"message\":\"too old resource version: 332 "
	    "(400)\",\"reason\":\"Expired\",\"code\":410}";
	replay_push(e->srv, 410, gone, strlen(gone), false);
	push_file(e->srv, "26-list-label-selector.json");
	struct kube_watch_opts o = widget_watch();
	o.label_selector = "app=demo";
	struct kube_watch_handler h = {
	    .page = h_page, .listed = h_listed, .event = h_event, .ud = &e->seen};
	struct kube_watch *w = NULL;
	assert_int_equal(kube_watch_start(e->c, &o, &h, &w), 0);
	WAIT_FOR(e->seen.replaces == 2);
	assert_int_equal(atomic_load(&kube_watch_stats(w)->relists_gone), 1);
	kube_watch_stop(w);
	assert_string_equal(e->seen.log[1], "REPLACE 3 332");
	assert_true(has_param(e->srv->req[0].path, "labelSelector=app%3Ddemo"));
	assert_true(has_param(e->srv->req[1].path, "labelSelector=app%3Ddemo"));
}

static void test_watch_truncated_and_malformed(void **state)
{
	struct wenv *e = *state;
	push_file(e->srv, "29-list-for-rv.json");
	/* a stream cut in the middle of an event */
	const char *cut =
	    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
	    "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"w1\",\"namespace\":"
	    "\"default\",\"resourceVersion\":\"340\"}}}\n"
	    "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"w2\",\"names";
	replay_push_raw(e->srv, cut, strlen(cut));
	/* then a line of garbage between two events */
	const char *bad = "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"w2\","
	                  "\"namespace\":\"default\",\"resourceVersion\":\"341\"}}}\n"
	                  "this is not json\n"
	                  "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"w3\","
	                  "\"namespace\":\"default\",\"resourceVersion\":\"342\"}}}\n";
	replay_push(e->srv, 200, bad, strlen(bad), true);
	struct kube_watch_opts o = widget_watch();
	struct kube_watch_handler h = {
	    .page = h_page, .listed = h_listed, .event = h_event, .ud = &e->seen};
	struct kube_watch *w = NULL;
	assert_int_equal(kube_watch_start(e->c, &o, &h, &w), 0);
	WAIT_FOR(nreq(e->srv) >= 4);
	const struct kube_watch_stats *st = kube_watch_stats(w);
	/* the cut stream and the garbage line */
	WAIT_FOR(atomic_load(&st->malformed) == 2);
	uint64_t lists = atomic_load(&st->lists), failures = atomic_load(&st->failures);
	kube_watch_stop(w);
	/* the cut event and the event after the garbage were not applied */
	assert_int_equal(e->seen.events, 2);
	assert_string_equal(e->seen.log[1], "MODIFIED w1 340");
	assert_string_equal(e->seen.log[2], "MODIFIED w2 341");
	/* each reconnect resumes after the last event applied: no loss, no relist */
	assert_true(has_param(e->srv->req[2].path, "resourceVersion=340"));
	assert_true(has_param(e->srv->req[3].path, "resourceVersion=341"));
	assert_int_equal(lists, 1);
	assert_true(failures >= 2);
}

static void test_watch_oversized_event_skipped(void **state)
{
	struct wenv *e = *state;
	push_file(e->srv, "29-list-for-rv.json");
	size_t big = 8192;
	char *s = malloc(big + 512);
	int n = snprintf(s, 512,
	                 "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"huge\","
	                 "\"resourceVersion\":\"350\"},\"data\":\"");
	memset(s + n, 'z', big);
	n += (int)big;
	n += snprintf(s + n, 512,
	              "\"}}\n{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"w9\","
	              "\"resourceVersion\":\"351\"}}}\n");
	replay_push(e->srv, 200, s, (size_t)n, true);
	free(s);
	struct kube_watch_opts o = widget_watch();
	o.max_event_bytes = 4096;
	struct kube_watch_handler h = {
	    .page = h_page, .listed = h_listed, .event = h_event, .ud = &e->seen};
	struct kube_watch *w = NULL;
	assert_int_equal(kube_watch_start(e->c, &o, &h, &w), 0);
	WAIT_FOR(e->seen.events == 1);
	const struct kube_watch_stats *st = kube_watch_stats(w);
	WAIT_FOR(atomic_load(&st->oversized) == 1);
	kube_watch_stop(w);
	assert_string_equal(e->seen.log[1], "ADDED w9 351");
}

static void test_watch_server_down_backs_off(void **state)
{
	struct wenv *e = *state;
	free(e->cfg->server);
	e->cfg->server = strdup("http://127.0.0.1:1");
	struct kube_watch_opts o = widget_watch();
	o.backoff_initial_ms = 50;
	o.backoff_max_ms = 400;
	struct kube_watch_handler h = {
	    .page = h_page, .listed = h_listed, .event = h_event, .ud = &e->seen};
	struct kube_watch *w = NULL;
	assert_int_equal(kube_watch_start(e->c, &o, &h, &w), 0);
	usleep(1500 * 1000);
	const struct kube_watch_stats *st = kube_watch_stats(w);
	uint64_t fails = atomic_load(&st->failures);
	kube_watch_stop(w);
	/* 50, 100, 200, 400, 400 ... ms apart: a handful in 1.5 s, where a busy
	 * loop makes thousands. */
	assert_true(fails >= 2);
	assert_true(fails <= 12);
	assert_int_equal(e->seen.replaces, 0);
}

static void test_watch_stop_is_prompt_while_streaming(void **state)
{
	struct wenv *e = *state;
	push_file(e->srv, "29-list-for-rv.json");
	/* a stream that stays open (the replay server waits before answering) */
	replay_push(e->srv, 200, "", 0, true);
	e->srv->resp[e->srv->nresp - 1].delay_ms = 30000;
	struct kube_watch_opts o = widget_watch();
	struct kube_watch_handler h = {
	    .page = h_page, .listed = h_listed, .event = h_event, .ud = &e->seen};
	struct kube_watch *w = NULL;
	assert_int_equal(kube_watch_start(e->c, &o, &h, &w), 0);
	WAIT_FOR(nreq(e->srv) >= 2);
	assert_true(kube_watch_synced(w));
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	kube_watch_stop(w);
	clock_gettime(CLOCK_MONOTONIC, &b);
	/* not a speed assertion: only that stop does not wait for the
	 * server's stream to end (30 s) */
	assert_true(b.tv_sec - a.tv_sec < 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_parser_recorded_any_chunking),
	    cmocka_unit_test(test_parser_error_event),
	    cmocka_unit_test(test_parser_bad_input),
	    cmocka_unit_test(test_backoff),
	    cmocka_unit_test_setup_teardown(test_watch_resume_and_relist_on_410_event, wsetup,
	                                    wteardown),
	    cmocka_unit_test_setup_teardown(test_watch_http_410_relists, wsetup, wteardown),
	    cmocka_unit_test_setup_teardown(test_watch_truncated_and_malformed, wsetup, wteardown),
	    cmocka_unit_test_setup_teardown(test_watch_oversized_event_skipped, wsetup, wteardown),
	    cmocka_unit_test_setup_teardown(test_watch_server_down_backs_off, wsetup, wteardown),
	    cmocka_unit_test_setup_teardown(test_watch_stop_is_prompt_while_streaming, wsetup,
	                                    wteardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
