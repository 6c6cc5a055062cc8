/* Helpers on plain objects (objutil.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "objstore.h"

static void expect_dropped(const char *in, const char *want)
{
	cJSON *o = cJSON_Parse(in), *w = cJSON_Parse(want);
	assert_non_null(o);
	assert_non_null(w);
	obj_drop_empty_maps(o);
	char *got = cJSON_PrintUnformatted(o);
	if (!cJSON_Compare(o, w, 1))
		fail_msg("%s gave %s, want %s", in, got, want);
	free(got);
	cJSON_Delete(o);
	cJSON_Delete(w);
}

/* What the daemons apply: an empty map is left out at every depth, and a
 * map left with nothing but empty maps goes with them. */
static void test_drop_empty_maps(void **state)
{
	(void)state;
	expect_dropped("{\"status\":{\"failedNodeConditions\":{},\"totalNodes\":0}}",
	               "{\"status\":{\"totalNodes\":0}}");
	expect_dropped("{\"status\":{\"caches\":{}}}", "{}");
	expect_dropped("{\"a\":{\"b\":{\"c\":{}}},\"d\":\"\"}", "{\"d\":\"\"}");
	/* lists, empty strings, zeros and false are values, not empty maps */
	expect_dropped("{\"l\":[],\"s\":\"\",\"n\":0,\"f\":false,\"z\":null}",
	               "{\"l\":[],\"s\":\"\",\"n\":0,\"f\":false,\"z\":null}");
	/* inside list items the members go; the items stay */
	expect_dropped("{\"gpus\":[{\"ids\":[0],\"x\":{}},{}]}", "{\"gpus\":[{\"ids\":[0]},{}]}");
	expect_dropped("{\"caches\":{\"c1\":{\"state\":\"Ready\",\"m\":{}}}}",
	               "{\"caches\":{\"c1\":{\"state\":\"Ready\"}}}");
	obj_drop_empty_maps(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_drop_empty_maps),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
