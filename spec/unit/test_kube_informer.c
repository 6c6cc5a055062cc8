/* Informer caches: list, watch events and relists applied to the cache on
 * the owner's thread, with the changes each one reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>

#include "kube_informer.h"
#include "kube_replay.h"

struct ienv {
	struct replay *srv;
	struct kube_config *cfg;
	struct kube_client *c;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool notified;
	char log[64][96];
	unsigned n;
	pthread_t owner;
	bool wrong_thread;
};

static int isetup(void **state)
{
	struct ienv *e = calloc(1, sizeof(*e));
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	e->srv = replay_start();
	e->c = replay_client(e->srv, &e->cfg);
	e->owner = pthread_self();
	*state = e;
	return 0;
}

static int iteardown(void **state)
{
	struct ienv *e = *state;
	replay_client_free(e->c, e->cfg);
	replay_stop(e->srv);
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->mu);
	free(e);
	return 0;
}

static void notify(struct kube_informer *inf, void *ud)
{
	(void)inf;
	struct ienv *e = ud;
	pthread_mutex_lock(&e->mu);
	e->notified = true;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

static void on_change(struct kube_informer *inf, enum kube_event_type t, const cJSON *obj, void *ud)
{
	(void)inf;
	struct ienv *e = ud;
	if (!pthread_equal(pthread_self(), e->owner))
		e->wrong_thread = true;
	if (e->n < 64)
		snprintf(e->log[e->n++], sizeof(e->log[0]), "%s %s %s", kube_event_type_name(t),
		         kube_obj_name(obj), kube_obj_rv(obj) ? kube_obj_rv(obj) : "-");
}

/* Wait for a notification, then drain; returns deltas applied. */
static size_t wait_drain(struct ienv *e, struct kube_informer *inf)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	pthread_mutex_lock(&e->mu);
	while (!e->notified)
		if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) != 0)
			break;
	e->notified = false;
	pthread_mutex_unlock(&e->mu);
	return kube_informer_drain(inf);
}

static struct kube_informer_opts widget_informer(struct ienv *e)
{
	struct kube_informer_opts o = {
	    .watch = {.resource = {.group = "example.com",
	                           .version = "v1",
	                           .plural = "widgets",
	                           .kind = "Widget",
	                           .namespaced = true},
	              .ns = "default",
	              .backoff_initial_ms = 20,
	              .backoff_max_ms = 100},
	    .notify = notify,
	    .on_change = on_change,
	    .ud = e,
	};
	return o;
}

static void push_file(struct replay *r, const char *name)
{
	cJSON *fx = replay_load(name);
	assert_non_null(fx);
	replay_push_fixture(r, fx);
	cJSON_Delete(fx);
}

/* The list of fixture 29 as it would be after the watched events of
 * fixture 30, and after w1 was deleted and w2 changed unseen. */
static void push_changed_list(struct replay *r)
{
	cJSON *fx = replay_load("29-list-for-rv.json");
	cJSON *body = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "response"), "body");
	cJSON *items = cJSON_GetObjectItem(body, "items");
	cJSON_DeleteItemFromArray(items, 3); /* w4, deleted as the watch said */
	cJSON_DeleteItemFromArray(items, 0); /* w1, deleted while nobody watched */
	cJSON *w2meta = cJSON_GetObjectItem(cJSON_GetArrayItem(items, 0), "metadata");
	cJSON_ReplaceItemInObject(w2meta, "resourceVersion", cJSON_CreateString("400"));
	cJSON *w3meta = cJSON_GetObjectItem(cJSON_GetArrayItem(items, 1), "metadata");
	cJSON_ReplaceItemInObject(w3meta, "resourceVersion", cJSON_CreateString("333"));
	cJSON_ReplaceItemInObject(cJSON_GetObjectItem(body, "metadata"), "resourceVersion",
	                          cJSON_CreateString("400"));
	char *t = cJSON_PrintUnformatted(body);
	replay_push(r, 200, t, strlen(t), false);
	free(t);
	cJSON_Delete(fx);
}

