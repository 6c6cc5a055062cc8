/* The placement webhook's reading of a Pod and the patch it answers with:
 * cache volumes in both attribute spellings and image volumes found, every
 * malformed pod refused with a message that says where, and the patch
 * applied (as the API server applies it) to check the pod a user gets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonpatch.h"
#include "pod_env.h"
#include "pod_patch.h"
#include "pod_volumes.h"

static const char pod_json[] =
    "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"vllm-0\","
    "\"namespace\":\"team-a\",\"annotations\":{\"a\":\"b\"}},"
    "\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"vllm\"}],\"volumes\":["
    "{\"name\":\"scratch\",\"emptyDir\":{}},"
    "{\"name\":\"kernels\",\"csi\":{\"driver\":\"csi.gkm.io\",\"volumeAttributes\":"
    "{\"cacheName\":\"llama\",\"cacheNamespace\":\"team-a\",\"readOnly\":\"false\"}}},"
    "{\"name\":\"old\",\"csi\":{\"driver\":\"csi.gkm.io\",\"volumeAttributes\":"
    "{\"csi.gkm.io/GKMCache\":\"mistral\",\"csi.gkm.io/namespace\":\"team-a\"}}},"
    "{\"name\":\"shared\",\"csi\":{\"driver\":\"csi.gkm.io\",\"volumeAttributes\":"
    "{\"cacheName\":\"shared\"}}},"
    "{\"name\":\"other\",\"csi\":{\"driver\":\"secrets-store.csi.k8s.io\"}},"
    "{\"name\":\"img\",\"image\":{\"reference\":\"quay.io/org/cache:v1\",\"pullPolicy\":"
    "\"IfNotPresent\"}},"
    "{\"name\":\"noref\",\"image\":{}}]}}";

static cJSON *parse(const char *s)
{
	cJSON *j = cJSON_Parse(s);
	assert_non_null(j);
	return j;
}

static void test_reads_cache_volumes(void **state)
{
	(void)state;
	cJSON *pod = parse(pod_json);
	struct pod_info p;
	char err[256] = "";
	assert_int_equal(pod_info_read(pod, "team-a", &p, err, sizeof(err)), 0);
	assert_int_equal(p.n, 4);
	assert_int_equal(p.vols[0].mount, POD_MOUNT_CSI);
	assert_string_equal(p.vols[0].name, "kernels");
	assert_int_equal(p.vols[0].index, 1);
	assert_string_equal(p.vols[0].cache_name, "llama");
	assert_string_equal(p.vols[0].cache_namespace, "team-a");
	assert_string_equal(p.vols[1].cache_name, "mistral"); /* the older spelling */
	assert_string_equal(p.vols[1].cache_namespace, "team-a");
	assert_string_equal(p.vols[2].cache_name, "shared");
	assert_string_equal(p.vols[2].cache_namespace, ""); /* a ClusterGKMCache */
	assert_int_equal(p.vols[3].mount, POD_MOUNT_IMAGE);
	assert_int_equal(p.vols[3].index, 5);
	assert_string_equal(p.vols[3].reference, "quay.io/org/cache:v1");
	assert_string_equal(p.name, "vllm-0");
	assert_non_null(p.annotations);
	assert_null(p.affinity);
	char who[128];
	pod_info_display(&p, who, sizeof(who));
	assert_string_equal(who, "team-a/vllm-0");
	pod_info_clear(&p);
	cJSON_Delete(pod);

	/* claims: any may be a cache's (the catalog tells); one without a name is not */
	pod =
	    parse("{\"spec\":{\"volumes\":[{\"name\":\"k\",\"persistentVolumeClaim\":"
	          "{\"claimName\":\"kernels\"}},{\"name\":\"e\",\"persistentVolumeClaim\":{}}]}}");
	assert_int_equal(pod_info_read(pod, "team-a", &p, err, sizeof(err)), 0);
	assert_int_equal(p.n, 1);
	assert_int_equal(p.vols[0].mount, POD_MOUNT_CLAIM);
	assert_string_equal(p.vols[0].claim, "kernels");
	pod_info_clear(&p);
	cJSON_Delete(pod);
	pod = parse("{\"spec\":{\"volumes\":[{\"name\":\"k\",\"persistentVolumeClaim\":"
	            "{\"claimName\":7}}]}}");
	assert_int_equal(pod_info_read(pod, "team-a", &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "claimName must be a string"));
	cJSON_Delete(pod);

	pod = parse("{\"metadata\":{\"generateName\":\"vllm-7d9-\"},\"spec\":{}}");
	assert_int_equal(pod_info_read(pod, "team-a", &p, err, sizeof(err)), 0);
	assert_int_equal(p.n, 0); /* no volumes at all */
	pod_info_display(&p, who, sizeof(who));
	assert_string_equal(who, "team-a/vllm-7d9-*");
	pod_info_clear(&p);
	cJSON_Delete(pod);
}

