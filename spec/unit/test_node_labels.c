/* The operator's Node labels: the set each node should carry from the nodes
 * each cache is Ready on, what the field manager owns as read from a Node's
 * managedFields (as kube-apiserver writes them), and the apply configuration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node_labels.h"

#define VA "default.gkmcache.gkm.io/vector-add"
#define RO "clustergkmcache.gkm.io/rocm"
#define LL "team-b.gkmcache.gkm.io/llama"

/* "k1,k2" of what node should carry */
static void wanted(const struct node_labels *nl, const char *node, char *out, size_t cap)
{
	const char **keys = NULL;
	size_t n = 0;
	assert_int_equal(node_labels_wanted(nl, node, &keys, &n), 0);
	out[0] = '\0';
	for (size_t i = 0; i < n; i++)
		snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? "," : "", keys[i]);
	node_labels_keys_free(keys);
}

#define assert_wanted(nl, node, want)                                                              \
	do {                                                                                       \
		char got_[512];                                                                    \
		wanted((nl), (node), got_, sizeof(got_));                                          \
		assert_string_equal(got_, (want));                                                 \
	} while (0)

static void test_wanted(void **state)
{
	(void)state;
	struct node_labels *nl = NULL;
	/* no loop and never started: the sets are kept, nothing is applied */
	assert_int_equal(node_labels_new(NULL, NULL, NULL, 250, &nl), 0);
	const char *va[] = {"node-3", "node-1", "node-3"}, *ro[] = {"node-2", "node-3"},
	           *ll[] = {"node-1"};
	assert_int_equal(node_labels_set(nl, VA, va, 3), 0);
	assert_int_equal(node_labels_set(nl, RO, ro, 2), 0);
	assert_int_equal(node_labels_set(nl, LL, ll, 1), 0);
	assert_wanted(nl, "node-1", VA "," LL);
	assert_wanted(nl, "node-2", RO);
	assert_wanted(nl, "node-3", RO "," VA);
	assert_wanted(nl, "node-4", "");

	/* a new set replaces the old one */
	const char *va2[] = {"node-2"};
	assert_int_equal(node_labels_set(nl, VA, va2, 1), 0);
	assert_wanted(nl, "node-1", LL);
	assert_wanted(nl, "node-2", RO "," VA);
	assert_wanted(nl, "node-3", RO);

	/* ready nowhere, or deleted: the label goes from every node */
	assert_int_equal(node_labels_set(nl, RO, NULL, 0), 0);
	node_labels_drop(nl, LL);
	node_labels_drop(nl, "clustergkmcache.gkm.io/never-set");
	assert_wanted(nl, "node-1", "");
	assert_wanted(nl, "node-2", VA);
	assert_wanted(nl, "node-3", "");
	node_labels_free(nl);
}

/* A Node as kube-apiserver returns it: labels and managedFields. */
static cJSON *node(const char *json)
{
	cJSON *n = cJSON_Parse(json);
	assert_non_null(n);
	return n;
}

static void owned(const char *json, const char *want)
{
	cJSON *n = node(json);
	char **keys = NULL, got[512] = "";
	size_t cnt = 99;
	assert_int_equal(node_labels_owned(n, &keys, &cnt), 0);
	for (size_t i = 0; i < cnt; i++)
		snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", i ? "," : "",
		         keys[i]);
	assert_string_equal(got, want);
	node_labels_owned_free(keys, cnt);
	cJSON_Delete(n);
}

static void test_owned(void **state)
{
	(void)state;
	/* the manager's Apply entry; kubectl's Update of another label; the
	 * node lifecycle's status entry */
	owned(
	    "{\"metadata\":{\"name\":\"node-1\",\"labels\":{\"" VA "\":\"ready\",\"" RO
	    "\":\"ready\",\"team\":\"ml\"},\"managedFields\":["
	    "{\"manager\":\"gkm-operator/"
	    "node-labels\",\"operation\":\"Apply\",\"apiVersion\":\"v1\","
	    "\"fieldsType\":\"FieldsV1\",\"fieldsV1\":{\"f:metadata\":{\"f:labels\":{\"f:" VA
	    "\":{},\"f:" RO "\":{}}}}},"
	    "{\"manager\":\"kubectl-label\",\"operation\":\"Update\",\"fieldsV1\":{\"f:metadata\":"
	    "{\"f:labels\":{\"f:team\":{}}}}},"
	    "{\"manager\":\"kubelet\",\"operation\":\"Update\",\"subresource\":\"status\","
	    "\"fieldsV1\":{\"f:status\":{\"f:conditions\":{}}}}]}}",
	    RO "," VA);
	/* the same manager name on another operation or subresource is not ours;
	 * a value someone changed is not a label we set */
	owned("{\"metadata\":{\"labels\":{\"" VA "\":\"stale\",\"" RO "\":\"ready\"},"
	      "\"managedFields\":["
	      "{\"manager\":\"gkm-operator/node-labels\",\"operation\":\"Update\",\"fieldsV1\":"
	      "{\"f:metadata\":{\"f:labels\":{\"f:" RO "\":{}}}}},"
	      "{\"manager\":\"gkm-operator/node-labels\",\"operation\":\"Apply\",\"subresource\":"
	      "\"status\",\"fieldsV1\":{\"f:metadata\":{\"f:labels\":{\"f:" RO "\":{}}}}},"
	      "{\"manager\":\"gkm-operator/node-labels\",\"operation\":\"Apply\",\"fieldsV1\":"
	      "{\"f:metadata\":{\"f:labels\":{\"f:" VA "\":{},\".\":{}}}}}]}}",
	      "");
	/* nothing, or nonsense: nothing owned, no crash */
	owned("{\"metadata\":{\"name\":\"node-1\"}}", "");
	owned("{\"metadata\":{\"managedFields\":{\"manager\":7}}}", "");
	owned("{\"metadata\":{\"managedFields\":[7,\"x\",{\"manager\":\"gkm-operator/node-labels\","
	      "\"operation\":\"Apply\",\"fieldsV1\":[1,2]}]}}",
	      "");
	owned("[]", "");
}

static void test_apply_obj(void **state)
{
	(void)state;
	const char *keys[] = {RO, VA};
	cJSON *o = node_labels_apply_obj("node-3", "0b5a", keys, 2);
	char *s = cJSON_PrintUnformatted(o);
	assert_string_equal(
	    s, "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"node-3\","
	       "\"uid\":\"0b5a\",\"labels\":{\"" RO "\":\"ready\",\"" VA "\":\"ready\"}}}");
	free(s);
	cJSON_Delete(o);
	/* the empty set: no labels member at all; the manager then owns no
	 * label, and the API server removes those it owned */
	o = node_labels_apply_obj("node-3", "0b5a", NULL, 0);
	s = cJSON_PrintUnformatted(o);
	assert_string_equal(s, "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":"
	                       "\"node-3\",\"uid\":\"0b5a\"}}");
	free(s);
	cJSON_Delete(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_wanted),
	    cmocka_unit_test(test_owned),
	    cmocka_unit_test(test_apply_obj),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
