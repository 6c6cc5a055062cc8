/* Work queue semantics and label selectors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube_selector.h"
#include "kube_workqueue.h"

static struct kube_workqueue *mk(unsigned flight, unsigned base, unsigned max)
{
	struct kube_workqueue_opts o = {
	    .max_in_flight = flight, .base_delay_ms = base, .max_delay_ms = max};
	struct kube_workqueue *q = NULL;
	assert_int_equal(kube_workqueue_new(&o, &q), 0);
	return q;
}

static void test_dedup(void **state)
{
	(void)state;
	struct kube_workqueue *q = mk(4, 10, 1000);
	assert_int_equal(kube_workqueue_add(q, "ns/a"), 0);
	assert_int_equal(kube_workqueue_add(q, "ns/b"), 0);
	assert_int_equal(kube_workqueue_add(q, "ns/a"), 0);
	assert_int_equal(kube_workqueue_ready(q), 2);
	assert_string_equal(kube_workqueue_get(q, 0), "ns/a"); /* FIFO */
	assert_string_equal(kube_workqueue_get(q, 0), "ns/b");
	assert_null(kube_workqueue_get(q, 0));
	kube_workqueue_done(q, "ns/a");
	kube_workqueue_done(q, "ns/b");
	assert_null(kube_workqueue_get(q, 0));
	assert_int_equal(kube_workqueue_add(q, ""), -EINVAL);
	char big[600];
	memset(big, 'k', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	assert_int_equal(kube_workqueue_add(q, big), -EINVAL);
	kube_workqueue_free(q);
}

static void test_add_while_processing(void **state)
{
	(void)state;
	struct kube_workqueue *q = mk(4, 10, 1000);
	kube_workqueue_add(q, "k");
	const char *k = kube_workqueue_get(q, 0);
	assert_string_equal(k, "k");
	/* an event arrives while k is reconciled: not handed out twice at once */
	kube_workqueue_add(q, "k");
	kube_workqueue_add(q, "k");
	assert_null(kube_workqueue_get(q, 0));
	assert_int_equal(kube_workqueue_ready(q), 0);
	kube_workqueue_done(q, "k");
	/* ...but once more afterwards, exactly once */
	assert_string_equal(kube_workqueue_get(q, 0), "k");
	assert_null(kube_workqueue_get(q, 0));
	kube_workqueue_done(q, "k");
	assert_null(kube_workqueue_get(q, 0));
	kube_workqueue_free(q);
}

static void test_bounded_concurrency(void **state)
{
	(void)state;
	struct kube_workqueue *q = mk(2, 10, 1000);
	kube_workqueue_add(q, "a");
	kube_workqueue_add(q, "b");
	kube_workqueue_add(q, "c");
	assert_non_null(kube_workqueue_get(q, 0));
	assert_non_null(kube_workqueue_get(q, 0));
	assert_null(kube_workqueue_get(q, 0)); /* two out: the limit */
	assert_int_equal(kube_workqueue_in_flight(q), 2);
	kube_workqueue_done(q, "a");
	assert_string_equal(kube_workqueue_get(q, 0), "c");
	kube_workqueue_done(q, "b");
	kube_workqueue_done(q, "c");
	assert_int_equal(kube_workqueue_in_flight(q), 0);
	kube_workqueue_free(q);
}