/* Each malformed pod is refused with a message naming the place. */
static void test_refuses_malformed_pods(void **state)
{
	(void)state;
	static const char *const cases[][2] = {
	    {"[]", "must be a Pod object"},
	    {"{\"metadata\":\"x\",\"spec\":{}}", "metadata must be an object"},
	    {"{\"metadata\":{\"annotations\":[]},\"spec\":{}}", "metadata.annotations must be"},
	    {"{\"metadata\":{\"name\":7},\"spec\":{}}", "metadata.name must be a string"},
	    {"{\"metadata\":{}}", "a Pod needs a spec"},
	    {"{\"spec\":[]}", "spec must be an object"},
	    {"{\"spec\":{\"affinity\":\"near\"}}", "spec.affinity must be an object"},
	    {"{\"spec\":{\"volumes\":\"kernels\"}}", "spec.volumes must be a list"},
	    {"{\"spec\":{\"volumes\":[7]}}", "spec.volumes[0] must be an object"},
	    {"{\"spec\":{\"volumes\":[{\"csi\":{}}]}}", "spec.volumes[0].name must be"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":true}]}}",
	     "spec.volumes[0] (k): csi must be an object"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":1}}]}}",
	     "spec.volumes[0] (k): csi.driver must be a string"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\","
	     "\"volumeAttributes\":[]}}]}}",
	     "csi.volumeAttributes must be an object"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\","
	     "\"volumeAttributes\":{\"cacheName\":5}}}]}}",
	     "volumeAttributes must be a map of strings"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\"}}]}}",
	     "needs volumeAttributes.cacheName"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\","
	     "\"volumeAttributes\":{\"cacheName\":\"Llama!\"}}}]}}",
	     "cacheName 'Llama!' is not a cache name"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\","
	     "\"volumeAttributes\":{\"cacheName\":\"l\",\"cacheNamespace\":\"Team\"}}}]}}",
	     "cacheNamespace 'Team' is not a namespace"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\","
	     "\"volumeAttributes\":{\"cacheName\":\"l\",\"cacheNamespace\":\"team-b\"}}}]}}",
	     "GKMCache team-b/l is in another namespace"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\","
	     "\"volumeAttributes\":{\"cacheName\":\"l\",\"csi.gkm.io/GKMCache\":\"m\"}}}]}}",
	     "named twice"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"image\":\"quay.io/x\"}]}}",
	     "spec.volumes[0] (k): image must be an object"},
	    {"{\"spec\":{\"volumes\":[{\"name\":\"k\",\"image\":{\"reference\":[]}}]}}",
	     "image.reference must be a string"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cJSON *pod = parse(cases[i][0]);
		struct pod_info p;
		char err[512] = "";
		if (pod_info_read(pod, "team-a", &p, err, sizeof(err)) != -EINVAL)
			fail_msg("%s: not refused", cases[i][0]);
		if (!strstr(err, cases[i][1]))
			fail_msg("%s: error '%s' does not say '%s'", cases[i][0], err, cases[i][1]);
		cJSON_Delete(pod);
	}
	struct pod_info p;
	char err[256] = "";
	cJSON *pod = parse("{\"spec\":{}}");
	assert_int_equal(pod_info_read(pod, "", &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "request.namespace"));
	cJSON_Delete(pod);
}

/* A pod with n volumes, each an emptyDir or (cache) a gkm CSI volume. */
static cJSON *pod_with_volumes(int n, bool cache)
{
	cJSON *pod = parse("{\"spec\":{\"volumes\":[]}}");
	cJSON *vols = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "volumes");
	for (int i = 0; i < n; i++) {
		char buf[200];
		snprintf(buf, sizeof(buf),
		         cache ? "{\"name\":\"v%d\",\"csi\":{\"driver\":\"csi.gkm.io\","
		                 "\"volumeAttributes\":{\"cacheName\":\"c%d\"}}}"
		               : "{\"name\":\"v%d\",\"emptyDir\":{}}",
		         i, i);
		cJSON_AddItemToArray(vols, parse(buf));
	}
	return pod;
}

