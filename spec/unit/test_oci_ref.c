/* Image reference grammar: defaults, ports, IPv6, digests, layouts, and the
 * error text each malformed reference gets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "oci_ref.h"

#define D64 "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void expect_ref(const char *in, const char *reg, const char *repo, const char *tag,
                       const char *digest, const char *canon)
{
	struct oci_ref r;
	struct oci_err e = {{0}};
	int rc = oci_ref_parse(in, &r, &e);
	if (rc)
		fail_msg("parse '%s': %s", in, e.msg);
	assert_int_equal(r.kind, OCI_REF_REGISTRY);
	assert_string_equal(r.registry, reg);
	assert_string_equal(r.repository, repo);
	if (tag)
		assert_string_equal(r.tag, tag);
	else
		assert_null(r.tag);
	if (digest)
		assert_string_equal(r.digest, digest);
	else
		assert_null(r.digest);
	char *s = oci_ref_format(&r);
	assert_string_equal(s, canon);
	free(s);
	oci_ref_clear(&r);
}

static void expect_bad(const char *in, const char *want_in_msg)
{
	struct oci_ref r = {0};
	struct oci_err e = {{0}};
	assert_int_equal(oci_ref_parse(in, &r, &e), -EINVAL);
	if (!strstr(e.msg, want_in_msg))
		fail_msg("'%s': message '%s' lacks '%s'", in, e.msg, want_in_msg);
	assert_null(r.registry);
}

static void test_docker_hub_defaults(void **state)
{
	(void)state;
	expect_ref("ubuntu", "docker.io", "library/ubuntu", "latest", NULL,
	           "docker.io/library/ubuntu:latest");
	expect_ref("org/cache:v1", "docker.io", "org/cache", "v1", NULL, "docker.io/org/cache:v1");
	expect_ref("docker.io/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", NULL,
	           "docker.io/library/ubuntu:22.04");
	expect_ref("index.docker.io/library/busybox", "docker.io", "library/busybox", "latest",
	           NULL, "docker.io/library/busybox:latest");
	expect_ref("docker://quay.io/x/y:z", "quay.io", "x/y", "z", NULL, "quay.io/x/y:z");
	/* no dot, no port, not localhost: a path, not a host */
	expect_ref("localhostx/a", "docker.io", "localhostx/a", "latest", NULL,
	           "docker.io/localhostx/a:latest");
	/* like docker: "localhost:5000" alone is repository localhost, tag 5000 */
	expect_ref("localhost:5000", "docker.io", "library/localhost", "5000", NULL,
	           "docker.io/library/localhost:5000");
	struct oci_ref r;
	assert_int_equal(oci_ref_parse("ubuntu", &r, NULL), 0);
	assert_string_equal(oci_ref_api_host(&r), "registry-1.docker.io");
	oci_ref_clear(&r);
}

static void test_hosts_ports_digests(void **state)
{
	(void)state;
	expect_ref("127.0.0.1:5000/caches/triton:v2", "127.0.0.1:5000", "caches/triton", "v2", NULL,
	           "127.0.0.1:5000/caches/triton:v2");
	expect_ref("localhost/a/b/c", "localhost", "a/b/c", "latest", NULL,
	           "localhost/a/b/c:latest");
	expect_ref("localhost:5000/a@" D64, "localhost:5000", "a", NULL, D64,
	           "localhost:5000/a@" D64);
	expect_ref("[::1]:5000/a-b__c.d:t@" D64, "[::1]:5000", "a-b__c.d", "t", D64,
	           "[::1]:5000/a-b__c.d:t@" D64);
	expect_ref("Registry.Example.COM/x", "Registry.Example.COM", "x", "latest", NULL,
	           "Registry.Example.COM/x:latest");
	expect_ref("ghcr.io/o/n:_tag.with-dots", "ghcr.io", "o/n", "_tag.with-dots", NULL,
	           "ghcr.io/o/n:_tag.with-dots");
	struct oci_ref r;
	assert_int_equal(oci_ref_parse("quay.io/a:b@" D64, &r, NULL), 0);
	assert_string_equal(oci_ref_reference(&r), D64);
	assert_int_equal(oci_ref_set_digest(&r, NULL), 0);
	assert_string_equal(oci_ref_reference(&r), "b");
	char *n = oci_ref_name(&r);
	assert_string_equal(n, "quay.io/a");
	free(n);
	oci_ref_clear(&r);
}

