/* The OCI parsers that read outside input: WWW-Authenticate challenges,
 * dockerconfigjson credentials and Secrets, manifests and indexes, index
 * platform selection, and the verifying blob reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oci_auth.h"
#include "oci_blob.h"
#include "oci_image.h"

#define D1 "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void test_challenges(void **state)
{
	(void)state;
	struct oci_challenge c = {0};
	struct oci_err e = {{0}};
	assert_int_equal(oci_challenge_parse("Bearer realm=\"https://auth.example/token\",service="
	                                     "\"reg.example\",scope=\"repository:a/b:pull,push\"",
	                                     &c, &e),
	                 0);
	assert_int_equal(c.scheme, OCI_AUTH_BEARER);
	assert_string_equal(c.realm, "https://auth.example/token");
	assert_string_equal(c.service, "reg.example");
	assert_string_equal(c.scope, "repository:a/b:pull,push");
	oci_challenge_clear(&c);
	/* several challenges in one header: Bearer wins; escapes in quoted strings */
	assert_int_equal(
	    oci_challenge_parse("Basic realm=\"x\", Bearer realm=\"https://a/t?x=\\\"y\\\"\","
	                        "error=\"insufficient_scope\"",
	                        &c, &e),
	    0);
	assert_int_equal(c.scheme, OCI_AUTH_BEARER);
	assert_string_equal(c.realm, "https://a/t?x=\"y\"");
	assert_string_equal(c.error, "insufficient_scope");
	oci_challenge_clear(&c);
	assert_int_equal(oci_challenge_parse("basic realm=Registry", &c, &e), 0);
	assert_int_equal(c.scheme, OCI_AUTH_BASIC);
	oci_challenge_clear(&c);
	assert_int_equal(oci_challenge_parse("Bearer service=\"x\"", &c, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "without a realm"));
	assert_int_equal(oci_challenge_parse("Negotiate abc==", &c, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "does not speak"));
	assert_int_equal(oci_challenge_parse("Bearer realm=\"unterminated", &c, &e), -EINVAL);
	assert_int_equal(oci_challenge_parse("", &c, &e), -EINVAL);
}

static void lookup_ok(const char *doc, const char *host, const char *user, const char *pass)
{
	struct oci_creds c = {0};
	struct oci_err e = {{0}};
	int rc = oci_creds_lookup(doc, strlen(doc), host, &c, &e);
	if (rc)
		fail_msg("lookup %s: %d %s", host, rc, e.msg);
	assert_string_equal(c.username, user);
	assert_string_equal(c.password, pass);
	oci_creds_clear(&c);
}

static void test_credentials(void **state)
{
	(void)state;
	/* "alice:pa:ss" -> a password may hold ':' */
	lookup_ok("{\"auths\":{\"reg.example:5000\":{\"auth\":\"YWxpY2U6cGE6c3M=\"}}}",
	          "reg.example:5000", "alice", "pa:ss");
	lookup_ok("{\"auths\":{\"https://index.docker.io/v1/\":{\"auth\":\"Ym9iOnB3\"}}}",
	          "docker.io", "bob", "pw");
	lookup_ok("{\"auths\":{\"quay.io\":{\"username\":\"u\",\"password\":\"p\"}}}", "quay.io",
	          "u", "p");
	lookup_ok("{\"quay.io\":{\"auth\":\"dTpw\"}}", "quay.io", "u", "p"); /* .dockercfg */
	/* read as Docker reads it: line breaks ignored, padding required */
	lookup_ok("{\"auths\":{\"r:1\":{\"auth\":\"YWxp\\r\\nY2U6cGE6c3M=\"}}}", "r:1", "alice",
	          "pa:ss");
	/* a Secret: data holds base64 of {"auths":{"r:1":{"auth":"dTpw"}}} */
	lookup_ok("{\"kind\":\"Secret\",\"type\":\"kubernetes.io/dockerconfigjson\",\"data\":{"
	          "\".dockerconfigjson\":\"eyJhdXRocyI6eyJyOjEiOnsiYXV0aCI6ImRUcHcifX19\"}}",
	          "r:1", "u", "p");
	lookup_ok("{\"kind\":\"Secret\",\"stringData\":{\".dockerconfigjson\":"
	          "\"{\\\"auths\\\":{\\\"r:1\\\":{\\\"auth\\\":\\\"dTpw\\\"}}}\"}}",
	          "r:1", "u", "p");
	struct oci_creds c = {0};
	struct oci_err e = {{0}};
	const char *other = "{\"auths\":{\"quay.io\":{\"auth\":\"dTpw\"}}}";
	assert_int_equal(oci_creds_lookup(other, strlen(other), "ghcr.io", &c, &e), -ENOENT);
	const char *bad = "{\"auths\":{\"quay.io\":{\"auth\":\"%%%\"}}}";
	assert_int_equal(oci_creds_lookup(bad, strlen(bad), "quay.io", &c, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "not base64"));
	const char *unpadded = "{\"auths\":{\"quay.io\":{\"auth\":\"YWxpY2U6cGE6c3M\"}}}";
	assert_int_equal(oci_creds_lookup(unpadded, strlen(unpadded), "quay.io", &c, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "not base64"));
	const char *nocolon = "{\"auths\":{\"quay.io\":{\"auth\":\"dXNlcg==\"}}}";
	assert_int_equal(oci_creds_lookup(nocolon, strlen(nocolon), "quay.io", &c, &e), -EINVAL);
	const char *secret = "{\"kind\":\"Secret\",\"data\":{\"other\":\"eA==\"}}";
	assert_int_equal(oci_creds_lookup(secret, strlen(secret), "quay.io", &c, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "no .dockerconfigjson"));
	assert_int_equal(oci_creds_lookup("[", 1, "quay.io", &c, &e), -EINVAL);
	const char *helper = "{\"auths\":{},\"credsStore\":\"desktop\"}";
	assert_int_equal(oci_creds_lookup(helper, strlen(helper), "quay.io", &c, &e), -ENOENT);
	assert_non_null(strstr(e.msg, "credential helpers are not supported"));
}