static void test_bounds(void **state)
{
	(void)state;
	struct pod_info p;
	char err[256];
	cJSON *pod = pod_with_volumes(POD_VOLUMES_MAX, false);
	assert_int_equal(pod_info_read(pod, "ns", &p, err, sizeof(err)), 0);
	assert_int_equal(p.n, 0);
	pod_info_clear(&p);
	cJSON_Delete(pod);
	pod = pod_with_volumes(POD_VOLUMES_MAX + 1, false);
	assert_int_equal(pod_info_read(pod, "ns", &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "at most 1024"));
	cJSON_Delete(pod);
	pod = pod_with_volumes(POD_CACHE_VOLUMES_MAX, true);
	assert_int_equal(pod_info_read(pod, "ns", &p, err, sizeof(err)), 0);
	assert_int_equal(p.n, POD_CACHE_VOLUMES_MAX);
	pod_info_clear(&p);
	cJSON_Delete(pod);
	pod = pod_with_volumes(POD_CACHE_VOLUMES_MAX + 1, true);
	assert_int_equal(pod_info_read(pod, "ns", &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "more than 64 volumes"));
	cJSON_Delete(pod);
}

#define EXPR_FMT "{\"key\":\"%s\",\"operator\":\"In\",\"values\":[\"ready\"]}"

static char *affinity_text(const char *in, const struct pod_place *pl, size_t n)
{
	cJSON *a = in ? parse(in) : NULL, *out = NULL;
	char err[256] = "";
	int rc = pod_patch_affinity(a, pl, n, &out, err, sizeof(err));
	if (rc != 0)
		fail_msg("pod_patch_affinity: %d %s", rc, err);
	/* no change is answered with no object */
	char *s = out ? cJSON_PrintUnformatted(out) : strdup("unchanged");
	cJSON_Delete(a);
	cJSON_Delete(out);
	return s;
}

static void assert_json_equal(const char *got, const char *want)
{
	cJSON *g = parse(got), *w = parse(want);
	if (!cJSON_Compare(g, w, true))
		fail_msg("got  %s\nwant %s", got, want);
	cJSON_Delete(g);
	cJSON_Delete(w);
}