static void test_layouts(void **state)
{
	(void)state;
	struct oci_ref r;
	assert_int_equal(oci_ref_parse("oci:out/dir:v1", &r, NULL), 0);
	assert_int_equal(r.kind, OCI_REF_LAYOUT);
	assert_string_equal(r.dir, "out/dir");
	assert_string_equal(r.tag, "v1");
	char *s = oci_ref_format(&r);
	assert_string_equal(s, "oci:out/dir:v1");
	free(s);
	oci_ref_clear(&r);
	assert_int_equal(oci_ref_parse("oci:/abs/dir", &r, NULL), 0);
	assert_string_equal(r.tag, "latest");
	oci_ref_clear(&r);
	assert_int_equal(oci_ref_parse("oci:d@" D64, &r, NULL), 0);
	assert_null(r.tag);
	assert_string_equal(r.digest, D64);
	oci_ref_clear(&r);
	expect_bad("oci:", "names no directory");
	expect_bad("oci:d:bad/tag", "invalid tag");
}

static void test_errors_name_the_problem(void **state)
{
	(void)state;
	expect_bad("", "empty image reference");
	expect_bad("Ubuntu", "must be lowercase");
	expect_bad("quay.io/Org/x", "must be lowercase");
	expect_bad("quay.io/a//b", "invalid repository path component");
	expect_bad("quay.io/a/", "ends with '/'");
	expect_bad("quay.io/a-", "invalid repository path component 'a-'");
	expect_bad("quay.io/a:-bad", "invalid tag '-bad'");
	expect_bad("quay.io/a@sha256:abc", "wrong length");
	expect_bad("quay.io/a@md5:0123456789abcdef0123456789abcdef",
	           "unsupported digest algorithm 'md5'");
	expect_bad("quay.io/a@sha256", "want algorithm:hex");
	expect_bad("host.io:99999/a", "invalid port '99999'");
	expect_bad("host.io:/a", "invalid port ''");
	expect_bad("-bad.io/a", "invalid registry host");
	expect_bad("[zz]:5000/a", "invalid IPv6 address");
	expect_bad("https://quay.io/a", "URL scheme");
	expect_bad("quay.io/a b", "whitespace");
	char longname[400];
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	expect_bad(longname, "longer than 255");
	char longtag[200] = "a:";
	memset(longtag + 2, 't', 140);
	longtag[142] = '\0';
	expect_bad(longtag, "invalid tag");
}

/* A reference pinned to a digest: the tag goes (a pull by digest only), a
 * digest it named is replaced, and a bad reference fails as parsing does. */
static void test_pin(void **state)
{
	(void)state;
	static const struct {
		const char *in, *canon;
	} cases[] = {
	    {"ubuntu", "docker.io/library/ubuntu@" D64},
	    {"127.0.0.1:5000/c:v1", "127.0.0.1:5000/c@" D64},
	    {"quay.io/o/c:v1@sha256:"
	     "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
	     "quay.io/o/c@" D64},
	    {"oci:./out:v1", "oci:./out@" D64},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct oci_ref r;
		struct oci_err e = {{0}};
		if (oci_ref_pin(cases[i].in, D64, &r, &e) != 0)
			fail_msg("pin '%s': %s", cases[i].in, e.msg);
		assert_null(r.tag);
		char *s = oci_ref_format(&r);
		assert_string_equal(s, cases[i].canon);
		free(s);
		oci_ref_clear(&r);
	}
	struct oci_ref r = {0};
	struct oci_err e = {{0}};
	assert_int_equal(oci_ref_pin("quay.io/Org/x", D64, &r, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "must be lowercase"));
	assert_null(r.registry);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_docker_hub_defaults),
	    cmocka_unit_test(test_hosts_ports_digests),
	    cmocka_unit_test(test_layouts),
	    cmocka_unit_test(test_errors_name_the_problem),
	    cmocka_unit_test(test_pin),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