static void test_manifests(void **state)
{
	(void)state;
	struct oci_manifest m = {0};
	struct oci_err e = {{0}};
	const char *good =
	    "{\"schemaVersion\":2,\"mediaType\":\"" OCI_MT_MANIFEST "\","
	    "\"config\":{\"mediaType\":\"" OCI_MT_CONFIG "\",\"digest\":\"" D1 "\",\"size\":7},"
	    "\"layers\":[{\"mediaType\":\"" OCI_MT_LAYER_GZIP "\",\"digest\":\"" D1 "\","
	    "\"size\":42,\"annotations\":{\"k\":\"v\"}}],"
	    "\"subject\":{\"mediaType\":\"" OCI_MT_MANIFEST "\",\"digest\":\"" D1 "\",\"size\":1}}";
	assert_int_equal(oci_manifest_parse(good, strlen(good), NULL, &m, &e), 0);
	assert_int_equal(m.n_layers, 1);
	assert_int_equal(m.layers[0].size, 42);
	assert_string_equal(oci_desc_annotation(&m.layers[0], "k"), "v");
	assert_non_null(m.subject);
	/* building it again gives the same bytes */
	char *out = NULL;
	size_t len = 0;
	assert_int_equal(oci_manifest_build(&m, &out, &len), 0);
	assert_int_equal(len, strlen(good));
	assert_memory_equal(out, good, len);
	free(out);
	oci_manifest_clear(&m);
	struct {
		const char *doc, *msg;
	} bad[] = {
	    {"{\"schemaVersion\":1}", "schemaVersion is not 2"},
	    {"{\"schemaVersion\":2,\"config\":{\"mediaType\":\"x\",\"digest\":\"sha256:12\","
	     "\"size\":1},"
	     "\"layers\":[]}",
	     "invalid digest 'sha256:12'"},
	    {"{\"schemaVersion\":2,\"config\":{\"mediaType\":\"x\",\"digest\":\"" D1
	     "\",\"size\":-1},"
	     "\"layers\":[]}",
	     "invalid size"},
	    {"{\"schemaVersion\":2,\"config\":{\"mediaType\":\"x\",\"digest\":\"" D1
	     "\",\"size\":1.5},"
	     "\"layers\":[]}",
	     "invalid size"},
	    {"{\"schemaVersion\":2,\"config\":{\"mediaType\":\"x\",\"digest\":\"" D1
	     "\",\"size\":1}}",
	     "no layers array"},
	    {"{\"schemaVersion\":2,\"mediaType\":\"application/vnd.example\"}",
	     "unsupported manifest media type"},
	    {"{\"schemaVersion\":2} x", "trailing data"},
	    {"{\"schemaVersion\":2,", "not valid JSON"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&e, 0, sizeof(e));
		assert_int_equal(oci_manifest_parse(bad[i].doc, strlen(bad[i].doc), NULL, &m, &e),
		                 -EINVAL);
		if (!strstr(e.msg, bad[i].msg))
			fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, bad[i].msg);
	}
	assert_int_equal(oci_detect_kind(good, strlen(good), NULL), OCI_KIND_MANIFEST);
	assert_int_equal(oci_layer_compression(DOCKER_MT_LAYER_GZIP), OCI_COMP_GZIP);
	assert_int_equal(oci_layer_compression(OCI_MT_LAYER_ZSTD), OCI_COMP_ZSTD);
	assert_int_equal(oci_layer_compression("application/vnd.example"), OCI_COMP_UNKNOWN);
}