static void test_required_affinity(void **state)
{
	(void)state;
	struct pod_place two[] = {{"team-a.gkmcache.gkm.io/llama", POD_PLACE_REQUIRED, 0},
	                          {"clustergkmcache.gkm.io/shared", POD_PLACE_REQUIRED, 0}};
	char ea[128], eb[128], want[1024];
	snprintf(ea, sizeof(ea), EXPR_FMT, two[0].key);
	snprintf(eb, sizeof(eb), EXPR_FMT, two[1].key);
	/* no affinity: one new term with both caches */
	char *s = affinity_text(NULL, two, 2);
	snprintf(want, sizeof(want),
	         "{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
	         "{\"nodeSelectorTerms\":[{\"matchExpressions\":[%s,%s]}]}}}",
	         ea, eb);
	assert_json_equal(s, want);
	free(s);
	/* two terms (ORed by the scheduler): the caches are ANDed into each */
	s = affinity_text(
	    "{\"podAntiAffinity\":{},\"nodeAffinity\":{"
	    "\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":["
	    "{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"In\",\"values\":["
	    "\"h100\"]}]},{\"matchFields\":[{\"key\":\"metadata.name\",\"operator\":"
	    "\"In\",\"values\":[\"n1\"]}]}]}}}",
	    two, 1);
	snprintf(
	    want, sizeof(want),
	    "{\"podAntiAffinity\":{},\"nodeAffinity\":{"
	    "\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":["
	    "{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"In\",\"values\":[\"h100\"]},"
	    "%s]},{\"matchFields\":[{\"key\":\"metadata.name\",\"operator\":\"In\",\"values\":["
	    "\"n1\"]}],\"matchExpressions\":[%s]}]}}}",
	    ea, ea);
	assert_json_equal(s, want);
	free(s);
	/* the expression is there already: nothing added; an empty term list gets one term */
	snprintf(want, sizeof(want),
	         "{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
	         "{\"nodeSelectorTerms\":[{\"matchExpressions\":[%s]}]}}}",
	         ea);
	s = affinity_text(want, two, 1);
	assert_string_equal(s, "unchanged");
	free(s);
	s = affinity_text("{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
	                  "{\"nodeSelectorTerms\":[]}}}",
	                  two, 1);
	assert_json_equal(s, want);
	free(s);
}

static void test_preferred_affinity(void **state)
{
	(void)state;
	struct pod_place pl[] = {{"team-a.gkmcache.gkm.io/llama", POD_PLACE_PREFERRED, 60},
	                         {"clustergkmcache.gkm.io/x", POD_PLACE_NONE, 0}};
	char e[128], want[1024];
	snprintf(e, sizeof(e), EXPR_FMT, pl[0].key);
	snprintf(want, sizeof(want),
	         "{\"nodeAffinity\":{\"preferredDuringSchedulingIgnoredDuringExecution\":["
	         "{\"weight\":10,\"preference\":{\"matchExpressions\":[{\"key\":\"z\","
	         "\"operator\":\"Exists\"}]}},"
	         "{\"weight\":60,\"preference\":{\"matchExpressions\":[%s]}}]}}",
	         e);
	char *s = affinity_text("{\"nodeAffinity\":{\"preferredDuringSchedulingIgnoredDuring"
	                        "Execution\":[{\"weight\":10,\"preference\":{\"matchExpressions\":"
	                        "[{\"key\":\"z\",\"operator\":\"Exists\"}]}}]}}",
	                        pl, 2);
	assert_json_equal(s, want);
	char *again = affinity_text(s, pl, 2); /* reviewed twice: added once */
	assert_string_equal(again, "unchanged");
	free(again);
	free(s);
	/* mode none adds nothing, not even an empty nodeAffinity */
	s = affinity_text(NULL, pl + 1, 1);
	assert_string_equal(s, "unchanged");
	free(s);
}

static void test_affinity_of_the_wrong_shape(void **state)
{
	(void)state;
	struct pod_place r = {"k.gkmcache.gkm.io/c", POD_PLACE_REQUIRED, 0};
	struct pod_place p = {"k.gkmcache.gkm.io/c", POD_PLACE_PREFERRED, 1};
	const struct {
		const char *affinity;
		const struct pod_place *pl;
		const char *want;
	} cases[] = {
	    {"{\"nodeAffinity\":7}", &r, "spec.affinity.nodeAffinity must be an object"},
	    {"{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":[]}}", &r,
	     "requiredDuringSchedulingIgnoredDuringExecution must be an object"},
	    {"{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
	     "{\"nodeSelectorTerms\":{}}}}",
	     &r, "nodeSelectorTerms must be a list"},
	    {"{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
	     "{\"nodeSelectorTerms\":[\"x\"]}}}",
	     &r, "nodeSelectorTerms[0] must be an object"},
	    {"{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
	     "{\"nodeSelectorTerms\":[{\"matchExpressions\":5}]}}}",
	     &r, "matchExpressions must be a list"},
	    {"{\"nodeAffinity\":{\"preferredDuringSchedulingIgnoredDuringExecution\":{}}}", &p,
	     "preferredDuringSchedulingIgnoredDuringExecution must be a list"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cJSON *a = parse(cases[i].affinity), *out = NULL;
		char err[256] = "";
		assert_int_equal(pod_patch_affinity(a, cases[i].pl, 1, &out, err, sizeof(err)),
		                 -EINVAL);
		assert_null(out);
		if (!strstr(err, cases[i].want))
			fail_msg("%s: '%s' does not say '%s'", cases[i].affinity, err,
			         cases[i].want);
		cJSON_Delete(a);
	}
}

/* Build the patch for pod_text, apply it, and return the pod a user gets. */
static cJSON *patched(const char *pod_text, const struct pod_place *pl, size_t npl,
                      const struct pod_pin *pins, size_t npins, char **patch_out)
{
	cJSON *pod = parse(pod_text);
	struct pod_info p;
	char err[256] = "", *patch = NULL;
	assert_int_equal(pod_info_read(pod, "team-a", &p, err, sizeof(err)), 0);
	assert_int_equal(pod_patch_build(&p, pl, npl, pins, npins, "gkm.io/placement",
	                                 "[{\"volume\":\"kernels\"}]", NULL, &patch, err,
	                                 sizeof(err)),
	                 0);
	if (patch && jsonpatch_apply(pod, patch) != 0)
		fail_msg("the patch does not apply: %s", patch);
	pod_info_clear(&p);
	if (patch_out)
		*patch_out = patch;
	else
		free(patch);
	return pod;
}

static void test_patch_applies(void **state)
{
	(void)state;
	struct pod_place pl[] = {{"team-a.gkmcache.gkm.io/llama", POD_PLACE_REQUIRED, 0}};
	struct pod_pin pin = {5,
	                      "quay.io/org/cache:v1@sha256:"
	                      "1111111111111111111111111111111111111111111111111111111111111111"};
	char *patch = NULL;
	cJSON *pod = patched(pod_json, pl, 1, &pin, 1, &patch);
	assert_non_null(patch);
	const cJSON *an = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "annotations");
	assert_string_equal(cJSON_GetObjectItem(an, "gkm.io/placement")->valuestring,
	                    "[{\"volume\":\"kernels\"}]");
	assert_string_equal(cJSON_GetObjectItem(an, "a")->valuestring, "b"); /* kept */
	const cJSON *spec = cJSON_GetObjectItem(pod, "spec");
	const cJSON *img = cJSON_GetObjectItem(
	    cJSON_GetArrayItem(cJSON_GetObjectItem(spec, "volumes"), 5), "image");
	assert_string_equal(cJSON_GetObjectItem(img, "reference")->valuestring, pin.reference);
	assert_string_equal(cJSON_GetObjectItem(img, "pullPolicy")->valuestring, "IfNotPresent");
	const cJSON *term = cJSON_GetArrayItem(
	    cJSON_GetObjectItem(
	        cJSON_GetObjectItem(
	            cJSON_GetObjectItem(cJSON_GetObjectItem(spec, "affinity"), "nodeAffinity"),
	            "requiredDuringSchedulingIgnoredDuringExecution"),
	        "nodeSelectorTerms"),
	    0);
	assert_string_equal(
	    cJSON_GetObjectItem(
	        cJSON_GetArrayItem(cJSON_GetObjectItem(term, "matchExpressions"), 0), "key")
	        ->valuestring,
	    "team-a.gkmcache.gkm.io/llama");
	/* the pod as patched, reviewed again: nothing left to change */
	char *text = cJSON_PrintUnformatted(pod), *again = NULL;
	cJSON_Delete(patched(text, pl, 1, &pin, 1, &again));
	assert_null(again);
	free(text);
	free(patch);
	cJSON_Delete(pod);
}

