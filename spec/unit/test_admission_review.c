/* AdmissionReview v1 parsing and response building, with malformed input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission_review.h"

static const char review_fmt[] =
    "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{"
    "\"uid\":\"705ab4f5-6393-11e8-b7cc-42010a800002\","
    "\"kind\":{\"group\":\"gkm.io\",\"version\":\"v1alpha1\",\"kind\":\"%s\"},"
    "\"resource\":{\"group\":\"gkm.io\",\"version\":\"v1alpha1\",\"resource\":\"gkmcaches\"},"
    "\"namespace\":\"team-a\",\"name\":\"llama\",\"operation\":\"%s\","
    "\"object\":%s,\"oldObject\":%s}}";

static const char obj_plain[] = "{\"apiVersion\":\"gkm.io/v1alpha1\",\"kind\":\"GKMCache\","
                                "\"metadata\":{\"name\":\"llama\",\"namespace\":\"team-a\"},"
                                "\"spec\":{\"image\":\"quay.io/org/cache:v1\"}}";
static const char obj_annotated[] =
    "{\"metadata\":{\"name\":\"llama\",\"annotations\":{\"a\":\"b\","
    "\"gkm.io/resolvedDigest\":\"sha256:1111111111111111111111111111111111111111111111111111111"
    "111111111\"}},\"spec\":{\"image\":\"quay.io/org/cache:v2\"}}";

static char *review(const char *kind, const char *op, const char *obj, const char *old)
{
	char *s = NULL;
	assert_true(asprintf(&s, review_fmt, kind, op, obj, old) > 0);
	return s;
}

/* Parse must fail with -EPROTO and a message containing want. */
static void expect_envelope_error(const char *body, const char *want)
{
	struct admission_request r;
	char err[256] = "";
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), -EPROTO);
	if (!strstr(err, want))
		fail_msg("error '%s' does not mention '%s'", err, want);
}

static void test_envelope_errors(void **state)
{
	(void)state;
	expect_envelope_error("", "empty request body");
	expect_envelope_error("{", "not valid JSON");
	expect_envelope_error("not json at all", "not valid JSON");
	expect_envelope_error("[1,2]", "not a JSON object");
	expect_envelope_error("{\"kind\":\"Pod\",\"apiVersion\":\"v1\"}", "want AdmissionReview");
	expect_envelope_error("{\"kind\":\"AdmissionReview\",\"apiVersion\":"
	                      "\"admission.k8s.io/v1beta1\",\"request\":{\"uid\":\"x\"}}",
	                      "want admission.k8s.io/v1");
	expect_envelope_error(
	    "{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\"}",
	    "no request object");
	expect_envelope_error(
	    "{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\","
	    "\"request\":[]}",
	    "no request object");
	expect_envelope_error(
	    "{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\","
	    "\"request\":{\"operation\":\"CREATE\"}}",
	    "request.uid");
	expect_envelope_error(
	    "{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\","
	    "\"request\":{\"uid\":42,\"operation\":\"CREATE\"}}",
	    "request.uid");
	expect_envelope_error(
	    "{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\","
	    "\"request\":{\"uid\":\"a\",\"operation\":\"PATCH\"}}",
	    "'PATCH' is not CREATE");
	expect_envelope_error(
	    "{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\","
	    "\"request\":{\"uid\":\"a\",\"operation\":\"CREATE\",\"kind\":"
	    "{\"kind\":7}}}",
	    "must be strings");
	char big[ADMISSION_UID_MAX + 200];
	int n = snprintf(big, sizeof(big),
	                 "{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\","
	                 "\"request\":{\"operation\":\"CREATE\",\"uid\":\"");
	memset(big + n, 'u', ADMISSION_UID_MAX + 1);
	snprintf(big + n + ADMISSION_UID_MAX + 1, sizeof(big) - (size_t)n - ADMISSION_UID_MAX - 1,
	         "\"}}");
	expect_envelope_error(big, "at most 128 bytes");
	/* a body over the limit is refused before parsing */
	struct admission_request r;
	char err[128];
	assert_int_equal(
	    admission_review_parse("{}", ADMISSION_MAX_BYTES + 1, &r, err, sizeof(err)), -EPROTO);
	assert_non_null(strstr(err, "exceeds"));
}

static void test_every_truncation_is_refused(void **state)
{
	(void)state;
	char *body = review("GKMCache", "CREATE", obj_plain, "null");
	size_t n = strlen(body);
	for (size_t i = 0; i < n; i++) {
		struct admission_request r;
		char err[256];
		assert_int_equal(admission_review_parse(body, i, &r, err, sizeof(err)), -EPROTO);
	}
	struct admission_request r;
	char err[256];
	assert_int_equal(admission_review_parse(body, n, &r, err, sizeof(err)), 0);
	admission_request_clear(&r);
	free(body);
}

