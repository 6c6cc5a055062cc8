/* The webhook's trust snapshots: settings from flags, a config file or a
 * config directory; keys from a directory and from files; change digests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "signature.h"
#include "trust.h"

static char dir[64];

static void put(const char *name, const char *content)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(content, f);
	fclose(f);
}

static const char *at(const char *name)
{
	static char p[4][256];
	static int i;
	i = (i + 1) % 4;
	snprintf(p[i], sizeof(p[i]), "%s/%s", dir, name);
	return p[i];
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/gkm-trust-XXXXXX");
	assert_non_null(mkdtemp(dir));
	char p[256];
	snprintf(p, sizeof(p), "%s/keys", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/cm", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
	return 0;
}

static void test_bools(void **state)
{
	(void)state;
	const char *yes[] = {"true", "TRUE", " yes\n", "on", "1"};
	const char *no[] = {"false", "No", "off", "0\n"};
	const char *bad[] = {"", "maybe", "truee", "1 0", "2", "yes please"};
	bool v;
	for (size_t i = 0; i < sizeof(yes) / sizeof(*yes); i++) {
		v = false;
		assert_int_equal(trust_parse_bool(yes[i], &v), 0);
		assert_true(v);
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(*no); i++) {
		v = true;
		assert_int_equal(trust_parse_bool(no[i], &v), 0);
		assert_false(v);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		assert_int_equal(trust_parse_bool(bad[i], &v), -EINVAL);
}

static struct trust *load_ok(const struct trust_source *src)
{
	struct trust *t = NULL;
	char err[512] = "";
	if (trust_load(src, &t, err, sizeof(err)) != 0)
		fail_msg("trust_load: %s", err);
	return t;
}

static void expect_refused(const struct trust_source *src, const char *want)
{
	struct trust *t = NULL;
	char err[512] = "";
	assert_int_not_equal(trust_load(src, &t, err, sizeof(err)), 0);
	assert_null(t);
	if (!strstr(err, want))
		fail_msg("error '%s' does not mention '%s'", err, want);
}

static void test_settings(void **state)
{
	(void)state;
	struct trust_source src = {.defaults = {.verify_enabled = true}};
	struct trust *t = load_ok(&src);
	assert_true(t->s.verify_enabled);
	assert_false(t->s.allow_unsigned);
	assert_int_equal(t->nkeys, 0);
	assert_string_equal(t->keys_fp, "none");
	trust_unref(t);

	/* a YAML file overrides the flags for the keys it names; other keys are
	 * another daemon's */
	put("config.yaml", "# shared\nallow-unsigned-images: \"yes\"\nagent-pull-limit: 3\n");
	src.config_path = at("config.yaml");
	t = load_ok(&src);
	assert_true(t->s.verify_enabled);
	assert_true(t->s.allow_unsigned);
	trust_unref(t);
	put("config.yaml", "{\"verifyEnabled\": false}");
	t = load_ok(&src);
	assert_false(t->s.verify_enabled);
	trust_unref(t);
	put("config.yaml", "verify-enabled: maybe\n");
	expect_refused(&src, "config.yaml: verify-enabled: want true or false, got 'maybe'");
	put("config.yaml", "verify-enabled: [1]\n");
	expect_refused(&src, "want true or false, got '[1]'");
	put("config.yaml", "- a\n- b\n");
	expect_refused(&src, "want one mapping of settings");
	put("config.yaml", "a: [\n");
	expect_refused(&src, "config.yaml:");

	/* a directory holds one file per key, as a mounted ConfigMap does */
	put("cm/verify-enabled", "false\n");
	put("cm/allow-unsigned-images", "true");
	put("cm/.hidden", "junk");
	src.config_path = at("cm");
	t = load_ok(&src);
	assert_false(t->s.verify_enabled);
	assert_true(t->s.allow_unsigned);
	trust_unref(t);
	put("cm/allow-unsigned-images", "sure");
	expect_refused(&src, "cm/allow-unsigned-images: allow-unsigned-images: want true or false");
	src.config_path = at("nonexistent");
	expect_refused(&src, "nonexistent: No such file or directory");
}

static void test_keys_and_digests(void **state)
{
	(void)state;
	char *priv = NULL, *pub1 = NULL, *pub2 = NULL;
	assert_int_equal(sig_keygen_p256(NULL, &priv, &pub1), 0);
	free(priv);
	assert_int_equal(sig_keygen_p256(NULL, &priv, &pub2), 0);
	free(priv);
	put("keys/a.pub", pub1);
	struct trust_source src = {.trust_dir = at("keys"), .defaults = {.verify_enabled = true}};
	char d1[65], d2[65], err[256];
	assert_int_equal(trust_source_digest(&src, d1, err, sizeof(err)), 0);
	struct trust *t = load_ok(&src);
	assert_int_equal(t->nkeys, 1);
	assert_string_equal(t->digest, d1);
	char fp1[SIGNATURE_FP_MAX];
	snprintf(fp1, sizeof(fp1), "%s", t->keys_fp);
	assert_true(strncmp(fp1, "sha256:", 7) == 0);
	trust_unref(t);

	/* a --key file adds its key; the digest and the key-set fingerprint change */
	put("b.pub", pub2);
	const char *files[] = {at("b.pub")};
	src.key_files = files;
	src.nkey_files = 1;
	assert_int_equal(trust_source_digest(&src, d2, err, sizeof(err)), 0);
	assert_string_not_equal(d1, d2);
	t = load_ok(&src);
	assert_int_equal(t->nkeys, 2);
	assert_string_not_equal(t->keys_fp, fp1);
	trust_unref(t);

	/* the same key twice is one key */
	put("keys/again.pub", pub2);
	t = load_ok(&src);
	assert_int_equal(t->nkeys, 2);
	trust_unref(t);

	/* a file without a key is refused, naming it */
	put("keys/notes.txt", "hello\n");
	expect_refused(&src, "keys/notes.txt: no PEM public key found");
	assert_int_equal(unlink(at("keys/notes.txt")), 0);
	put("b.pub", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n");
	expect_refused(&src, "b.pub: ");
	free(pub1);
	free(pub2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_bools),
	    cmocka_unit_test(test_settings),
	    cmocka_unit_test(test_keys_and_digests),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