static void test_annotation_without_annotations_or_metadata(void **state)
{
	(void)state;
	cJSON *pod = patched("{\"metadata\":{\"name\":\"p\"},\"spec\":{}}", NULL, 0, NULL, 0, NULL);
	const cJSON *an = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "annotations");
	assert_non_null(cJSON_GetObjectItem(an, "gkm.io/placement"));
	cJSON_Delete(pod);
	pod = patched("{\"spec\":{}}", NULL, 0, NULL, 0, NULL);
	an = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "annotations");
	assert_non_null(cJSON_GetObjectItem(an, "gkm.io/placement"));
	/* no placements: spec.affinity is not added */
	assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "affinity"));
	cJSON_Delete(pod);
}

static const char env_pod_json[] =
    "{\"spec\":{\"initContainers\":[{\"name\":\"warm\",\"volumeMounts\":["
    "{\"name\":\"kernels\",\"mountPath\":\"/cache/\"}]}],"
    "\"containers\":[{\"name\":\"server\",\"env\":[{\"name\":\"A\",\"value\":\"b\"}],"
    "\"volumeMounts\":[{\"name\":\"kernels\",\"mountPath\":\"/root/.triton\"}]},"
    "{\"name\":\"sidecar\",\"volumeMounts\":[{\"name\":\"scratch\",\"mountPath\":\"/s\"}]},"
    "{\"name\":\"own\",\"env\":[{\"name\":\"TRITON_CACHE_DIR\",\"value\":\"/tmp/t\"},"
    "{\"name\":\"VLLM_CACHE_ROOT\",\"valueFrom\":{\"configMapKeyRef\":{\"name\":\"c\","
    "\"key\":\"k\"}}}],"
    "\"volumeMounts\":[{\"name\":\"kernels\",\"mountPath\":\"/k\"}]}],"
    "\"volumes\":[{\"name\":\"kernels\",\"csi\":{\"driver\":\"csi.gkm.io\"}},"
    "{\"name\":\"scratch\",\"emptyDir\":{}}]}}";

