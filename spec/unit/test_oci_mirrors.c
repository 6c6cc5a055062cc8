/* Mirror configuration: containerd's hosts directory and registries.conf
 * read from real files, the routes they give for digests and tags, and
 * malformed files refused with the file named. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "oci_mirrors.h"

static char root[256];

static void write_file(const char *rel, const char *text)
{
	char p[512], d[512];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	snprintf(d, sizeof(d), "%s", p);
	*strrchr(d, '/') = '\0';
	mkdir(d, 0755);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof(root), "%s/gkm-mirrors.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(root))
		return -1;
	char d[300];
	snprintf(d, sizeof(d), "%s/certs.d", root);
	mkdir(d, 0755);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd);
}

/* The route as "host path repo [flags]" lines joined with ';'. */
static void route_is(const struct oci_mirrors *m, const char *host, const char *repo,
                     bool by_digest, const char *want)
{
	struct oci_route rt;
	struct oci_err e = {{0}};
	int rc = oci_mirrors_route(m, host, repo, by_digest, &rt, &e);
	if (rc)
		fail_msg("route %s/%s: %d %s", host, repo, rc, e.msg);
	char got[4096] = "";
	for (size_t i = 0; i < rt.n; i++) {
		const struct oci_endpoint *ep = &rt.ep[i];
		char one[1400];
		snprintf(one, sizeof(one), "%s%s %s %s%s%s%s%s%s", i ? ";" : "", ep->host, ep->path,
		         ep->repo, ep->mirror ? " mirror" : "", ep->plain_http ? " http" : "",
		         ep->insecure ? " insecure" : "", ep->skip_verify ? " skip_verify" : "",
		         ep->ca[0][0] ? " ca" : "");
		strncat(got, one, sizeof(got) - strlen(got) - 1);
	}
	if (strcmp(got, want) != 0)
		fail_msg("route %s/%s (%s):\n got  %s\n want %s", host, repo,
		         by_digest ? "digest" : "tag", got, want);
}

static struct oci_mirrors *load(const char *hosts, const char *conf, const char *host)
{
	char hd[300], cf[300];
	snprintf(hd, sizeof(hd), "%s/%s", root, hosts ? hosts : "");
	snprintf(cf, sizeof(cf), "%s/%s", root, conf ? conf : "");
	struct oci_mirrors *m = NULL;
	struct oci_err e = {{0}};
	int rc = oci_mirrors_load(hosts ? hd : NULL, conf ? cf : NULL, host, &m, &e);
	if (rc)
		fail_msg("load: %d %s", rc, e.msg);
	return m;
}

static void refused(const char *rel, const char *text, const char *want)
{
	write_file(rel, text);
	char hd[300], cf[300];
	snprintf(hd, sizeof(hd), "%s/certs.d", root);
	snprintf(cf, sizeof(cf), "%s/%s", root, rel);
	bool hosts = strncmp(rel, "certs.d/", 8) == 0;
	struct oci_mirrors *m = NULL;
	struct oci_err e = {{0}};
	int rc = oci_mirrors_load(hosts ? hd : NULL, hosts ? NULL : cf, "bad.example", &m, &e);
	if (rc != -EINVAL)
		fail_msg("%s accepted (%d), wanted '%s'", rel, rc, want);
	const char *msg = strstr(e.msg, rel);
	if (!msg || !strstr(msg, want))
		fail_msg("message '%s', wanted '%s' naming %s", e.msg, want, rel);
}

