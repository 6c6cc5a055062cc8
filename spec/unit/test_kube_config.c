/* kubeconfig and in-cluster configuration parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kube_config.h"

static char dir[256];

static int mkdir_tmp(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "%s/kcfg.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	assert_non_null(mkdtemp(dir));
	return 0;
}

static int rm_tmp(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void put(const char *name, const char *text)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static const char *at(const char *name)
{
	static char p[4][512];
	static int i;
	i = (i + 1) % 4;
	snprintf(p[i], sizeof(p[i]), "%s/%s", dir, name);
	return p[i];
}

/* base64 of "-----BEGIN CERTIFICATE-----\nCA\n" etc. */
#define CA_PEM "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
#define CA_B64 "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkNBCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K"

static const char *kubeconfig = "apiVersion: v1\n"
                                "kind: Config\n"
                                "current-context: dev\n"
                                "clusters:\n"
                                "- name: dev-cluster\n"
                                "  cluster:\n"
                                "    server: https://10.1.2.3:6443/\n"
                                "    certificate-authority-data: " CA_B64 "\n"
                                "- name: prod-cluster\n"
                                "  cluster:\n"
                                "    server: https://prod.example:443\n"
                                "    certificate-authority: certs/ca.crt\n"
                                "    insecure-skip-tls-verify: true\n"
                                "contexts:\n"
                                "- name: dev\n"
                                "  context:\n"
                                "    cluster: dev-cluster\n"
                                "    user: dev-user\n"
                                "    namespace: team-a\n"
                                "- name: prod\n"
                                "  context: {cluster: prod-cluster, user: prod-user}\n"
                                "- name: broken\n"
                                "  context: {cluster: nowhere, user: dev-user}\n"
                                "- name: halfcert\n"
                                "  context: {cluster: dev-cluster, user: half}\n"
                                "users:\n"
                                "- name: dev-user\n"
                                "  user:\n"
                                "    token: abc.def\n"
                                "- name: prod-user\n"
                                "  user:\n"
                                "    client-certificate: certs/client.crt\n"
                                "    client-key: certs/client.key\n"
                                "- name: half\n"
                                "  user:\n"
                                "    client-certificate-data: " CA_B64 "\n";

static void test_kubeconfig_current_context(void **state)
{
	(void)state;
	put("config", kubeconfig);
	struct kube_config *c = NULL;
	char err[256] = "";
	assert_int_equal(kube_config_load_file(at("config"), NULL, &c, err, sizeof(err)), 0);
	assert_string_equal(c->server, "https://10.1.2.3:6443"); /* trailing slash dropped */
	assert_string_equal(c->namespace, "team-a");
	assert_string_equal(c->context, "dev");
	assert_false(c->insecure);
	assert_int_equal(c->ca_data.len, strlen(CA_PEM));
	assert_memory_equal(c->ca_data.data, CA_PEM, strlen(CA_PEM));
	assert_null(c->ca_file);
	char tok[64];
	assert_int_equal(kube_config_token(c, tok, sizeof(tok)), 0);
	assert_string_equal(tok, "abc.def");
	assert_int_equal(kube_config_token(c, tok, 4), -ENOSPC);
	kube_config_free(c);
}

static void test_kubeconfig_named_context_files(void **state)
{
	(void)state;
	put("config", kubeconfig);
	char d[300];
	snprintf(d, sizeof(d), "%s/certs", dir);
	mkdir(d, 0700);
	put("certs/ca.crt", CA_PEM);
	put("certs/client.crt", CA_PEM);
	put("certs/client.key", "key");
	struct kube_config *c = NULL;
	char err[256] = "";
	assert_int_equal(kube_config_load_file(at("config"), "prod", &c, err, sizeof(err)), 0);
	assert_string_equal(c->server, "https://prod.example:443");
	assert_string_equal(c->namespace, "default");
	assert_true(c->insecure);
	/* relative paths resolve against the kubeconfig's directory */
	assert_string_equal(c->ca_file, at("certs/ca.crt"));
	assert_string_equal(c->cert_file, at("certs/client.crt"));
	assert_string_equal(c->key_file, at("certs/client.key"));
	char tok[8];
	assert_int_equal(kube_config_token(c, tok, sizeof(tok)), 0);
	assert_string_equal(tok, "");
	kube_config_free(c);

	/* a referenced file that is missing is an error naming it */
	unlink(at("certs/client.key"));
	c = NULL;
	assert_int_equal(kube_config_load_file(at("config"), "prod", &c, err, sizeof(err)),
	                 -ENOENT);
	assert_null(c);
	assert_non_null(strstr(err, "client.key"));
}