static void test_create_parsed(void **state)
{
	(void)state;
	char *body = review("GKMCache", "CREATE", obj_plain, "null");
	struct admission_request r;
	char err[256];
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), 0);
	assert_string_equal(r.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
	assert_int_equal(r.op, ADMISSION_CREATE);
	assert_true(r.ours);
	assert_string_equal(r.kind, "GKMCache");
	assert_string_equal(r.namespace_, "team-a");
	assert_string_equal(r.name, "llama");
	assert_int_equal(admission_request_check(&r, err, sizeof(err)), 0);
	assert_string_equal(r.image, "quay.io/org/cache:v1");
	assert_null(r.old_image);
	assert_null(r.annotations);
	assert_null(r.digest_annotation);
	assert_true(r.has_metadata);
	admission_request_clear(&r);
	free(body);
}

static void expect_kind(const char *kind, const char *op, const char *group, const char *sub,
                        bool want_ours, bool want_pod)
{
	char *body = NULL;
	assert_true(asprintf(&body,
	                     "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\","
	                     "\"request\":{\"uid\":\"u\",\"operation\":\"%s\",\"kind\":{\"group\":"
	                     "\"%s\",\"kind\":\"%s\"},\"subResource\":\"%s\"}}",
	                     op, group, kind, sub) > 0);
	struct admission_request r;
	char err[256];
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), 0);
	if (r.ours != want_ours || r.pod != want_pod)
		fail_msg("%s %s %s/%s: ours=%d pod=%d", op, group, kind, sub, r.ours, r.pod);
	admission_request_clear(&r);
	free(body);
}

/* ours: a cache review /mutate and /validate decide; pod: one /mutate-pods decides. */
static void expect_ours(const char *kind, const char *op, const char *group, const char *sub,
                        bool want)
{
	expect_kind(kind, op, group, sub, want, false);
}

static void expect_pod(const char *op, const char *group, const char *sub, bool want)
{
	expect_kind("Pod", op, group, sub, false, want);
}

static void test_which_reviews_are_ours(void **state)
{
	(void)state;
	expect_ours("GKMCache", "CREATE", "gkm.io", "", true);
	expect_ours("ClusterGKMCache", "UPDATE", "gkm.io", "", true);
	expect_ours("GKMCache", "DELETE", "gkm.io", "", false);
	expect_ours("GKMCache", "UPDATE", "gkm.io", "status", false);
	expect_ours("GKMCacheNode", "CREATE", "gkm.io", "", false);
	expect_ours("GKMCache", "CREATE", "evil.io", "", false);
	expect_pod("CREATE", "", "", true);
	expect_pod("UPDATE", "", "", false); /* volumes and affinity are fixed at creation */
	expect_pod("CREATE", "", "binding", false);
	expect_pod("CREATE", "evil.io", "", false);
}

/* admission_request_check must fail with -EINVAL and a message containing want. */
static void expect_object_error(const char *obj, const char *want)
{
	char *body = review("GKMCache", "CREATE", obj, "null");
	struct admission_request r;
	char err[256] = "";
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), 0);
	assert_int_equal(admission_request_check(&r, err, sizeof(err)), -EINVAL);
	if (!strstr(err, want))
		fail_msg("error '%s' does not mention '%s' (object %s)", err, want, obj);
	admission_request_clear(&r);
	free(body);
}

static void test_object_errors(void **state)
{
	(void)state;
	expect_object_error("null", "request.object is missing");
	expect_object_error("\"x\"", "request.object is missing");
	expect_object_error("{\"metadata\":{}}", "spec is required");
	expect_object_error("{\"spec\":[]}", "spec is required");
	expect_object_error("{\"spec\":{}}", "spec.image is required");
	expect_object_error("{\"spec\":{\"image\":null}}", "spec.image is required");
	expect_object_error("{\"spec\":{\"image\":42}}", "spec.image must be a string");
	expect_object_error("{\"spec\":{\"image\":\"\"}}", "spec.image is empty");
	expect_object_error("{\"metadata\":7,\"spec\":{\"image\":\"a\"}}",
	                    "metadata is not an object");
	expect_object_error("{\"metadata\":{\"annotations\":[]},\"spec\":{\"image\":\"a\"}}",
	                    "annotations is not an object");
	expect_object_error("{\"metadata\":{\"annotations\":{\"gkm.io/"
	                    "resolvedDigest\":1}},\"spec\":{\"image\":\"a\"}}",
	                    "must be a string");
	char *obj = malloc(ADMISSION_IMAGE_MAX + 64);
	assert_non_null(obj);
	int n = snprintf(obj, 64, "{\"spec\":{\"image\":\"");
	memset(obj + n, 'a', ADMISSION_IMAGE_MAX + 1);
	memcpy(obj + n + ADMISSION_IMAGE_MAX + 1, "\"}}", 4);
	expect_object_error(obj, "longer than 4096");
	free(obj);
}