static void test_list_watch_relist(void **state)
{
	struct ienv *e = *state;
	push_file(e->srv, "29-list-for-rv.json");
	push_file(e->srv, "30-watch-bookmarks.json");
	push_file(e->srv, "31-watch-too-old.json");
	push_changed_list(e->srv);
	struct kube_informer_opts o = widget_informer(e);
	struct kube_informer *inf = NULL;
	assert_int_equal(kube_informer_start(e->c, &o, &inf), 0);
	/* drain as deltas come (how many arrive per drain varies) */
	size_t total = 0;
	while (e->n < 9 && total < 200)
		total += wait_drain(e, inf) + 1;
	assert_true(kube_informer_synced(inf));
	for (int i = 0; i < 5; i++)
		assert_int_equal(strncmp(e->log[i], "ADDED w", 7), 0);
	assert_string_equal(e->log[0], "ADDED w1 329");
	assert_int_equal(kube_informer_len(inf), 3);
	cJSON *w3 = kube_informer_get(inf, "default", "w3");
	assert_non_null(w3);
	assert_string_equal(kube_obj_rv(w3), "333");
	/* managedFields are not kept */
	assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(w3, "metadata"), "managedFields"));
	cJSON_Delete(w3);
	assert_null(kube_informer_get(inf, "other", "w3"));
	assert_null(kube_informer_get(inf, "default", "w1"));
	size_t len = 0;
	const char *w5 = kube_informer_get_text(inf, "default", "w5", &len);
	assert_non_null(w5);
	assert_int_equal(strlen(w5), len);
	assert_non_null(strstr(w5, "\"name\":\"w5\""));
	kube_informer_stop(inf);
	assert_string_equal(e->log[5], "MODIFIED w3 333");
	assert_string_equal(e->log[6], "DELETED w4 334");
	/* the relist reports only what changed while we were not watching:
	 * w2 modified, w1 gone; w3 and w5 unchanged are not reported again;
	 * w4, deleted by the watch already, is not reported twice */
	assert_string_equal(e->log[7], "MODIFIED w2 400");
	assert_string_equal(e->log[8], "DELETED w1 329");
	assert_int_equal(e->n, 9);
	assert_false(e->wrong_thread);
}

struct loopctx {
	struct ienv *e;
	struct kube_informer *inf;
	struct loop *l;
	int ticks;
};

