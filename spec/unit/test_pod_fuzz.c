/* Fuzz-style: pods mutated at random (values of the wrong type, members
 * removed or doubled, deep nesting, long strings, the names the webhook looks
 * for put in odd places) through the placement webhook's reader and patch
 * builder, under the sanitizers. Every pod must get a clear answer: read and
 * patched (and the patch must apply to it), or refused with a message.
 * GKM_FUZZ_SEED and GKM_FUZZ_ROUNDS change the run (the seed is printed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission_review.h"
#include "jsonpatch.h"
#include "pod_patch.h"
#include "pod_volumes.h"

static const char *const seeds[] = {
    "{\"metadata\":{\"name\":\"p\",\"annotations\":{\"a\":\"b\"},\"labels\":{\"x\":\"y\"}},"
    "\"spec\":{\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
    "{\"nodeSelectorTerms\":[{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"In\","
    "\"values\":[\"h100\"]}]},{\"matchFields\":[]}]},\"preferredDuringSchedulingIgnoredDuring"
    "Execution\":[{\"weight\":5,\"preference\":{}}]}},\"volumes\":["
    "{\"name\":\"k\",\"csi\":{\"driver\":\"csi.gkm.io\",\"volumeAttributes\":{\"cacheName\":"
    "\"llama\",\"cacheNamespace\":\"team-a\"}}},"
    "{\"name\":\"i\",\"image\":{\"reference\":\"quay.io/org/cache:v1\"}},"
    "{\"name\":\"e\",\"emptyDir\":{}}]}}",
    "{\"metadata\":{\"generateName\":\"g-\"},\"spec\":{\"volumes\":[{\"name\":\"o\",\"csi\":"
    "{\"driver\":\"csi.gkm.io\",\"volumeAttributes\":{\"csi.gkm.io/GKMCache\":\"c\"}}}]}}",
    "{\"spec\":{}}",
};

static const char *const words[] = {
    "csi.gkm.io", "cacheName", "cacheNamespace", "csi.gkm.io/GKMCache", "team-a", "",      "Llama",
    "image",      "reference", "volumes",        "nodeAffinity",        "ready",  "a/b~c",
};

static uint64_t rng;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Every node of the tree, in document order. */
static size_t collect(cJSON *j, cJSON **out, size_t n, size_t cap)
{
	if (n < cap)
		out[n++] = j;
	for (cJSON *c = j->child; c; c = c->next)
		n = collect(c, out, n, cap);
	return n;
}

static cJSON *random_value(void)
{
	switch (next() % 9) {
	case 0:
		return cJSON_CreateNull();
	case 1:
		return cJSON_CreateBool(next() & 1);
	case 2:
		return cJSON_CreateNumber((double)(int64_t)next());
	case 3:
		return cJSON_CreateString(words[next() % (sizeof(words) / sizeof(words[0]))]);
	case 4:
		return cJSON_CreateArray();
	case 5:
		return cJSON_CreateObject();
	case 6: { /* deep nesting */
		cJSON *top = cJSON_CreateArray(), *cur = top;
		for (int i = 0; i < 300; i++) {
			cJSON *in = (i & 1) ? cJSON_CreateArray() : cJSON_CreateObject();
			if (cJSON_IsArray(cur))
				cJSON_AddItemToArray(cur, in);
			else
				cJSON_AddItemToObject(cur, "volumes", in);
			cur = in;
		}
		return top;
	}
	case 7: { /* long string */
		size_t n = 1 + next() % 9000;
		char *s = malloc(n + 1);
		memset(s, 'a' + (int)(next() % 26), n);
		s[n] = '\0';
		cJSON *v = cJSON_CreateString(s);
		free(s);
		return v;
	}
	default: { /* a copy of a volume that mounts a cache */
		cJSON *v = cJSON_Parse("{\"name\":\"z\",\"csi\":{\"driver\":\"csi.gkm.io\","
		                       "\"volumeAttributes\":{\"cacheName\":\"c\"}}}");
		return v;
	}
	}
}

static void mutate(cJSON *doc)
{
	cJSON *nodes[4096];
	size_t n = collect(doc, nodes, 0, sizeof(nodes) / sizeof(nodes[0]));
	cJSON *target = nodes[next() % n];
	if (target == doc)
		return;
	/* find the parent */
	cJSON *parent = NULL;
	for (size_t i = 0; i < n && !parent; i++)
		for (cJSON *c = nodes[i]->child; c; c = c->next)
			if (c == target)
				parent = nodes[i];
	switch (next() % 4) {
	case 0: { /* replace (an object member keeps its name, as parsed JSON has) */
		cJSON *v = random_value();
		if (cJSON_IsObject(parent) && target->string)
			v->string = strdup(target->string);
		cJSON_ReplaceItemViaPointer(parent, target, v);
		break;
	}
	case 1: /* remove */
		cJSON_Delete(cJSON_DetachItemViaPointer(parent, target));
		break;
	case 2: /* double */
		if (cJSON_IsArray(parent))
			cJSON_AddItemToArray(parent, cJSON_Duplicate(target, 1));
		else
			cJSON_AddItemToObject(parent, target->string, cJSON_Duplicate(target, 1));
		break;
	default: /* add a member or element */
		if (cJSON_IsArray(target))
			cJSON_AddItemToArray(target, random_value());
		else if (cJSON_IsObject(target))
			cJSON_AddItemToObject(target,
			                      words[next() % (sizeof(words) / sizeof(words[0]))],
			                      random_value());
	}
}

