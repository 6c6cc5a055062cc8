/* YAML <-> JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "yamljson.h"

static cJSON *parse_one(const char *y)
{
	cJSON *docs = NULL;
	char err[256];
	assert_int_equal(yamljson_parse(y, strlen(y), &docs, err, sizeof(err)), 0);
	assert_int_equal(cJSON_GetArraySize(docs), 1);
	cJSON *d = cJSON_DetachItemFromArray(docs, 0);
	cJSON_Delete(docs);
	return d;
}

static void test_scalars_and_structure(void **state)
{
	(void)state;
	cJSON *d =
	    parse_one("apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata:\n  name: c\n"
	              "  labels: {a: b}\nspec:\n  image: \"quay.io/x:1\"\n  n: 42\n  f: 1.5\n"
	              "  t: true\n  s: 'true'\n  z: ~\n  list:\n  - 1\n  - two\n");
	char *j = cJSON_PrintUnformatted(d);
	assert_string_equal(
	    j, "{\"apiVersion\":\"gkm.io/v1alpha1\",\"kind\":\"GKMCache\",\"metadata\":{"
	       "\"name\":\"c\",\"labels\":{\"a\":\"b\"}},\"spec\":{\"image\":\"quay.io/"
	       "x:1\",\"n\":42,\"f\":1.5,\"t\":true,\"s\":\"true\",\"z\":null,\"list\":[1,"
	       "\"two\"]}}");
	free(j);
	cJSON_Delete(d);
}

static void test_multi_documents_and_errors(void **state)
{
	(void)state;
	cJSON *docs = NULL;
	char err[256];
	const char *y = "---\na: 1\n---\n---\nb: 2\n";
	assert_int_equal(yamljson_parse(y, strlen(y), &docs, err, sizeof(err)), 0);
	assert_int_equal(cJSON_GetArraySize(docs), 2);
	cJSON_Delete(docs);
	const char *bad = "a: 1\n b: [\n";
	assert_int_equal(yamljson_parse(bad, strlen(bad), &docs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "line "));
	const char *dup = "a: 1\na: 2\n";
	assert_int_equal(yamljson_parse(dup, strlen(dup), &docs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "duplicate key 'a'"));
}

static void test_round_trip(void **state)
{
	(void)state;
	const char *src =
	    "{\"metadata\":{\"name\":\"n\",\"annotations\":{\"gkm.io/resolvedDigest\":"
	    "\"sha256:ab\"}},\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":"
	    "\"True\",\"message\":\"ready on 2 of 3 nodes: a, b\"}],\"empty\":[],\"o\":{},"
	    "\"n\":\"42\",\"yes\":\"true\",\"neg\":-3,\"nested\":[[1,2],{\"k\":[{\"x\":"
	    "\"- y\"}]}],\"blank\":\"\",\"colon\":\"a: b\"}}";
	cJSON *in = cJSON_Parse(src);
	char *y = yamljson_emit(in);
	assert_non_null(y);
	cJSON *back = parse_one(y);
	if (!cJSON_Compare(in, back, 1))
		fail_msg("round trip differs:\n%s", y);
	free(y);
	cJSON_Delete(in);
	cJSON_Delete(back);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_scalars_and_structure),
	    cmocka_unit_test(test_multi_documents_and_errors),
	    cmocka_unit_test(test_round_trip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