static void stop_loop(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

static void check(struct loop *l, void *ud)
{
	struct loopctx *x = ud;
	if ((x->inf && kube_informer_synced(x->inf) && x->e->n >= 5) || ++x->ticks > 500) {
		kube_informer_stop(x->inf);
		x->inf = NULL;
		/* drains posted before this run first: nothing is left behind */
		assert_int_equal(loop_post(l, stop_loop, NULL), 0);
		return;
	}
	loop_add_timer(l, 10, check, x);
}

static void test_informer_on_loop(void **state)
{
	struct ienv *e = *state;
	push_file(e->srv, "29-list-for-rv.json");
	struct loop *l = NULL;
	assert_int_equal(loop_new(&l), 0);
	struct kube_informer_opts o = widget_informer(e);
	o.notify = NULL;
	o.loop = l;
	struct loopctx x = {.e = e, .l = l};
	assert_int_equal(kube_informer_start(e->c, &o, &x.inf), 0);
	loop_add_timer(l, 10, check, &x);
	assert_int_equal(loop_run(l), 0);
	loop_free(l);
	assert_true(e->n >= 5);
	assert_false(e->wrong_thread); /* on_change ran on the loop thread */
	assert_true(x.ticks <= 500);
}

static void test_bad_objects_not_cached(void **state)
{
	struct ienv *e = *state;
	const char *list =
	    "{\"kind\":\"WidgetList\",\"metadata\":{\"resourceVersion\":\"9\"},\"items\":["
	    "{\"metadata\":{\"namespace\":\"default\",\"resourceVersion\":\"1\"}},"
	    "{\"metadata\":{\"name\":\"ok\",\"namespace\":\"default\",\"resourceVersion\":\"2\"}}]"
	    "}";
	replay_push(e->srv, 200, list, strlen(list), false);
	struct kube_informer_opts o = widget_informer(e);
	struct kube_informer *inf = NULL;
	assert_int_equal(kube_informer_start(e->c, &o, &inf), 0);
	while (!kube_informer_synced(inf))
		wait_drain(e, inf);
	assert_int_equal(kube_informer_len(inf), 1);
	assert_non_null(kube_informer_get_text(inf, "default", "ok", NULL));
	kube_informer_stop(inf);
	char key[64];
	cJSON *cl = cJSON_Parse("{\"metadata\":{\"name\":\"n1\"}}");
	assert_int_equal(kube_informer_key(cl, key, sizeof(key)), 0);
	assert_string_equal(key, "n1");
	assert_int_equal(kube_informer_key(cl, key, 2), -ENAMETOOLONG);
	cJSON_Delete(cl);
}

/* A consumer that keeps its own state: the cache keeps no objects, lists
 * come page by page, and a deletion found by a relist names the object. */
static void on_change_nc(struct kube_informer *inf, enum kube_event_type t, const cJSON *obj,
                         void *ud)
{
	struct ienv *e = ud;
	on_change(inf, t, obj, ud);
	if (t == KUBE_DELETED) {
		char *txt = cJSON_PrintUnformatted(obj);
		snprintf(e->log[63], sizeof(e->log[63]), "%s", txt ? txt : "");
		free(txt);
	}
}

static void test_no_cache_pages(void **state)
{
	struct ienv *e = *state;
	const char *page1 =
	    "{\"kind\":\"WidgetList\",\"metadata\":{\"resourceVersion\":\"9\",\"continue\":\"t1\"},"
	    "\"items\":[{\"metadata\":{\"name\":\"w1\",\"namespace\":\"default\","
	    "\"resourceVersion\":\"1\"},\"spec\":{\"size\":1}},"
	    "{\"metadata\":{\"name\":\"w2\",\"namespace\":\"default\",\"resourceVersion\":\"2\"}}]"
	    "}";
	const char *page2 = "{\"kind\":\"WidgetList\",\"metadata\":{\"resourceVersion\":\"9\"},"
	                    "\"items\":[{\"metadata\":{\"name\":\"w3\",\"namespace\":\"default\","
	                    "\"resourceVersion\":\"3\"}}]}";
	/* after the watch is refused (410), the relist no longer has w2 */
	const char *relist =
	    "{\"kind\":\"WidgetList\",\"metadata\":{\"resourceVersion\":\"12\"},"
	    "\"items\":[{\"metadata\":{\"name\":\"w1\",\"namespace\":\"default\","
	    "\"resourceVersion\":\"1\"}},{\"metadata\":{\"name\":\"w3\",\"namespace\":"
	    "\"default\",\"resourceVersion\":\"11\"}}]}";
	replay_push(e->srv, 200, page1, strlen(page1), false);
	replay_push(e->srv, 200, page2, strlen(page2), false);
	push_file(e->srv, "31-watch-too-old.json");
	replay_push(e->srv, 200, relist, strlen(relist), false);
	struct kube_informer_opts o = widget_informer(e);
	o.no_cache = true;
	o.watch.list_limit = 2;
	o.on_change = on_change_nc;
	struct kube_informer *inf = NULL;
	assert_int_equal(kube_informer_start(e->c, &o, &inf), 0);
	size_t rounds = 0;
	while (e->n < 5 && rounds++ < 200)
		wait_drain(e, inf);
	assert_true(kube_informer_synced(inf));
	assert_string_equal(e->log[0], "ADDED w1 1");
	assert_string_equal(e->log[1], "ADDED w2 2");
	assert_string_equal(e->log[2], "ADDED w3 3");
	/* w1 unchanged is not reported again */
	assert_string_equal(e->log[3], "MODIFIED w3 11");
	assert_string_equal(e->log[4], "DELETED w2 -");
	assert_int_equal(e->n, 5);
	/* what is known of w2 without a cache: its identity */
	cJSON *w2 = cJSON_Parse(e->log[63]);
	assert_non_null(w2);
	assert_string_equal(kube_obj_name(w2), "w2");
	assert_string_equal(kube_obj_namespace(w2), "default");
	assert_string_equal(cJSON_GetObjectItem(w2, "kind")->valuestring, "Widget");
	assert_string_equal(cJSON_GetObjectItem(w2, "apiVersion")->valuestring, "example.com/v1");
	cJSON_Delete(w2);
	/* keys only: no object text is kept */
	assert_int_equal(kube_informer_len(inf), 2);
	assert_null(kube_informer_get_text(inf, "default", "w1", NULL));
	assert_null(kube_informer_get(inf, "default", "w3"));
	kube_informer_stop(inf);
	assert_false(e->wrong_thread);
}

/* An owner that does not drain holds a long list back: the watch thread
 * queues a few pages and waits for room, and nothing is lost. */
static void test_pages_wait_for_room(void **state)
{
	struct ienv *e = *state;
	char page[512], cont[32];
	for (int i = 1; i <= 10; i++) {
		snprintf(cont, sizeof(cont), i < 10 ? ",\"continue\":\"t%d\"" : "", i);
		snprintf(page, sizeof(page),
		         "{\"kind\":\"WidgetList\",\"metadata\":{\"resourceVersion\":\"20\"%s},"
		         "\"items\":[{\"metadata\":{\"name\":\"w%d\",\"namespace\":\"default\","
		         "\"resourceVersion\":\"%d\"}}]}",
		         cont, i, i);
		replay_push(e->srv, 200, page, strlen(page), false);
	}
	struct kube_informer_opts o = widget_informer(e);
	o.watch.list_limit = 1;
	struct kube_informer *inf = NULL;
	assert_int_equal(kube_informer_start(e->c, &o, &inf), 0);
	struct timespec nap = {0, 300 * 1000000L};
	nanosleep(&nap, NULL);
	/* the first drain finds no more than the pages that fit */
	assert_true(kube_informer_drain(inf) <= 4);
	size_t rounds = 0;
	while ((e->n < 10 || !kube_informer_synced(inf)) && rounds++ < 200)
		wait_drain(e, inf);
	assert_int_equal(e->n, 10);
	for (unsigned i = 0; i < 10; i++) {
		char want[32];
		snprintf(want, sizeof(want), "ADDED w%u %u", i + 1, i + 1);
		assert_string_equal(e->log[i], want);
	}
	assert_int_equal(kube_informer_len(inf), 10);
	kube_informer_stop(inf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_list_watch_relist, isetup, iteardown),
	    cmocka_unit_test_setup_teardown(test_informer_on_loop, isetup, iteardown),
	    cmocka_unit_test_setup_teardown(test_bad_objects_not_cached, isetup, iteardown),
	    cmocka_unit_test_setup_teardown(test_no_cache_pages, isetup, iteardown),
	    cmocka_unit_test_setup_teardown(test_pages_wait_for_room, isetup, iteardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