static void test_update_reads_old_object(void **state)
{
	(void)state;
	char *body = review("ClusterGKMCache", "UPDATE", obj_plain, obj_annotated);
	struct admission_request r;
	char err[256];
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), 0);
	assert_int_equal(admission_request_check(&r, err, sizeof(err)), 0);
	assert_string_equal(r.image, "quay.io/org/cache:v1");
	assert_string_equal(r.old_image, "quay.io/org/cache:v2");
	assert_non_null(r.old_digest_annotation);
	assert_null(r.digest_annotation);
	admission_request_clear(&r);
	free(body);
	/* a broken old object is treated as having no image, not as an error */
	body = review("GKMCache", "UPDATE", obj_plain, "{\"spec\":7}");
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), 0);
	assert_int_equal(admission_request_check(&r, err, sizeof(err)), 0);
	assert_null(r.old_image);
	admission_request_clear(&r);
	free(body);
	body = review("GKMCache", "UPDATE", obj_plain, "[1]");
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), 0);
	assert_int_equal(admission_request_check(&r, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "oldObject is not an object"));
	admission_request_clear(&r);
	free(body);
}

static char *patch_for(const char *obj, const char *digest, const char *env)
{
	char *body = review("GKMCache", "CREATE", obj, "null");
	struct admission_request r;
	char err[256];
	char *patch = NULL;
	assert_int_equal(admission_review_parse(body, strlen(body), &r, err, sizeof(err)), 0);
	assert_int_equal(admission_request_check(&r, err, sizeof(err)), 0);
	const struct admission_annotation a[] = {{ADMISSION_ANNOTATION_DIGEST, digest},
	                                         {"gkm.io/runtime-env", env}};
	assert_int_equal(admission_patch_annotations(&r, a, env ? 2 : 1, &patch), 0);
	admission_request_clear(&r);
	free(body);
	return patch;
}

static void test_patches(void **state)
{
	(void)state;
	const char *d = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
	char *p = patch_for(obj_plain, d, NULL);
	char want[512];
	snprintf(want, sizeof(want),
	         "[{\"op\":\"add\",\"path\":\"/metadata/annotations\",\"value\":"
	         "{\"gkm.io/resolvedDigest\":\"%s\"}}]",
	         d);
	assert_string_equal(p, want);
	free(p);
	p = patch_for(obj_annotated, d, NULL);
	snprintf(want, sizeof(want),
	         "[{\"op\":\"add\",\"path\":\"/metadata/annotations/gkm.io~1resolvedDigest\","
	         "\"value\":\"%s\"}]",
	         d);
	assert_string_equal(p, want);
	free(p);
	p = patch_for("{\"spec\":{\"image\":\"x\"}}", d, NULL);
	snprintf(want, sizeof(want),
	         "[{\"op\":\"add\",\"path\":\"/metadata\",\"value\":{\"annotations\":"
	         "{\"gkm.io/resolvedDigest\":\"%s\"}}}]",
	         d);
	assert_string_equal(p, want);
	free(p);
	/* already right: nothing to patch */
	p = patch_for(obj_annotated,
	              "sha256:1111111111111111111111111111111111111111111111111111111111111111",
	              NULL);
	assert_null(p);
	/* two annotations: one operation makes both, or one per key that differs */
	p = patch_for(obj_plain, d, "TRITON_CACHE_DIR=io.triton.cache");
	snprintf(want, sizeof(want),
	         "[{\"op\":\"add\",\"path\":\"/metadata/annotations\",\"value\":"
	         "{\"gkm.io/resolvedDigest\":\"%s\",\"gkm.io/runtime-env\":"
	         "\"TRITON_CACHE_DIR=io.triton.cache\"}}]",
	         d);
	assert_string_equal(p, want);
	free(p);
	p = patch_for(obj_annotated,
	              "sha256:1111111111111111111111111111111111111111111111111111111111111111",
	              "");
	assert_string_equal(p, "[{\"op\":\"add\",\"path\":\"/metadata/annotations/"
	                       "gkm.io~1runtime-env\",\"value\":\"\"}]");
	free(p);
}

static char *b64_decode(const char *s)
{
	size_t n = strlen(s);
	unsigned char *out = calloc(1, n + 1);
	assert_non_null(out);
	int len = EVP_DecodeBlock(out, (const unsigned char *)s, (int)n);
	assert_true(len >= 0);
	while (n && s[n - 1] == '=') { /* DecodeBlock counts padding as zero bytes */
		n--;
		len--;
	}
	out[len] = '\0';
	return (char *)out;
}