static const char *env_of(const cJSON *pod, const char *list, int i, const char *var)
{
	const cJSON *c =
	    cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), list), i);
	const cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItem(c, "env"))
	{
		if (strcmp(cJSON_GetObjectItem(e, "name")->valuestring, var) == 0)
			return cJSON_IsString(cJSON_GetObjectItem(e, "value"))
			           ? cJSON_GetObjectItem(e, "value")->valuestring
			           : "(from)";
	}
	return NULL;
}

/* Every container mounting the cache gets the variables at its own
 * mountPath; one that sets them already keeps its value, with a warning. */
static void test_env_patch_applies(void **state)
{
	(void)state;
	struct cache_env_tree t[2] = {{"TRITON_CACHE_DIR", "io.triton.cache"},
	                              {"VLLM_CACHE_ROOT", "io.vllm.cache"}};
	struct pod_env_volume v = {"kernels", t, 2, NULL, false};
	cJSON *pod = parse(env_pod_json), *ops = cJSON_CreateArray();
	char warn[512];
	assert_int_equal(pod_env_patch(pod, &v, 1, ops, warn, sizeof(warn)), 0);
	assert_int_equal(cJSON_GetArraySize(ops), 2); /* warm and server; not sidecar, own */
	char *patch = cJSON_PrintUnformatted(ops);
	if (jsonpatch_apply(pod, patch) != 0)
		fail_msg("the patch does not apply: %s", patch);
	assert_string_equal(env_of(pod, "initContainers", 0, "TRITON_CACHE_DIR"),
	                    "/cache/io.triton.cache");
	assert_string_equal(env_of(pod, "containers", 0, "TRITON_CACHE_DIR"),
	                    "/root/.triton/io.triton.cache");
	assert_string_equal(env_of(pod, "containers", 0, "VLLM_CACHE_ROOT"),
	                    "/root/.triton/io.vllm.cache");
	assert_string_equal(env_of(pod, "containers", 0, "A"), "b"); /* kept */
	assert_null(env_of(pod, "containers", 1, "TRITON_CACHE_DIR"));
	assert_string_equal(env_of(pod, "containers", 2, "TRITON_CACHE_DIR"), "/tmp/t");
	assert_string_equal(env_of(pod, "containers", 2, "VLLM_CACHE_ROOT"), "(from)");
	assert_non_null(strstr(warn, "container own sets TRITON_CACHE_DIR to /tmp/t, so the "
	                             "cache mounted at /k/io.triton.cache will never be read"));
	assert_non_null(strstr(warn, "container own sets VLLM_CACHE_ROOT to (from a source)"));
	assert_true(v.conflict); /* the volume whose variables a container sets otherwise */
	/* the pod as patched, reviewed again: nothing left to change */
	cJSON_Delete(ops);
	ops = cJSON_CreateArray();
	assert_int_equal(pod_env_patch(pod, &v, 1, ops, warn, sizeof(warn)), 0);
	assert_int_equal(cJSON_GetArraySize(ops), 0);
	free(patch);
	cJSON_Delete(ops);
	cJSON_Delete(pod);
}

