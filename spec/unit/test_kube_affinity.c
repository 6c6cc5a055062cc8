/* Which Nodes a cache's spec.nodeSelector and required node affinity select,
 * as the scheduler reads a pod's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kube_affinity.h"

static const char *labels_gpu = "{\"gpu\":\"h100\",\"zone\":\"a\",\"gen\":\"9\"}";

static bool selects(const char *spec, const char *node, const char *labels)
{
	cJSON *s = cJSON_Parse(spec), *l = labels ? cJSON_Parse(labels) : NULL;
	assert_non_null(s);
	bool r = kube_affinity_selects(s, node, l);
	cJSON_Delete(s);
	cJSON_Delete(l);
	return r;
}

static bool set(const char *spec)
{
	cJSON *s = cJSON_Parse(spec);
	assert_non_null(s);
	bool r = kube_affinity_set(s);
	cJSON_Delete(s);
	return r;
}

#define TERMS(t)                                                                                   \
	"{\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":{"    \
	"\"nodeSelectorTerms\":" t "}}}}"

static void test_node_selector(void **state)
{
	(void)state;
	assert_true(selects("{}", "n1", NULL));
	assert_true(selects("{\"nodeSelector\":{\"gpu\":\"h100\"}}", "n1", labels_gpu));
	assert_true(
	    selects("{\"nodeSelector\":{\"gpu\":\"h100\",\"zone\":\"a\"}}", "n1", labels_gpu));
	assert_false(
	    selects("{\"nodeSelector\":{\"gpu\":\"h100\",\"zone\":\"b\"}}", "n1", labels_gpu));
	assert_false(selects("{\"nodeSelector\":{\"gpu\":\"h100\"}}", "n1", NULL));
	assert_false(selects("{\"nodeSelector\":{\"gpu\":\"a100\"}}", "n1", labels_gpu));
	assert_true(set("{\"nodeSelector\":{\"gpu\":\"h100\"}}"));
	assert_false(set("{\"nodeSelector\":{}}"));
	assert_false(set("{}"));
}

static void test_node_affinity(void **state)
{
	(void)state;
	const char *in = TERMS("[{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"In\","
	                       "\"values\":[\"a100\",\"h100\"]}]}]");
	assert_true(set(in));
	assert_true(selects(in, "n1", labels_gpu));
	assert_false(selects(in, "n1", "{\"gpu\":\"t4\"}"));
	/* any term selects; in a term, every requirement must hold */
	const char *two =
	    TERMS("[{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"DoesNotExist\"}]},"
	          "{\"matchExpressions\":[{\"key\":\"gen\",\"operator\":\"Gt\",\"values\":[\"8\"]},"
	          "{\"key\":\"zone\",\"operator\":\"NotIn\",\"values\":[\"b\"]}]}]");
	assert_true(selects(two, "n1", labels_gpu));
	assert_true(selects(two, "n1", "{}"));
	assert_false(selects(two, "n1", "{\"gpu\":\"x\",\"gen\":\"8\"}"));
	assert_false(selects(two, "n1", "{\"gpu\":\"x\",\"gen\":\"v9\"}"));
	const char *name =
	    TERMS("[{\"matchFields\":[{\"key\":\"metadata.name\",\"operator\":\"In\","
	          "\"values\":[\"n2\"]}]}]");
	assert_true(selects(name, "n2", NULL));
	assert_false(selects(name, "n1", labels_gpu));
	/* as Kubernetes: an empty term, no terms or an unknown operator select nothing */
	assert_false(selects(TERMS("[{}]"), "n1", labels_gpu));
	assert_false(selects(TERMS("[]"), "n1", labels_gpu));
	assert_false(
	    selects(TERMS("[{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"Like\"}]}]"),
	            "n1", labels_gpu));
	/* a nodeSelector and node affinity must both hold */
	assert_false(
	    selects("{\"nodeSelector\":{\"zone\":\"b\"},\"affinity\":{\"nodeAffinity\":{"
	            "\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":"
	            "[{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"Exists\"}]}]}}}}",
	            "n1", labels_gpu));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_node_selector),
	    cmocka_unit_test(test_node_affinity),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
