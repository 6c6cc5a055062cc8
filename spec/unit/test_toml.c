/* The TOML reader behind the registry mirror files: the shapes containerd's
 * hosts.toml and registries.conf take, and every malformed input refused
 * with the file and line. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "toml.h"

static cJSON *parse_ok(const char *text)
{
	cJSON *out = NULL;
	char err[600] = "";
	int rc = toml_parse("t.toml", text, strlen(text), &out, err, sizeof(err));
	if (rc)
		fail_msg("refused (%d): %s\n%s", rc, err, text);
	return out;
}

/* text is refused with exactly want (the "t.toml:LINE: ..." message). */
static void refused(const char *text, const char *want)
{
	cJSON *out = NULL;
	char err[600] = "";
	int rc = toml_parse("t.toml", text, strlen(text), &out, err, sizeof(err));
	if (rc != -EINVAL)
		fail_msg("accepted (%d), wanted '%s':\n%s", rc, want, text);
	if (strncmp(err, want, strlen(want)) != 0)
		fail_msg("message '%s', wanted '%s...'", err, want);
}

static void assert_json(const cJSON *v, const char *want)
{
	char *s = cJSON_PrintUnformatted(v);
	assert_non_null(s);
	assert_string_equal(s, want);
	free(s);
}

static void test_hosts_toml(void **state)
{
	(void)state;
	cJSON *t = parse_ok("# containerd\n"
	                    "server = \"https://registry-1.docker.io\"  # origin\n"
	                    "\n"
	                    "[host.\"https://mirror-a.local:5000\"]\n"
	                    "  capabilities = [\"pull\", \"resolve\"]\n"
	                    "  ca = '/etc/certs/a.pem'\n"
	                    "  skip_verify = false\n"
	                    "\n"
	                    "[host.\"http://mirror-b.local\"]\r\n"
	                    "  capabilities = [\r\n"
	                    "    \"pull\", # digests only\r\n"
	                    "  ]\r\n"
	                    "  override_path = true\r\n");
	assert_json(t, "{\"server\":\"https://registry-1.docker.io\",\"host\":{"
	               "\"https://mirror-a.local:5000\":{\"capabilities\":[\"pull\",\"resolve\"],"
	               "\"ca\":\"/etc/certs/a.pem\",\"skip_verify\":false},"
	               "\"http://mirror-b.local\":{\"capabilities\":[\"pull\"],"
	               "\"override_path\":true}}}");
	cJSON_Delete(t);
}

static void test_registries_conf(void **state)
{
	(void)state;
	cJSON *t = parse_ok("unqualified-search-registries = [\"docker.io\"]\n"
	                    "short-name-mode = \"enforcing\"\n"
	                    "[[registry]]\n"
	                    "prefix = \"example.com/foo\"\n"
	                    "location = \"internal.local/foo\"\n"
	                    "insecure = false\n"
	                    "[[registry.mirror]]\n"
	                    "location = \"m1.local/foo\"\n"
	                    "pull-from-mirror = \"digest-only\"\n"
	                    "[[registry.mirror]]\n"
	                    "location = \"m2.local\"\n"
	                    "insecure = true\n"
	                    "[[registry]]\n"
	                    "location = \"blocked.example\"\n"
	                    "blocked = true\n"
	                    "[aliases]\n"
	                    "\"busybox\" = \"docker.io/library/busybox\"\n");
	assert_json(t, "{\"unqualified-search-registries\":[\"docker.io\"],"
	               "\"short-name-mode\":\"enforcing\",\"registry\":[{\"prefix\":"
	               "\"example.com/foo\",\"location\":\"internal.local/foo\",\"insecure\":"
	               "false,\"mirror\":[{\"location\":\"m1.local/foo\",\"pull-from-mirror\":"
	               "\"digest-only\"},{\"location\":\"m2.local\",\"insecure\":true}]},"
	               "{\"location\":\"blocked.example\",\"blocked\":true}],"
	               "\"aliases\":{\"busybox\":\"docker.io/library/busybox\"}}");
	cJSON_Delete(t);
}