static void test_hosts_dir(void **state)
{
	(void)state;
	write_file("certs.d/docker.io/hosts.toml", "server = \"https://registry-1.docker.io\"\n"
	                                           "[host.\"https://m1.local:5000\"]\n"
	                                           "capabilities = [\"pull\", \"resolve\"]\n"
	                                           "ca = \"m1.pem\"\n"
	                                           "[host.\"http://m2.local/cache\"]\n"
	                                           "capabilities = [\"pull\"]\n"
	                                           "[host.\"https://m3.local/api/v2/docker\"]\n"
	                                           "override_path = true\n"
	                                           "skip_verify = true\n");
	struct oci_mirrors *m = load("certs.d", NULL, "registry-1.docker.io");
	assert_non_null(m);
	route_is(m, "registry-1.docker.io", "library/x", true,
	         "m1.local:5000 /v2 library/x mirror ca;m2.local /cache/v2 library/x mirror http;"
	         "m3.local /api/v2/docker library/x mirror skip_verify;"
	         "registry-1.docker.io /v2 library/x");
	route_is(m, "registry-1.docker.io", "library/x", false,
	         "m1.local:5000 /v2 library/x mirror ca;"
	         "m3.local /api/v2/docker library/x mirror skip_verify;"
	         "registry-1.docker.io /v2 library/x");
	oci_mirrors_free(m);

	/* a registry without its own directory: _default, whose server is not used */
	m = load("certs.d", NULL, "127.0.0.1:5000");
	assert_null(m);
	write_file("certs.d/_default/hosts.toml", "server = \"https://elsewhere\"\n"
	                                          "[host.\"http://127.0.0.1:6000\"]\n");
	m = load("certs.d", NULL, "127.0.0.1:5000");
	route_is(m, "127.0.0.1:5000", "c", true,
	         "127.0.0.1:6000 /v2 c mirror http;127.0.0.1:5000 /v2 c");
	oci_mirrors_free(m);
	/* a hosts file wins over registries.conf */
	write_file("registries.conf",
	           "[[registry]]\nlocation = \"127.0.0.1:5000\"\nblocked = true\n");
	m = load("certs.d", "registries.conf", "127.0.0.1:5000");
	route_is(m, "127.0.0.1:5000", "c", false,
	         "127.0.0.1:6000 /v2 c mirror http;127.0.0.1:5000 /v2 c");
	oci_mirrors_free(m);
	unlink(strcat(strcpy((char[512]){0}, root), "/certs.d/_default/hosts.toml"));
}

static void test_registries_conf(void **state)
{
	(void)state;
	write_file("reg.conf", "unqualified-search-registries = [\"docker.io\"]\n"
	                       "[[registry]]\n"
	                       "prefix = \"example.com/team\"\n"
	                       "location = \"internal.local/mirror/team\"\n"
	                       "insecure = true\n"
	                       "[[registry.mirror]]\n"
	                       "location = \"m1.local/team\"\n"
	                       "pull-from-mirror = \"digest-only\"\n"
	                       "[[registry.mirror]]\n"
	                       "location = \"m2.local:5000\"\n"
	                       "pull-from-mirror = \"tag-only\"\n"
	                       "insecure = true\n"
	                       "[[registry.mirror]]\n"
	                       "location = \"m3.local/all\"\n"
	                       "[[registry]]\n"
	                       "location = \"example.com\"\n"
	                       "[[registry.mirror]]\n"
	                       "location = \"m4.local\"\n"
	                       "[[registry]]\n"
	                       "prefix = \"*.corp.example\"\n"
	                       "[[registry.mirror]]\n"
	                       "location = \"m5.local/corp\"\n"
	                       "[[registry]]\n"
	                       "location = \"docker.io\"\n"
	                       "mirror-by-digest-only = true\n"
	                       "[[registry.mirror]]\n"
	                       "location = \"hub-mirror.local\"\n"
	                       "[[registry]]\n"
	                       "location = \"blocked.example\"\n"
	                       "blocked = true\n");
	struct oci_mirrors *m = load(NULL, "reg.conf", "example.com");
	assert_non_null(m);
	/* the longest prefix wins; the matched part is replaced */
	route_is(m, "example.com", "team/cache", true,
	         "m1.local /v2 team/cache mirror;m3.local /v2 all/cache mirror;"
	         "internal.local /v2 mirror/team/cache insecure");
	route_is(m, "example.com", "team/cache", false,
	         "m2.local:5000 /v2 cache mirror insecure;m3.local /v2 all/cache mirror;"
	         "internal.local /v2 mirror/team/cache insecure");
	/* "example.com/teamx" is not under "example.com/team" */
	route_is(m, "example.com", "teamx/c", false,
	         "m4.local /v2 teamx/c mirror;example.com /v2 teamx/c");
	route_is(m, "a.corp.example", "c", true, "m5.local /v2 corp/c mirror;a.corp.example /v2 c");
	route_is(m, "corp.example", "c", true, "corp.example /v2 c");
	route_is(m, "registry-1.docker.io", "library/x", true,
	         "hub-mirror.local /v2 library/x mirror;registry-1.docker.io /v2 library/x");
	route_is(m, "registry-1.docker.io", "library/x", false,
	         "registry-1.docker.io /v2 library/x");
	route_is(m, "other.example", "c", false, "other.example /v2 c");
	struct oci_route rt;
	struct oci_err e = {{0}};
	assert_int_equal(oci_mirrors_route(m, "blocked.example", "x", true, &rt, &e), -EACCES);
	assert_non_null(strstr(e.msg, "registry blocked.example is blocked by"));
	oci_mirrors_free(m);
	/* nothing configured: no object at all */
	assert_null(load(NULL, "missing.conf", "example.com"));
	assert_null(load("missing.d", NULL, "example.com"));
	route_is(NULL, "example.com", "c", true, "example.com /v2 c");
}

