/* The placement webhook's catalog of caches: what it keeps of each object,
 * how an image volume's reference finds its cache, and objects it cannot use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_catalog.h"

#define D1 "sha256:1111111111111111111111111111111111111111111111111111111111111111"
#define D2 "sha256:2222222222222222222222222222222222222222222222222222222222222222"

static void put(struct cache_catalog *c, bool cluster, const char *json)
{
	cJSON *o = cJSON_Parse(json);
	assert_non_null(o);
	assert_int_equal(cache_catalog_put(c, cluster, o), 0);
	cJSON_Delete(o);
}

static void put_cache(struct cache_catalog *c, const char *ns, const char *name, const char *image,
                      const char *digest)
{
	char buf[1024];
	snprintf(buf, sizeof(buf),
	         "{\"metadata\":{\"name\":\"%s\",\"namespace\":\"%s\",\"uid\":\"u-%s\","
	         "\"annotations\":{\"gkm.io/resolvedDigest\":\"%s\"}},\"spec\":{\"image\":\"%s\"}}",
	         name, ns ? ns : "", name, digest, image);
	put(c, ns == NULL, buf);
}

static struct oci_ref ref_of(const char *s)
{
	struct oci_ref r;
	struct oci_err e;
	assert_int_equal(oci_ref_parse(s, &r, &e), 0);
	return r;
}

static void test_keeps_what_admission_needs(void **state)
{
	(void)state;
	struct cache_catalog c;
	cache_catalog_init(&c);
	put(&c, false,
	    "{\"metadata\":{\"name\":\"llama\",\"namespace\":\"team-a\",\"uid\":\"u1\"},"
	    "\"spec\":{\"image\":\"quay.io/org/llama:v1\"},\"status\":{\"resolvedDigest\":\"" D1
	    "\",\"readyNodes\":2,\"totalNodes\":3,\"conditions\":[{\"type\":\"Verified\","
	    "\"status\":\"False\"},{\"type\":\"Ready\",\"status\":\"True\"}]}}");
	const struct catalog_cache *e = cache_catalog_get(&c, "team-a", "llama");
	assert_non_null(e);
	assert_false(e->cluster);
	assert_string_equal(e->uid, "u1");
	assert_string_equal(e->repo, "quay.io/org/llama");
	assert_string_equal(e->digest, D1); /* from the status, no annotation */
	assert_int_equal(e->ready_nodes, 2);
	assert_int_equal(e->total_nodes, 3);
	assert_true(e->ready);
	assert_string_equal(e->label, "team-a.gkmcache.gkm.io/llama");
	assert_null(cache_catalog_get(&c, NULL, "llama")); /* not a ClusterGKMCache */
	assert_null(cache_catalog_get(&c, "team-b", "llama"));

	/* an update replaces it whole; the annotation wins over the status */
	put_cache(&c, "team-a", "llama", "quay.io/org/llama:v2", D2);
	e = cache_catalog_get(&c, "team-a", "llama");
	assert_string_equal(e->digest, D2);
	assert_int_equal(e->ready_nodes, 0);
	assert_false(e->ready);
	assert_int_equal(cache_catalog_len(&c), 1);

	put_cache(&c, NULL, "shared", "quay.io/org/shared@" D1, "");
	e = cache_catalog_get(&c, "", "shared");
	assert_non_null(e);
	assert_string_equal(e->digest, D1); /* the digest of spec.image */
	assert_string_equal(e->label, "clustergkmcache.gkm.io/shared");

	cJSON *gone = cJSON_Parse("{\"metadata\":{\"name\":\"llama\",\"namespace\":\"team-a\"}}");
	cache_catalog_remove(&c, false, gone);
	cJSON_Delete(gone);
	assert_null(cache_catalog_get(&c, "team-a", "llama"));
	assert_int_equal(cache_catalog_len(&c), 1);
	cache_catalog_clear(&c);
}

static void test_objects_it_cannot_use(void **state)
{
	(void)state;
	struct cache_catalog c;
	cache_catalog_init(&c);
	static const char *const unnamed[] = {
	    "{}", "{\"metadata\":{\"name\":7}}", "{\"metadata\":{\"namespace\":\"a\"}}",
	    "{\"metadata\":{\"name\":\"x\"}}", /* a GKMCache needs a namespace */
	};
	for (size_t i = 0; i < sizeof(unnamed) / sizeof(unnamed[0]); i++) {
		cJSON *o = cJSON_Parse(unnamed[i]);
		assert_int_equal(cache_catalog_put(&c, false, o), -EINVAL);
		cJSON_Delete(o);
	}
	/* odd fields are read as absent */
	put(&c, false,
	    "{\"metadata\":{\"name\":\"odd\",\"namespace\":\"a\",\"annotations\":{\"gkm.io/"
	    "resolvedDigest\":\"sha256:short\"}},\"spec\":{\"image\":\"NOT A REFERENCE\"},"
	    "\"status\":{\"readyNodes\":\"two\",\"totalNodes\":-4,\"conditions\":\"Ready\"}}");
	const struct catalog_cache *e = cache_catalog_get(&c, "a", "odd");
	assert_non_null(e);
	assert_null(e->repo);
	assert_string_equal(e->digest, "");
	assert_int_equal(e->ready_nodes, 0);
	assert_int_equal(e->total_nodes, 0);
	assert_false(e->ready);
	cache_catalog_clear(&c);
}