static void test_add_after_earliest_wins(void **state)
{
	(void)state;
	struct kube_workqueue *q = mk(4, 10, 1000);
	kube_workqueue_add_after(q, "k", 30000, 1000);
	kube_workqueue_add_after(q, "k", 5000, 1000);  /* earlier: wins */
	kube_workqueue_add_after(q, "k", 60000, 1000); /* later: ignored */
	assert_int_equal(kube_workqueue_delayed(q), 1);
	assert_int_equal(kube_workqueue_next_due(q), 6000);
	assert_null(kube_workqueue_get(q, 5999));
	assert_string_equal(kube_workqueue_get(q, 6000), "k");
	kube_workqueue_done(q, "k");
	/* the superseded deadlines do not fire again */
	assert_null(kube_workqueue_get(q, 31000));
	assert_null(kube_workqueue_get(q, 61000));
	assert_int_equal(kube_workqueue_next_due(q), UINT64_MAX);
	assert_int_equal(kube_workqueue_delayed(q), 0);
	/* debounce: a burst of delayed adds gives one reconcile */
	for (int i = 0; i < 100; i++)
		kube_workqueue_add_after(q, "agg", 500, 70000 + (uint64_t)i);
	assert_string_equal(kube_workqueue_get(q, 70500), "agg");
	kube_workqueue_done(q, "agg");
	assert_null(kube_workqueue_get(q, 80000));
	/* a delayed key that is also added now: now, and still later */
	kube_workqueue_add_after(q, "x", 100, 90000);
	kube_workqueue_add(q, "x");
	assert_string_equal(kube_workqueue_get(q, 90000), "x");
	kube_workqueue_done(q, "x");
	assert_string_equal(kube_workqueue_get(q, 90100), "x");
	kube_workqueue_done(q, "x");
	kube_workqueue_free(q);
}

static void test_rate_limited(void **state)
{
	(void)state;
	struct kube_workqueue *q = mk(4, 100, 1000);
	uint64_t now = 0;
	uint64_t want[] = {100, 200, 400, 800, 1000, 1000};
	for (int i = 0; i < 6; i++) {
		kube_workqueue_add_rate_limited(q, "k", now);
		assert_int_equal(kube_workqueue_failures(q, "k"), i + 1);
		assert_int_equal(kube_workqueue_next_due(q), now + want[i]);
		assert_null(kube_workqueue_get(q, now + want[i] - 1));
		now += want[i];
		assert_string_equal(kube_workqueue_get(q, now), "k");
		kube_workqueue_done(q, "k");
	}
	/* success: forget resets the backoff */
	kube_workqueue_forget(q, "k");
	assert_int_equal(kube_workqueue_failures(q, "k"), 0);
	kube_workqueue_add_rate_limited(q, "k", now);
	assert_int_equal(kube_workqueue_next_due(q), now + 100);
	/* Retry-After raises the delay */
	kube_workqueue_add_rate_limited_min(q, "r", 7000, now);
	assert_int_equal(kube_workqueue_failures(q, "r"), 1);
	assert_string_equal(kube_workqueue_get(q, now + 100), "k");
	kube_workqueue_done(q, "k");
	assert_null(kube_workqueue_get(q, now + 6999));
	assert_string_equal(kube_workqueue_get(q, now + 7000), "r");
	kube_workqueue_done(q, "r");
	kube_workqueue_free(q);
}

static void test_many_keys(void **state)
{
	(void)state;
	struct kube_workqueue *q = mk(1000000, 10, 1000);
	char k[32];
	for (int i = 0; i < 20000; i++) {
		snprintf(k, sizeof(k), "ns/obj-%d", i);
		assert_int_equal(kube_workqueue_add(q, k), 0);
		assert_int_equal(kube_workqueue_add(q, k), 0);
	}
	assert_int_equal(kube_workqueue_ready(q), 20000);
	for (int i = 0; i < 20000; i++) {
		const char *got = kube_workqueue_get(q, 0);
		snprintf(k, sizeof(k), "ns/obj-%d", i);
		assert_string_equal(got, k);
		kube_workqueue_done(q, k);
	}
	assert_null(kube_workqueue_get(q, 0));
	kube_workqueue_free(q);
}

/* ---- selectors ---- */

static bool sel_match(const char *sel, const char *labels_json)
{
	struct kube_selector *s = NULL;
	char err[256];
	assert_int_equal(kube_selector_parse(sel, &s, err, sizeof(err)), 0);
	cJSON *l = cJSON_Parse(labels_json);
	bool m = kube_selector_match(s, l);
	cJSON_Delete(l);
	kube_selector_free(s);
	return m;
}