/* A mount with a subPath shows the trees inside it; a container list
 * limits who gets them. */
static void test_env_subpath_and_containers(void **state)
{
	(void)state;
	struct cache_env_tree t[2] = {{"TRITON_CACHE_DIR", "io.triton.cache"},
	                              {"VLLM_CACHE_ROOT", "io.vllm.cache"}};
	const char *only[] = {"b", NULL};
	cJSON *pod = parse("{\"spec\":{\"containers\":["
	                   "{\"name\":\"a\",\"volumeMounts\":[{\"name\":\"k\","
	                   "\"mountPath\":\"/t\",\"subPath\":\"io.triton.cache/\"}]},"
	                   "{\"name\":\"b\",\"volumeMounts\":[{\"name\":\"k\","
	                   "\"mountPath\":\"/\"}]},"
	                   "{\"name\":\"c\",\"volumeMounts\":[{\"name\":\"k\","
	                   "\"mountPath\":\"/x\",\"subPathExpr\":\"$(POD)\"}]}]}}");
	cJSON *ops = cJSON_CreateArray();
	char warn[256];
	struct pod_env_volume v = {"k", t, 2, NULL, false};
	assert_int_equal(pod_env_patch(pod, &v, 1, ops, warn, sizeof(warn)), 0);
	char *patch = cJSON_PrintUnformatted(ops);
	cJSON *copy = cJSON_Duplicate(pod, 1);
	if (jsonpatch_apply(copy, patch) != 0)
		fail_msg("the patch does not apply: %s", patch);
	/* a: only the Triton tree is inside its subPath, at the mountPath itself */
	assert_string_equal(env_of(copy, "containers", 0, "TRITON_CACHE_DIR"), "/t");
	assert_null(env_of(copy, "containers", 0, "VLLM_CACHE_ROOT"));
	/* b: mounted at / */
	assert_string_equal(env_of(copy, "containers", 1, "VLLM_CACHE_ROOT"), "/io.vllm.cache");
	/* c: where subPathExpr points is not known at admission */
	assert_null(env_of(copy, "containers", 2, "TRITON_CACHE_DIR"));
	assert_string_equal(warn, "");
	free(patch);
	cJSON_Delete(copy);
	cJSON_Delete(ops);
	/* only container b */
	v.containers = only;
	ops = cJSON_CreateArray();
	assert_int_equal(pod_env_patch(pod, &v, 1, ops, warn, sizeof(warn)), 0);
	assert_int_equal(cJSON_GetArraySize(ops), 1);
	assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ops, 0), "path")->valuestring,
	                    "/spec/containers/1/env");
	cJSON_Delete(ops);
	cJSON_Delete(pod);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_reads_cache_volumes),
	    cmocka_unit_test(test_refuses_malformed_pods),
	    cmocka_unit_test(test_bounds),
	    cmocka_unit_test(test_required_affinity),
	    cmocka_unit_test(test_preferred_affinity),
	    cmocka_unit_test(test_affinity_of_the_wrong_shape),
	    cmocka_unit_test(test_patch_applies),
	    cmocka_unit_test(test_annotation_without_annotations_or_metadata),
	    cmocka_unit_test(test_env_patch_applies),
	    cmocka_unit_test(test_env_subpath_and_containers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
