/* The operator's compact node reports: the string map and interning they
 * stand on, entries given back as the agent wrote them, and the changes
 * reported when a node object changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "intern.h"
#include "node_reports.h"
#include "strmap.h"

static void test_strmap(void **state)
{
	(void)state;
	struct strmap m = STRMAP_INIT;
	static char keys[2000][16];
	assert_null(strmap_get(&m, "absent"));
	assert_null(strmap_del(&m, "absent"));
	for (int i = 0; i < 2000; i++) {
		snprintf(keys[i], sizeof(keys[i]), "k%d", i);
		assert_int_equal(strmap_put(&m, keys[i], keys[i]), 0);
	}
	assert_int_equal(m.len, 2000);
	/* delete every third: what probed past a hole must still be found */
	for (int i = 0; i < 2000; i += 3)
		assert_ptr_equal(strmap_del(&m, keys[i]), keys[i]);
	for (int i = 0; i < 2000; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%d", i);
		if (i % 3 == 0)
			assert_null(strmap_get(&m, k));
		else
			assert_ptr_equal(strmap_get(&m, k), keys[i]);
	}
	size_t pos = 0, n = 0;
	const char *key;
	void *val;
	while (strmap_next(&m, &pos, &key, &val)) {
		assert_ptr_equal(key, val);
		n++;
	}
	assert_int_equal(n, m.len);
	assert_int_equal(n, 2000 - 667);
	/* put of an equal key replaces the value */
	assert_int_equal(strmap_put(&m, keys[1], keys[2]), 0);
	assert_ptr_equal(strmap_get(&m, "k1"), keys[2]);
	assert_int_equal(m.len, 2000 - 667);
	strmap_clear(&m);
	assert_int_equal(m.len, 0);
}

static void test_intern(void **state)
{
	(void)state;
	struct intern t = INTERN_INIT;
	char buf[32];
	snprintf(buf, sizeof(buf), "%s", "Ready");
	const char *a = intern_get(&t, buf), *b = intern_get(&t, "Ready");
	assert_non_null(a);
	assert_ptr_equal(a, b); /* one copy */
	assert_ptr_not_equal(a, buf);
	const char *c = intern_get(&t, "Failed");
	assert_ptr_not_equal(a, c);
	assert_int_equal(intern_count(&t), 2);
	assert_int_equal(t.bytes, strlen("Ready") + strlen("Failed") + 2);
	intern_put(&t, a);
	assert_int_equal(intern_count(&t), 2); /* b still holds it */
	assert_ptr_equal(intern_ref(b), b);
	intern_put(&t, b);
	assert_string_equal(b, "Ready");
	intern_put(&t, b);
	assert_int_equal(intern_count(&t), 1);
	intern_put(&t, c);
	intern_put(&t, NULL);
	assert_int_equal(intern_count(&t), 0);
	assert_int_equal(t.bytes, 0);
	intern_clear(&t);
}

struct changes {
	char log[16][128];
	unsigned n;
};

static void changed(const char *ns, const char *cache, void *ud)
{
	struct changes *c = ud;
	if (c->n < 16)
		snprintf(c->log[c->n++], sizeof(c->log[0]), "%s/%s", ns, cache);
}

static int has(const struct changes *c, const char *s)
{
	for (unsigned i = 0; i < c->n; i++)
		if (!strcmp(c->log[i], s))
			return 1;
	return 0;
}

static const char *ENTRY_A =
    "{\"digest\":\"sha256:aa\",\"state\":\"Ready\",\"reason\":\"Ready\",\"message\":\"ok\","
    "\"pods\":[],\"compatibleGPUs\":[{\"ids\":[0,1],\"gpuType\":\"T4\"}],"
    "\"incompatibleGPUs\":[],\"lastUpdated\":\"2026-01-01T00:00:01Z\"}";

static cJSON *caches_of(const char *json)
{
	cJSON *c = cJSON_Parse(json);
	assert_non_null(c);
	return c;
}

static void count(const char *ns, const char *node, void *ud)
{
	(void)ns;
	(void)node;
	(*(int *)ud)++;
}