static void test_selector_match(void **state)
{
	(void)state;
	const char *labels = "{\"app\":\"demo\",\"gkm.io/node\":\"node-1\",\"tier\":\"web\"}";
	assert_true(sel_match("", labels));
	assert_true(sel_match("app=demo", labels));
	assert_true(sel_match("app==demo", labels));
	assert_false(sel_match("app=other", labels));
	assert_true(sel_match("app!=other", labels));
	assert_true(sel_match("missing!=x", labels));
	assert_true(sel_match("gkm.io/node=node-1,tier", labels));
	assert_false(sel_match("gkm.io/node=node-1,!tier", labels));
	assert_true(sel_match("!legacy", labels));
	assert_true(sel_match("tier in (db, web)", labels));
	assert_false(sel_match("tier notin (db,web)", labels));
	assert_true(sel_match("env notin (prod)", labels));
	assert_false(sel_match("env in (prod)", labels));
	assert_true(sel_match(" app = demo , tier ", labels));
	assert_false(sel_match("app=demo", "null"));
	assert_true(sel_match("!app", "{}"));
}

static void test_selector_errors(void **state)
{
	(void)state;
	struct kube_selector *s = NULL;
	char err[256];
	const char *bad[] = {"app=",       "=x",           "app=demo,",         "a b",
	                     "tier in db", "tier in (a,b", "Bad_Prefix.io/x=1", "app=-x",
	                     "x=(y)",      "a=b=c"};
	/* "app=" is a valid empty value in Kubernetes */
	assert_int_equal(kube_selector_parse(bad[0], &s, err, sizeof(err)), 0);
	kube_selector_free(s);
	s = NULL;
	for (size_t i = 1; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		if (kube_selector_parse(bad[i], &s, err, sizeof(err)) != -EINVAL)
			fail_msg("selector \"%s\" accepted", bad[i]);
		assert_null(s);
		assert_true(err[0] != 0);
	}
	char longv[80];
	memset(longv, 'v', sizeof(longv) - 1);
	longv[sizeof(longv) - 1] = 0;
	char sel[100];
	snprintf(sel, sizeof(sel), "k=%s", longv);
	assert_int_equal(kube_selector_parse(sel, &s, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "invalid label value"));
}

static void test_selector_from_map(void **state)
{
	(void)state;
	cJSON *m = cJSON_Parse("{\"tier\":\"web\",\"gkm.io/node\":\"node-1\",\"app\":\"demo\"}");
	char *s = NULL, err[128];
	assert_int_equal(kube_selector_from_map(m, &s, err, sizeof(err)), 0);
	assert_string_equal(s, "app=demo,gkm.io/node=node-1,tier=web");
	free(s);
	cJSON_Delete(m);
	m = cJSON_Parse("{\"app\":1}");
	assert_int_equal(kube_selector_from_map(m, &s, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "must be a string"));
	cJSON_Delete(m);
	m = cJSON_Parse("{\"app\":\"a,b\"}");
	assert_int_equal(kube_selector_from_map(m, &s, err, sizeof(err)), -EINVAL);
	cJSON_Delete(m);
	assert_true(kube_label_key_valid("app.kubernetes.io/name"));
	assert_false(kube_label_key_valid("/name"));
	assert_false(kube_label_key_valid("UPPER.io/name"));
	assert_true(kube_label_value_valid(""));
	assert_false(kube_label_value_valid("-x"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_dedup),
	    cmocka_unit_test(test_add_while_processing),
	    cmocka_unit_test(test_bounded_concurrency),
	    cmocka_unit_test(test_add_after_earliest_wins),
	    cmocka_unit_test(test_rate_limited),
	    cmocka_unit_test(test_many_keys),
	    cmocka_unit_test(test_selector_match),
	    cmocka_unit_test(test_selector_errors),
	    cmocka_unit_test(test_selector_from_map),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