static void test_values(void **state)
{
	(void)state;
	cJSON *t = parse_ok("a.b.c = 1_000\n"
	                    "n = -42\n"
	                    "s = \"tab\\tquote\\\"back\\\\ \\u00e9\\U0001F600\"\n"
	                    "lit = 'C:\\no\\escapes'\n"
	                    "nested = [[1, 2], [\"x\"], []]\n"
	                    "\"quoted key\" = true\n"
	                    "[empty]\n"
	                    "[x.y]\n"
	                    "[x]\n"
	                    "z = 0\n");
	assert_json(t, "{\"a\":{\"b\":{\"c\":1000}},\"n\":-42,\"s\":\"tab\\tquote\\\"back\\\\ "
	               "\xc3\xa9\xf0\x9f\x98\x80\",\"lit\":\"C:\\\\no\\\\escapes\","
	               "\"nested\":[[1,2],[\"x\"],[]],\"quoted key\":true,\"empty\":{},"
	               "\"x\":{\"y\":{},\"z\":0}}");
	cJSON_Delete(t);
	t = parse_ok("");
	assert_json(t, "{}");
	cJSON_Delete(t);
}

static void test_malformed(void **state)
{
	(void)state;
	refused("a = 1\na = 2\n", "t.toml:2: key 'a' is defined twice");
	refused("[t]\n[t]\n", "t.toml:2: table [t] is defined twice");
	refused("x = 1\n[x]\n", "t.toml:2: table [x] is defined twice");
	refused("a = [1]\n[[a]]\n", "t.toml:2: [[a]]: 'a' is already defined");
	refused("\n\ns = \"open\n", "t.toml:3: string not closed on its line");
	refused("s = \"\"\"multi\nline\"\"\"\n", "t.toml:1: multi-line strings are not supported");
	refused("t = { a = 1 }\n", "t.toml:1: inline tables are not supported");
	refused("f = 1.5\n", "t.toml:1: '1.5' is not a value this reader accepts");
	refused("d = 1979-05-27\n", "t.toml:1: '1979-05-27' is not a value");
	refused("b = yes\n", "t.toml:1: 'yes' is not a value");
	refused("n = 012\n", "t.toml:1: '012' is not a value");
	refused("n = 1__0\n", "t.toml:1: '1__0' is not a value");
	refused("a = 1 2\n", "t.toml:1: unexpected '2' after the value");
	refused("a =\n", "t.toml:1: expected a value");
	refused("= 1\n", "t.toml:1: expected a key, found '='");
	refused("key\n", "t.toml:1: expected '=' after the key 'key'");
	refused("[t\n", "t.toml:1: expected ']' to close the table header");
	refused("[[t]\n", "t.toml:1: expected ']]' to close the table header");
	refused("a = [1, 2\n", "t.toml:1: array not closed");
	refused("x = 1\na = [\n1,\n", "t.toml:2: array not closed");
	refused("a = [1 2]\n", "t.toml:1: expected ',' or ']' in an array");
	refused("s = \"\\q\"\n", "t.toml:1: unknown escape '\\q'");
	refused("s = \"\\uD800\"\n", "t.toml:1: \\u escape names no Unicode scalar value");
	refused("s = \"\\u12\"\n", "t.toml:1: bad hex digit '\"' in \\u escape");
	refused("a = 1\n[a.b]\n", "t.toml:2: 'a' is a value, not a table");
	refused("a = 1\na.b = 2\n", "t.toml:2: 'a' is a value, not a table");
	refused("a = [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]\n", "t.toml:1: arrays nested deeper");
	cJSON *out = NULL;
	char err[200];
	assert_int_equal(toml_parse("t.toml", "a = 1\0", 6, &out, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t.toml: contains a NUL byte (not a text file)");
	assert_int_equal(toml_parse_file("/nonexistent/hosts.toml", &out, err, sizeof(err)),
	                 -ENOENT);
	assert_string_equal(err, "/nonexistent/hosts.toml: No such file or directory");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_hosts_toml),
	    cmocka_unit_test(test_registries_conf),
	    cmocka_unit_test(test_values),
	    cmocka_unit_test(test_malformed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