static void test_finds_the_cache_of_an_image(void **state)
{
	(void)state;
	struct cache_catalog c;
	cache_catalog_init(&c);
	put_cache(&c, "team-a", "b-v1", "quay.io/org/llama:v1", D1);
	put_cache(&c, "team-a", "a-v2", "quay.io/org/llama:v2", D2);
	put_cache(&c, "team-b", "theirs", "quay.io/org/mistral:v1", D1);
	put_cache(&c, NULL, "shared", "quay.io/org/mistral:v1", D1);
	put_cache(&c, NULL, "hub", "ubuntu", "");
	static const struct {
		const char *ns, *ref, *want;
	} cases[] = {
	    {"team-a", "quay.io/org/llama:v1", "team-a/b-v1"},     /* tag */
	    {"team-a", "quay.io/org/llama@" D2, "team-a/a-v2"},    /* digest */
	    {"team-a", "quay.io/org/llama:v9", "team-a/a-v2"},     /* repository only: by name */
	    {"team-a", "quay.io/org/mistral:v1", "shared"},        /* not team-b's */
	    {"team-b", "quay.io/org/mistral:v1", "team-b/theirs"}, /* its own first */
	    {"team-a", "docker.io/library/ubuntu:latest", "hub"},  /* Docker Hub's defaults */
	    {"team-a", "quay.io/org/other:v1", NULL},
	    {"team-a", "registry.example.com/org/llama:v1", NULL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct oci_ref r = ref_of(cases[i].ref);
		const struct catalog_cache *e = cache_catalog_find_image(&c, cases[i].ns, &r);
		if (!cases[i].want ? e != NULL : !e || strcmp(e->key, cases[i].want) != 0)
			fail_msg("%s in %s: got %s, want %s", cases[i].ref, cases[i].ns,
			         e ? e->key : "none", cases[i].want ? cases[i].want : "none");
		oci_ref_clear(&r);
	}
	cache_catalog_clear(&c);
}

/* The runtime's variables (spec.runtimeEnv over the webhook's annotation)
 * and the claim a cache makes. */
static void test_env_and_claims(void **state)
{
	(void)state;
	struct cache_catalog c;
	cache_catalog_init(&c);
	put(&c, false,
	    "{\"metadata\":{\"name\":\"a\",\"namespace\":\"team-a\",\"annotations\":{"
	    "\"gkm.io/runtime-env\":\"TRITON_CACHE_DIR=io.triton.cache\",\"gkm.io/"
	    "runtime-identity\":"
	    "\"{\\\"triton\\\":[\\\"3.2.0\\\"]}\"}},\"spec\":{\"image\":\"quay.io/o/"
	    "a:v1\",\"claim\":{}}}");
	put(&c, false,
	    "{\"metadata\":{\"name\":\"b\",\"namespace\":\"team-a\",\"annotations\":{"
	    "\"gkm.io/runtime-env\":\"TRITON_CACHE_DIR=io.triton.cache\"}},\"spec\":{\"image\":"
	    "\"quay.io/o/b:v1\",\"runtimeEnv\":{\"containers\":[\"server\"],\"variables\":["
	    "{\"name\":\"MINE\",\"subPath\":\"t\"},{\"name\":\"bad name\"}]}}}");
	put(&c, true,
	    "{\"metadata\":{\"name\":\"shared\"},\"spec\":{\"image\":\"quay.io/o/s:v1\","
	    "\"claim\":{\"namespace\":\"team-b\",\"name\":\"kernels\"}}}");
	put(&c, true, "{\"metadata\":{\"name\":\"nons\"},\"spec\":{\"claim\":{}}}");
	const struct catalog_cache *a = cache_catalog_get(&c, "team-a", "a");
	const struct catalog_cache *b = cache_catalog_get(&c, "team-a", "b");
	assert_true(a->env_known);
	assert_int_equal(a->nenv, 1);
	assert_string_equal(a->env[0].variable, "TRITON_CACHE_DIR");
	assert_null(a->env_containers);
	char *id = cJSON_PrintUnformatted(a->identity);
	assert_string_equal(id, "{\"triton\":[\"3.2.0\"]}");
	free(id);
	assert_true(b->env_known);
	assert_int_equal(b->nenv, 1); /* spec.runtimeEnv wins; a bad entry is left out */
	assert_string_equal(b->env[0].variable, "MINE");
	assert_string_equal(b->env_containers[0], "server");
	assert_null(b->env_containers[1]);
	assert_false(cache_catalog_get(&c, NULL, "shared")->env_known); /* not read yet */
	/* claims: a GKMCache's in its namespace, named as the cache by default */
	assert_ptr_equal(cache_catalog_find_claim(&c, "team-a", "a"), a);
	assert_null(cache_catalog_find_claim(&c, "team-a", "b"));
	assert_ptr_equal(cache_catalog_find_claim(&c, "team-b", "kernels"),
	                 cache_catalog_get(&c, NULL, "shared"));
	assert_null(cache_catalog_find_claim(&c, "team-a", "kernels"));
	assert_null(cache_catalog_find_claim(&c, "", "nons")); /* no namespace: no claim */
	cache_catalog_clear(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_env_and_claims),
	    cmocka_unit_test(test_keeps_what_admission_needs),
	    cmocka_unit_test(test_objects_it_cannot_use),
	    cmocka_unit_test(test_finds_the_cache_of_an_image),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