static void test_responses(void **state)
{
	(void)state;
	char *out = NULL;
	size_t len = 0;
	const char *patch = "[{\"op\":\"add\",\"path\":\"/metadata/annotations\",\"value\":{}}]";
	struct admission_response ok = {.uid = "u-1", .allowed = true, .patch = patch};
	assert_int_equal(admission_response_build(&ok, &out, &len), 0);
	assert_int_equal(len, strlen(out));
	cJSON *doc = cJSON_Parse(out);
	assert_non_null(doc);
	assert_string_equal(cJSON_GetObjectItem(doc, "apiVersion")->valuestring,
	                    "admission.k8s.io/v1");
	assert_string_equal(cJSON_GetObjectItem(doc, "kind")->valuestring, "AdmissionReview");
	cJSON *resp = cJSON_GetObjectItem(doc, "response");
	assert_string_equal(cJSON_GetObjectItem(resp, "uid")->valuestring, "u-1");
	assert_true(cJSON_IsTrue(cJSON_GetObjectItem(resp, "allowed")));
	assert_string_equal(cJSON_GetObjectItem(resp, "patchType")->valuestring, "JSONPatch");
	char *decoded = b64_decode(cJSON_GetObjectItem(resp, "patch")->valuestring);
	assert_string_equal(decoded, patch);
	assert_null(cJSON_GetObjectItem(resp, "status"));
	free(decoded);
	cJSON_Delete(doc);
	free(out);

	struct admission_response no = {.uid = "u-2",
	                                .reason = "SignatureNotTrusted",
	                                .message = "no signature \"verifies\"",
	                                .warning = "w",
	                                .patch = patch};
	assert_int_equal(admission_response_build(&no, &out, &len), 0);
	doc = cJSON_Parse(out);
	assert_non_null(doc);
	resp = cJSON_GetObjectItem(doc, "response");
	assert_true(cJSON_IsFalse(cJSON_GetObjectItem(resp, "allowed")));
	assert_null(cJSON_GetObjectItem(resp, "patch")); /* a denial never patches */
	cJSON *st = cJSON_GetObjectItem(resp, "status");
	assert_int_equal(cJSON_GetObjectItem(st, "code")->valueint, 403);
	assert_string_equal(cJSON_GetObjectItem(st, "reason")->valuestring, "SignatureNotTrusted");
	assert_string_equal(cJSON_GetObjectItem(st, "message")->valuestring,
	                    "SignatureNotTrusted: no signature \"verifies\"");
	assert_string_equal(
	    cJSON_GetArrayItem(cJSON_GetObjectItem(resp, "warnings"), 0)->valuestring, "w");
	cJSON_Delete(doc);
	free(out);

	/* several warnings, empty ones left out; none at all: no warnings member */
	const char *const more[] = {"", "second", "third"};
	struct admission_response many = {
	    .uid = "u-4", .allowed = true, .warning = "first", .warnings = more, .nwarnings = 3};
	assert_int_equal(admission_response_build(&many, &out, &len), 0);
	doc = cJSON_Parse(out);
	cJSON *ws = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "response"), "warnings");
	assert_int_equal(cJSON_GetArraySize(ws), 3);
	assert_string_equal(cJSON_GetArrayItem(ws, 0)->valuestring, "first");
	assert_string_equal(cJSON_GetArrayItem(ws, 2)->valuestring, "third");
	cJSON_Delete(doc);
	free(out);
	struct admission_response quiet = {
	    .uid = "u-5", .allowed = true, .warning = "", .warnings = more, .nwarnings = 1};
	assert_int_equal(admission_response_build(&quiet, &out, &len), 0);
	assert_null(strstr(out, "warnings"));
	free(out);

	struct admission_response bare = {.uid = "u-3", .code = 500};
	assert_int_equal(admission_response_build(&bare, &out, &len), 0);
	assert_non_null(strstr(out, "\"code\":500"));
	assert_non_null(strstr(out, "Forbidden: denied by policy"));
	free(out);

	struct admission_response nouid = {.allowed = true};
	out = NULL;
	assert_int_equal(admission_response_build(&nouid, &out, &len), -EINVAL);
	assert_null(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_envelope_errors),
	    cmocka_unit_test(test_every_truncation_is_refused),
	    cmocka_unit_test(test_create_parsed),
	    cmocka_unit_test(test_which_reviews_are_ours),
	    cmocka_unit_test(test_object_errors),
	    cmocka_unit_test(test_update_reads_old_object),
	    cmocka_unit_test(test_patches),
	    cmocka_unit_test(test_responses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