static unsigned long n_refused, n_patched, n_unchanged;

static void check_one(cJSON *pod, uint64_t round)
{
	struct pod_info p;
	char err[1024] = "";
	int rc = pod_info_read(pod, "team-a", &p, err, sizeof(err));
	if (rc != 0) {
		if (rc != -EINVAL || !err[0])
			fail_msg("round %llu: refused without a message (%d)",
			         (unsigned long long)round, rc);
		n_refused++;
		return;
	}
	struct pod_place pl[POD_CACHE_VOLUMES_MAX];
	struct pod_pin pins[POD_CACHE_VOLUMES_MAX];
	size_t npins = 0;
	for (size_t i = 0; i < p.n; i++) {
		pl[i].key = i % 2 ? "clustergkmcache.gkm.io/c" : "team-a.gkmcache.gkm.io/llama";
		pl[i].mode = (enum pod_place_mode)(next() % 3);
		pl[i].weight = 1 + (int)(next() % 100);
		if (p.vols[i].mount == POD_MOUNT_IMAGE)
			pins[npins++] =
			    (struct pod_pin){p.vols[i].index, "quay.io/org/cache@sha256:"
			                                      "2222222222222222222222222222"
			                                      "222222222222222222222222222222"
			                                      "222222"};
	}
	char *patch = NULL;
	rc = pod_patch_build(&p, pl, p.n, pins, npins, "gkm.io/placement", "[]", NULL, &patch, err,
	                     sizeof(err));
	if (rc != 0 && (rc != -EINVAL || !err[0]))
		fail_msg("round %llu: patch failed without a message (%d)",
		         (unsigned long long)round, rc);
	if (rc == 0 && patch && jsonpatch_apply(pod, patch) != 0)
		fail_msg("round %llu: the patch does not apply: %s", (unsigned long long)round,
		         patch);
	if (rc == 0)
		*(patch ? &n_patched : &n_unchanged) += 1;
	else
		n_refused++;
	free(patch);
	pod_info_clear(&p);
}

/* The same pod inside an AdmissionReview, through the envelope parser. */
static void check_envelope(const cJSON *pod)
{
	char *obj = cJSON_PrintUnformatted(pod), *body = NULL;
	if (!obj)
		return;
	assert_true(
	    asprintf(&body,
	             "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\","
	             "\"request\":{\"uid\":\"u\",\"kind\":{\"group\":\"\",\"version\":\"v1\","
	             "\"kind\":\"Pod\"},\"namespace\":\"team-a\",\"operation\":\"CREATE\","
	             "\"object\":%s}}",
	             obj) > 0);
	struct admission_request r;
	char err[512];
	if (admission_review_parse(body, strlen(body), &r, err, sizeof(err)) == 0) {
		assert_true(r.pod);
		admission_request_clear(&r);
	}
	free(body);
	free(obj);
}

static void test_mutated_pods(void **state)
{
	(void)state;
	const char *s = getenv("GKM_FUZZ_SEED"), *n = getenv("GKM_FUZZ_ROUNDS");
	rng = s ? strtoull(s, NULL, 0) : 0x9e3779b97f4a7c15ull;
	if (!rng)
		rng = 1;
	uint64_t rounds = n ? strtoull(n, NULL, 0) : 20000;
	printf("# seed 0x%llx, %llu rounds\n", (unsigned long long)rng, (unsigned long long)rounds);
	for (uint64_t i = 0; i < rounds; i++) {
		cJSON *pod = cJSON_Parse(seeds[i % (sizeof(seeds) / sizeof(seeds[0]))]);
		assert_non_null(pod);
		for (uint64_t k = 1 + next() % 4; k; k--)
			mutate(pod);
		check_one(pod, i);
		if (i % 16 == 0)
			check_envelope(pod);
		cJSON_Delete(pod);
	}
	printf("# %lu patched, %lu unchanged, %lu refused with a message\n", n_patched, n_unchanged,
	       n_refused);
	/* the mutations must leave both kinds of answer common, or they test little */
	assert_true(n_patched > rounds / 10 && n_refused > rounds / 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_mutated_pods),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