static void test_index_select(void **state)
{
	(void)state;
	const char *doc =
	    "{\"schemaVersion\":2,\"mediaType\":\"" OCI_MT_INDEX "\",\"manifests\":["
	    "{\"mediaType\":\"" OCI_MT_MANIFEST "\",\"digest\":\"" D1 "\",\"size\":1,"
	    "\"platform\":{\"os\":\"unknown\",\"architecture\":\"unknown\"}},"
	    "{\"mediaType\":\"" OCI_MT_MANIFEST "\",\"digest\":\"" D1 "\",\"size\":2,"
	    "\"platform\":{\"os\":\"linux\",\"architecture\":\"arm64\",\"variant\":\"v8\"}},"
	    "{\"mediaType\":\"" OCI_MT_MANIFEST "\",\"digest\":\"" D1 "\",\"size\":3,"
	    "\"platform\":{\"os\":\"linux\",\"architecture\":\"amd64\"}}]}";
	struct oci_index ix = {0};
	struct oci_err e = {{0}};
	size_t w = 99;
	assert_int_equal(oci_index_parse(doc, strlen(doc), NULL, &ix, &e), 0);
	assert_int_equal(oci_index_select(&ix, "linux", "amd64", NULL, &w, &e), 0);
	assert_int_equal(ix.manifests[w].size, 3);
	assert_int_equal(oci_index_select(&ix, "linux", "arm64", "v8", &w, &e), 0);
	assert_int_equal(ix.manifests[w].size, 2);
	assert_int_equal(oci_index_select(&ix, "linux", "s390x", NULL, &w, &e), -ENOENT);
	assert_non_null(strstr(e.msg, "no image for platform linux/s390x"));
	assert_non_null(strstr(e.msg, "linux/arm64/v8"));
	oci_index_clear(&ix);
}

/* A blob reader over a pipe holding data. */
static struct oci_blob_reader *reader_for(const char *data, size_t len, const char *digest,
                                          int64_t size)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	assert_int_equal(write(p[1], data, len), (ssize_t)len);
	close(p[1]);
	struct oci_blob_reader *r = NULL;
	assert_int_equal(oci_blob_reader_new(&oci_blob_fd_source, (void *)(intptr_t)p[0], digest,
	                                     size, "layer 0", &r),
	                 0);
	return r;
}

static void test_blob_reader(void **state)
{
	(void)state;
	const char *data = "hello, registry";
	char dg[OCI_DIGEST_MAX];
	assert_int_equal(oci_digest_buf(data, strlen(data), dg), 0);
	char *out = NULL;
	size_t len = 0;
	struct oci_err e = {{0}};
	assert_int_equal(oci_blob_slurp(reader_for(data, strlen(data), dg, (int64_t)strlen(data)),
	                                100, &out, &len, &e),
	                 0);
	assert_string_equal(out, data);
	free(out);
	/* tampered: same size, other bytes */
	struct oci_blob_reader *r = reader_for("hello, rEgistry", 15, dg, 15);
	assert_int_equal(oci_blob_drain(r), -EBADMSG);
	assert_non_null(strstr(oci_blob_error(r), "layer 0 digest mismatch: expected sha256:"));
	oci_blob_close(r);
	r = reader_for("hello, registry!!", 17, dg, 15);
	assert_int_equal(oci_blob_drain(r), -EFBIG);
	assert_non_null(strstr(oci_blob_error(r), "longer than the 15 bytes"));
	oci_blob_close(r);
	r = reader_for("hello", 5, dg, 15);
	assert_int_equal(oci_blob_drain(r), -EPIPE);
	assert_non_null(strstr(oci_blob_error(r), "truncated: got 5 of 15 bytes"));
	oci_blob_close(r);
	assert_int_equal(oci_blob_slurp(reader_for(data, strlen(data), dg, -1), 4, &out, &len, &e),
	                 -EFBIG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_challenges),  cmocka_unit_test(test_credentials),
	    cmocka_unit_test(test_manifests),   cmocka_unit_test(test_index_select),
	    cmocka_unit_test(test_blob_reader),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