static void test_node_reports(void **state)
{
	(void)state;
	struct node_reports *r = NULL;
	assert_int_equal(node_reports_new(&r), 0);
	char json[2048];
	snprintf(json, sizeof(json), "{\"c1\":%s,\"c2\":%s}", ENTRY_A, ENTRY_A);
	cJSON *caches = caches_of(json);
	struct changes ch = {0};
	bool added = false;
	assert_int_equal(node_reports_set(r, "ns", "n1", caches, changed, &ch, &added), 0);
	assert_true(added);
	assert_int_equal(ch.n, 2);
	assert_true(has(&ch, "ns/c1") && has(&ch, "ns/c2"));
	/* the same report on a second node shares every string */
	assert_int_equal(node_reports_set(r, "ns", "n2", caches, NULL, NULL, NULL), 0);
	struct node_reports_stats st;
	node_reports_stats(r, &st);
	assert_int_equal(st.objects, 2);
	assert_int_equal(st.entries, 4);
	assert_int_equal(st.strings, 4); /* c1, c2, the body, lastUpdated */

	/* given back as written, lastUpdated included */
	cJSON *e = node_reports_entry(r, "ns", "n2", "c2");
	assert_true(cJSON_Compare(e, cJSON_GetObjectItem(caches, "c2"), 1));
	cJSON_Delete(e);
	assert_null(node_reports_entry(r, "ns", "n2", "c3"));
	assert_null(node_reports_entry(r, "other", "n2", "c1"));
	assert_null(node_reports_entry(r, "", "n2", "c1"));
	assert_true(node_reports_has(r, "ns", "n1"));
	assert_false(node_reports_has(r, "", "n1"));

	/* unchanged: nothing reported, not added again */
	memset(&ch, 0, sizeof(ch));
	assert_int_equal(node_reports_set(r, "ns", "n1", caches, changed, &ch, &added), 0);
	assert_false(added);
	assert_int_equal(ch.n, 0);

	/* c1 changes state, c2 only its lastUpdated, c3 appears */
	cJSON *c1 = cJSON_GetObjectItem(caches, "c1");
	cJSON_ReplaceItemInObject(c1, "state", cJSON_CreateString("Failed"));
	cJSON_ReplaceItemInObject(cJSON_GetObjectItem(caches, "c2"), "lastUpdated",
	                          cJSON_CreateString("2026-01-01T00:00:09Z"));
	cJSON_AddItemToObject(caches, "c3", cJSON_Parse("{\"state\":\"Pending\"}"));
	assert_int_equal(node_reports_set(r, "ns", "n1", caches, changed, &ch, NULL), 0);
	assert_int_equal(ch.n, 3);
	assert_true(has(&ch, "ns/c1") && has(&ch, "ns/c2") && has(&ch, "ns/c3"));
	e = node_reports_entry(r, "ns", "n1", "c1");
	assert_string_equal(cJSON_GetObjectItem(e, "state")->valuestring, "Failed");
	cJSON_Delete(e);
	/* an entry without lastUpdated stays without one */
	e = node_reports_entry(r, "ns", "n1", "c3");
	assert_null(cJSON_GetObjectItem(e, "lastUpdated"));
	assert_string_equal(cJSON_GetObjectItem(e, "state")->valuestring, "Pending");
	cJSON_Delete(e);
	/* n2 kept its own report */
	e = node_reports_entry(r, "ns", "n2", "c1");
	assert_string_equal(cJSON_GetObjectItem(e, "state")->valuestring, "Ready");
	cJSON_Delete(e);

	/* status without caches: every entry goes */
	memset(&ch, 0, sizeof(ch));
	assert_int_equal(node_reports_set(r, "ns", "n2", NULL, changed, &ch, NULL), 0);
	assert_int_equal(ch.n, 2);
	assert_null(node_reports_entry(r, "ns", "n2", "c1"));

	/* cluster-scoped objects are their own scope */
	assert_int_equal(node_reports_set(r, "", "n1", NULL, NULL, NULL, &added), 0);
	assert_true(added);
	int nall = 0, ncluster = 0, nns = 0;
	node_reports_foreach(r, NULL, count, &nall);
	node_reports_foreach(r, "", count, &ncluster);
	node_reports_foreach(r, "ns", count, &nns);
	assert_int_equal(nall, 3);
	assert_int_equal(ncluster, 1);
	assert_int_equal(nns, 2);

	/* removal reports what the node had; unknown ones are not there */
	memset(&ch, 0, sizeof(ch));
	assert_true(node_reports_remove(r, "ns", "n1", changed, &ch));
	assert_int_equal(ch.n, 3);
	assert_false(node_reports_remove(r, "ns", "n1", changed, &ch));
	assert_false(node_reports_has(r, "ns", "n1"));

	/* names over 253 bytes are refused and change nothing */
	char longname[300];
	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	assert_int_equal(node_reports_set(r, "ns", longname, caches, NULL, NULL, NULL), -EINVAL);
	node_reports_stats(r, &st);
	assert_int_equal(st.objects, 2);
	assert_int_equal(st.entries, 0);
	/* only the cache-less objects are left: no strings held */
	assert_int_equal(st.strings, 0);
	cJSON_Delete(caches);
	node_reports_free(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_strmap),
	    cmocka_unit_test(test_intern),
	    cmocka_unit_test(test_node_reports),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