static void test_malformed(void **state)
{
	(void)state;
	refused("r1.conf", "[[registry]]\nlocation = \"a\"\nlocaton = \"b\"\n",
	        "[[registry]] #1: unknown key 'locaton'");
	refused("r2.conf",
	        "[[registry]]\nlocation = \"a\"\n[[registry.mirror]]\n"
	        "location = \"m\"\npull-from-mirror = \"sometimes\"\n",
	        "'pull-from-mirror' is 'sometimes', not all, digest-only or tag-only");
	refused("r3.conf",
	        "[[registry]]\nlocation = \"a\"\nmirror-by-digest-only = true\n"
	        "[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"all\"\n",
	        "cannot be used with 'mirror-by-digest-only'");
	refused("r4.conf", "[[registry]]\ninsecure = \"yes\"\nlocation = \"a\"\n",
	        "'insecure' must be true or false");
	refused("r5.conf", "[registries.search]\nregistries = []\n", "version 1 format");
	refused("r6.conf", "[[registry]]\nprefix = \"*.x.example\"\nlocation = \"y\"\n",
	        "a wildcard prefix names hosts only");
	refused("r7.conf", "[[registry]]\nlocation = \"a\"\n[[registry.mirror]]\ninsecure = true\n",
	        "a mirror needs a 'location'");
	refused("r8.conf", "[[registry]]\nlocation = \"a\n", ":2: string not closed on its line");
	refused("certs.d/bad.example/hosts.toml",
	        "[host.\"https://m\"]\ncapabilities = [\"pul\"]\n",
	        "[host.\"https://m\"]: capability 'pul' is not pull, resolve or push");
	refused("certs.d/bad.example/hosts.toml", "[host.\"ftp://m\"]\n",
	        "only http and https URLs");
	refused("certs.d/bad.example/hosts.toml", "sever = \"https://x\"\n", "unknown key 'sever'");
	refused("certs.d/bad.example/hosts.toml", "[host.\"https://m\"]\nca = 5\n",
	        "'ca' must be a file name or a list of them");
	refused("certs.d/bad.example/hosts.toml", "[host.\"https://m\"]\nskip_verify = 1\n",
	        "'skip_verify' must be true or false");
	refused("certs.d/bad.example/hosts.toml", "server = \"https://x\"\nserver = \"y\"\n",
	        ":2: key 'server' is defined twice");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_hosts_dir),
	    cmocka_unit_test(test_registries_conf),
	    cmocka_unit_test(test_malformed),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