static void test_kubeconfig_errors(void **state)
{
	(void)state;
	put("config", kubeconfig);
	struct kube_config *c = NULL;
	char err[256] = "";
	assert_int_equal(kube_config_load_file(at("config"), "nope", &c, err, sizeof(err)),
	                 -ENOENT);
	assert_non_null(strstr(err, "context \"nope\" not found"));
	assert_int_equal(kube_config_load_file(at("config"), "broken", &c, err, sizeof(err)),
	                 -ENOENT);
	assert_non_null(strstr(err, "cluster \"nowhere\""));
	assert_int_equal(kube_config_load_file(at("config"), "halfcert", &c, err, sizeof(err)),
	                 -EINVAL);
	assert_non_null(strstr(err, "without its key"));
	assert_null(c);

	put("bad64", "current-context: x\nclusters: [{name: c, cluster: {server: 'https://h', "
	             "certificate-authority-data: '!!!notbase64'}}]\ncontexts: [{name: x, context: "
	             "{cluster: c}}]\n");
	assert_int_equal(kube_config_load_file(at("bad64"), NULL, &c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not valid base64"));

	put("noscheme", "current-context: x\nclusters: [{name: c, cluster: {server: 'h:443'}}]\n"
	                "contexts: [{name: x, context: {cluster: c}}]\n");
	assert_int_equal(kube_config_load_file(at("noscheme"), NULL, &c, err, sizeof(err)),
	                 -EINVAL);
	assert_non_null(strstr(err, "server URL"));

	put("syntax", "clusters:\n  - name: [unclosed\n");
	assert_int_equal(kube_config_load_file(at("syntax"), NULL, &c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "line"));

	put("nocurrent", "clusters: []\n");
	assert_int_equal(kube_config_load_file(at("nocurrent"), NULL, &c, err, sizeof(err)),
	                 -EINVAL);
	assert_non_null(strstr(err, "no current-context"));

	assert_int_equal(kube_config_load_file(at("missing"), NULL, &c, err, sizeof(err)), -ENOENT);
	assert_null(c);
}

static void test_kubeconfig_env_list(void **state)
{
	(void)state;
	put("config", kubeconfig);
	char env[1100];
	snprintf(env, sizeof(env), "%s:%s", at("does-not-exist"), at("config"));
	setenv("KUBECONFIG", env, 1);
	unsetenv("KUBERNETES_SERVICE_HOST");
	struct kube_config *c = NULL;
	char err[256];
	assert_int_equal(kube_config_load(NULL, NULL, &c, err, sizeof(err)), 0);
	assert_string_equal(c->context, "dev");
	kube_config_free(c);
	unsetenv("KUBECONFIG");
}

static void test_token_file_rotation(void **state)
{
	(void)state;
	put("token", "first-token\n");
	char cfg[1024];
	snprintf(
	    cfg, sizeof(cfg),
	    "current-context: x\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
	    "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
	    "users: [{name: u, user: {tokenFile: token}}]\n");
	put("config", cfg);
	struct kube_config *c = NULL;
	char err[256], tok[64];
	assert_int_equal(kube_config_load_file(at("config"), NULL, &c, err, sizeof(err)), 0);
	assert_int_equal(kube_config_token(c, tok, sizeof(tok)), 0);
	assert_string_equal(tok, "first-token"); /* newline trimmed */
	/* kubelet swaps the file atomically: new inode */
	put("token.new", "second-token\n");
	assert_int_equal(rename(at("token.new"), at("token")), 0);
	c->token_checked_ms = 0; /* skip the one-second stat() throttle */
	assert_int_equal(kube_config_token(c, tok, sizeof(tok)), 0);
	assert_string_equal(tok, "second-token");
	/* the file vanishes: the last good token stays */
	unlink(at("token"));
	c->token_checked_ms = 0;
	assert_int_equal(kube_config_token(c, tok, sizeof(tok)), 0);
	assert_string_equal(tok, "second-token");
	kube_config_free(c);
}

static void test_incluster(void **state)
{
	(void)state;
	char sa[300];
	snprintf(sa, sizeof(sa), "%s/sa", dir);
	mkdir(sa, 0700);
	put("sa/token", "sa-token-1");
	put("sa/ca.crt", CA_PEM);
	put("sa/namespace", "gkm-system\n");
	struct kube_config *c = NULL;
	char err[256], tok[64];
	unsetenv("KUBERNETES_SERVICE_HOST");
	assert_int_equal(kube_config_load_incluster(sa, &c, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "KUBERNETES_SERVICE_HOST"));
	setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	assert_int_equal(kube_config_load_incluster(sa, &c, err, sizeof(err)), 0);
	assert_string_equal(c->server, "https://[fd00::1]:443");
	assert_string_equal(c->namespace, "gkm-system");
	assert_string_equal(c->ca_file, at("sa/ca.crt"));
	assert_int_equal(kube_config_token(c, tok, sizeof(tok)), 0);
	assert_string_equal(tok, "sa-token-1");
	put("sa/token.new", "sa-token-2");
	assert_int_equal(rename(at("sa/token.new"), at("sa/token")), 0);
	c->token_checked_ms = 0;
	assert_int_equal(kube_config_token(c, tok, sizeof(tok)), 0);
	assert_string_equal(tok, "sa-token-2");
	kube_config_free(c);

	setenv("KUBERNETES_SERVICE_PORT", "https", 1);
	assert_int_equal(kube_config_load_incluster(sa, &c, err, sizeof(err)), -EINVAL);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	unlink(at("sa/token"));
	assert_int_equal(kube_config_load_incluster(sa, &c, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "token"));
	unsetenv("KUBERNETES_SERVICE_HOST");
	unsetenv("KUBERNETES_SERVICE_PORT");
}

static void test_yaml_to_json(void **state)
{
	(void)state;
	const char *y = "a: 1\nb: 'x'\nc: true\nd: ~\ne: [1, two]\nf: &anchor {k: v}\ng: *anchor\n"
	                "h: \"true\"\ni: 1.5\n";
	cJSON *j = NULL;
	char err[128];
	assert_int_equal(kube_config_yaml_to_json(y, strlen(y), &j, err, sizeof(err)), 0);
	char *s = cJSON_PrintUnformatted(j);
	assert_string_equal(s, "{\"a\":1,\"b\":\"x\",\"c\":true,\"d\":null,\"e\":[1,\"two\"],"
	                       "\"f\":{\"k\":\"v\"},\"g\":{\"k\":\"v\"},\"h\":\"true\",\"i\":1.5}");
	free(s);
	cJSON_Delete(j);
	j = NULL;
	const char *dup = "a: 1\na: 2\n";
	assert_int_equal(kube_config_yaml_to_json(dup, strlen(dup), &j, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "duplicate key 'a'"));
	char deep[400];
	size_t n = 0;
	for (int i = 0; i < 100; i++)
		deep[n++] = '[';
	for (int i = 0; i < 100; i++)
		deep[n++] = ']';
	assert_int_equal(kube_config_yaml_to_json(deep, n, &j, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "deeper"));
	assert_int_equal(kube_config_yaml_to_json("", 0, &j, err, sizeof(err)), -EINVAL);
	const char *badkey = "? [a]\n: 1\n";
	assert_int_equal(kube_config_yaml_to_json(badkey, strlen(badkey), &j, err, sizeof(err)),
	                 -EINVAL);
	assert_null(j);
	/* JSON is YAML: an apply payload round-trips */
	const char *js = "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"data\":{\"k\":\"1\"}}";
	assert_int_equal(kube_config_yaml_to_json(js, strlen(js), &j, err, sizeof(err)), 0);
	s = cJSON_PrintUnformatted(j);
	assert_string_equal(s, js);
	free(s);
	cJSON_Delete(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_kubeconfig_current_context, mkdir_tmp, rm_tmp),
	    cmocka_unit_test_setup_teardown(test_kubeconfig_named_context_files, mkdir_tmp, rm_tmp),
	    cmocka_unit_test_setup_teardown(test_kubeconfig_errors, mkdir_tmp, rm_tmp),
	    cmocka_unit_test_setup_teardown(test_kubeconfig_env_list, mkdir_tmp, rm_tmp),
	    cmocka_unit_test_setup_teardown(test_token_file_rotation, mkdir_tmp, rm_tmp),
	    cmocka_unit_test_setup_teardown(test_incluster, mkdir_tmp, rm_tmp),
	    cmocka_unit_test(test_yaml_to_json),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
