/* cache_view: names, ready.json parsing, resolving `data` inside the store,
 * which records are made durable, the usage files (including concurrent
 * updates) and the asks for evicted caches. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "shell.h"

#include "cache_view.h"

#define HEX "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define DIGEST "sha256:" HEX
#define HEX2 "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

static char root[512];

/* Every fsync(2) the code under test makes is counted here (this
 * definition is linked in place of the C library's). */
static atomic_int fsyncs;
int fsync(int fd)
{
	atomic_fetch_add(&fsyncs, 1);
	return (int)syscall(SYS_fsync, fd);
}

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof(root), "%s/gkm-cv.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(root))
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[PATH_MAX + 16];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd) == 0 ? 0 : -1;
}

static void test_names(void **state)
{
	(void)state;
	assert_true(cache_view_valid_namespace("default"));
	assert_true(cache_view_valid_namespace("a"));
	assert_true(cache_view_valid_namespace("team-1"));
	assert_false(cache_view_valid_namespace(""));
	assert_false(cache_view_valid_namespace(NULL));
	assert_false(cache_view_valid_namespace(".."));
	assert_false(cache_view_valid_namespace("a/b"));
	assert_false(cache_view_valid_namespace("_cluster"));
	assert_false(cache_view_valid_namespace("Default"));
	assert_false(cache_view_valid_namespace("-a"));
	assert_false(cache_view_valid_namespace("a.b"));
	assert_false(cache_view_valid_namespace(
	    "a123456789012345678901234567890123456789012345678901234567890123"));

	assert_true(cache_view_valid_name("llama-3.triton"));
	assert_true(cache_view_valid_name("x"));
	/* one part over 63 characters: a name the API server stores */
	assert_true(cache_view_valid_name(
	    "kernels-for-a-long-model-name-llama-3-70b-instruct-fp8-sm75-vector-add"));
	assert_false(cache_view_valid_name("."));
	assert_false(cache_view_valid_name(".."));
	assert_false(cache_view_valid_name("../etc"));
	assert_false(cache_view_valid_name("a..b"));
	assert_false(cache_view_valid_name("a/b"));
	assert_false(cache_view_valid_name(".hidden"));
	assert_false(cache_view_valid_name("a."));
	assert_false(cache_view_valid_name("a b"));
	assert_false(cache_view_valid_name("a\nb"));

	assert_true(cache_view_valid_digest(DIGEST));
	assert_false(cache_view_valid_digest("sha256:" HEX "0"));
	assert_false(cache_view_valid_digest("sha512:" HEX));
	assert_false(cache_view_valid_digest(
	    "sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"));

	char buf[PATH_MAX];
	assert_int_equal(cache_view_dir(buf, sizeof(buf), "/r", "caches", "ns", "c"), 0);
	assert_string_equal(buf, "/r/caches/ns/c");
	assert_int_equal(cache_view_dir(buf, sizeof(buf), "/r", "caches", NULL, "c"), 0);
	assert_string_equal(buf, "/r/caches/_cluster/c");
	assert_int_equal(cache_view_dir(buf, sizeof(buf), "/r", "caches", "", "c"), 0);
	assert_string_equal(buf, "/r/caches/_cluster/c");
	assert_int_equal(cache_view_dir(buf, sizeof(buf), "/r", "caches", "..", "c"), -EINVAL);
	assert_int_equal(cache_view_dir(buf, sizeof(buf), "/r", "caches", "ns", "../x"), -EINVAL);
	char small[8] = "keep";
	assert_int_equal(cache_view_dir(small, sizeof(small), "/r", "caches", "ns", "c"),
	                 -ENAMETOOLONG);
	assert_string_equal(small, "keep");
}

static void test_ready_parse_good(void **state)
{
	(void)state;
	const char *j =
	    "{\"digest\":\"" DIGEST "\",\"state\":\"Ready\",\"compatible\":true,"
	    "\"compatibleGPUs\":[\"GPU-1\",\"GPU-2\"],\"reason\":\"\",\"message\":\"ok\","
	    "\"updated\":\"2024-05-01T12:00:00Z\",\"future\":{\"x\":1}}";
	struct cache_view_ready r;
	char err[256] = "";
	assert_int_equal(cache_view_ready_parse(j, strlen(j), &r, err, sizeof(err)), 0);
	assert_string_equal(r.digest, DIGEST);
	assert_string_equal(r.state, "Ready");
	assert_true(r.compatible);
	assert_int_equal(r.ncompatible_gpus, 2);
	assert_string_equal(r.compatible_gpus[1], "GPU-2");
	assert_string_equal(r.message, "ok");
	assert_string_equal(r.reason, "");
	assert_string_equal(r.updated, "2024-05-01T12:00:00Z");
	cache_view_ready_free(&r);

	/* Optional members may be absent. */
	const char *min = "{\"digest\":\"" DIGEST "\",\"state\":\"Pulling\",\"compatible\":false}";
	assert_int_equal(cache_view_ready_parse(min, strlen(min), &r, err, sizeof(err)), 0);
	assert_false(r.compatible);
	assert_int_equal(r.ncompatible_gpus, 0);
	assert_string_equal(r.reason, "");
	cache_view_ready_free(&r);

	/* A cache whose digest is not resolved yet: a record without one. */
	const char *pending = "{\"state\":\"Pending\",\"compatible\":true,"
	                      "\"reason\":\"DigestNotResolved\"}";
	assert_int_equal(cache_view_ready_parse(pending, strlen(pending), &r, err, sizeof(err)), 0);
	assert_string_equal(r.digest, "");
	assert_string_equal(r.state, "Pending");
	assert_string_equal(r.reason, "DigestNotResolved");
	cache_view_ready_free(&r);
}

static void expect_bad(const char *j, const char *want)
{
	struct cache_view_ready r;
	memset(&r, 0x5a, sizeof(r));
	char err[256] = "";
	int rc = cache_view_ready_parse(j, strlen(j), &r, err, sizeof(err));
	assert_int_equal(rc, -EINVAL);
	if (!strstr(err, want))
		fail_msg("for %s: error '%s' does not mention '%s'", j, err, want);
	/* untouched on failure */
	assert_int_equal(((unsigned char *)&r)[0], 0x5a);
}

static void test_ready_parse_malformed(void **state)
{
	(void)state;
	expect_bad("", "not valid JSON");
	expect_bad("{\"digest\":", "not valid JSON");
	expect_bad("[1,2]", "not a JSON object");
	expect_bad("{\"state\":\"Ready\",\"compatible\":true}", "digest");
	expect_bad("{\"digest\":\"sha256:abc\",\"state\":\"Ready\",\"compatible\":true}", "digest");
	expect_bad("{\"digest\":\"sha256:../../" HEX "\",\"state\":\"Ready\",\"compatible\":true}",
	           "digest");
	/* Only a record that is not Ready may go without a digest, and one it
	 * gives must be well formed. */
	expect_bad("{\"digest\":\"sha256:abc\",\"state\":\"Failed\",\"compatible\":true}",
	           "digest");
	expect_bad("{\"digest\":\"\",\"state\":\"Ready\",\"compatible\":true}", "digest");
	expect_bad("{\"digest\":\"" DIGEST "\",\"compatible\":true}", "state");
	expect_bad("{\"digest\":\"" DIGEST "\",\"state\":7,\"compatible\":true}", "state");
	expect_bad("{\"digest\":\"" DIGEST "\",\"state\":\"Ready\"}", "compatible");
	expect_bad("{\"digest\":\"" DIGEST "\",\"state\":\"Ready\",\"compatible\":\"true\"}",
	           "compatible");
	expect_bad("{\"digest\":\"" DIGEST "\",\"state\":\"Ready\",\"compatible\":true,"
	           "\"compatibleGPUs\":\"GPU-1\"}",
	           "compatibleGPUs");
	expect_bad("{\"digest\":\"" DIGEST "\",\"state\":\"Ready\",\"compatible\":true,"
	           "\"compatibleGPUs\":[1]}",
	           "compatibleGPUs");
	expect_bad("{\"digest\":\"" DIGEST "\",\"state\":\"Ready\",\"compatible\":true,"
	           "\"reason\":[]}",
	           "reason");

	/* Oversized input is refused before parsing. */
	size_t big = CACHE_VIEW_READY_MAX + 10;
	char *j = malloc(big + 1);
	assert_non_null(j);
	memset(j, ' ', big);
	j[big] = '\0';
	struct cache_view_ready r;
	char err[128];
	assert_int_equal(cache_view_ready_parse(j, big, &r, err, sizeof(err)), -EFBIG);
	free(j);
}

static void make_entry(const char *hex)
{
	sh("mkdir -p '%s/store/sha256/%s' && echo data > '%s/store/sha256/%s/f'", root, hex, root,
	   hex);
}

static void write_view(const char *scope, const char *name, const char *link_target)
{
	sh("mkdir -p '%s/caches/%s/%s' && ln -sfn '%s' '%s/caches/%s/%s/data'", root, scope, name,
	   link_target, root, scope, name);
}

static void test_open_data(void **state)
{
	(void)state;
	char err[256];
	int fd = -1;
	char *path = NULL;
	make_entry(HEX);
	make_entry(HEX2);

	write_view("ns", "good", "../../../store/sha256/" HEX);
	assert_int_equal(
	    cache_view_open_data(root, "ns", "good", DIGEST, &fd, &path, err, sizeof(err)), 0);
	assert_true(fd >= 0);
	assert_non_null(strstr(path, "/store/sha256/" HEX));
	close(fd);
	free(path);

	/* Cluster-scoped view. */
	write_view("_cluster", "shared", "../../../store/sha256/" HEX);
	assert_int_equal(
	    cache_view_open_data(root, NULL, "shared", DIGEST, &fd, &path, err, sizeof(err)), 0);
	close(fd);
	free(path);

	/* Pointing at another digest than ready.json: an update in flight. */
	write_view("ns", "other", "../../../store/sha256/" HEX2);
	fd = -7;
	path = NULL;
	assert_int_equal(
	    cache_view_open_data(root, "ns", "other", DIGEST, &fd, &path, err, sizeof(err)),
	    -ESTALE);
	assert_int_equal(fd, -7);
	assert_null(path);

	/* Escapes: relative link out of the store, absolute link elsewhere, the
	 * store itself, and a store entry that is itself a link outside. */
	sh("mkdir -p '%s/outside/" HEX "'", root);
	write_view("ns", "esc1", "../../../outside/" HEX);
	assert_int_equal(
	    cache_view_open_data(root, "ns", "esc1", DIGEST, &fd, &path, err, sizeof(err)), -EXDEV);
	assert_non_null(strstr(err, "outside the store"));
	write_view("ns", "esc2", "/etc");
	assert_int_equal(
	    cache_view_open_data(root, "ns", "esc2", DIGEST, &fd, &path, err, sizeof(err)), -EXDEV);
	write_view("ns", "esc3", "../../../store/sha256");
	assert_int_equal(
	    cache_view_open_data(root, "ns", "esc3", DIGEST, &fd, &path, err, sizeof(err)), -EXDEV);
	write_view("ns", "esc4", "../../../store/sha256/" HEX "/..");
	assert_int_equal(
	    cache_view_open_data(root, "ns", "esc4", DIGEST, &fd, &path, err, sizeof(err)), -EXDEV);
	sh("rm -rf '%s/store/sha256/" HEX2 "' && ln -s '%s/outside/" HEX "' '%s/store/sha256/" HEX2
	   "'",
	   root, root, root);
	assert_int_equal(
	    cache_view_open_data(root, "ns", "other", "sha256:" HEX2, &fd, &path, err, sizeof(err)),
	    -EXDEV);

	/* Dangling, missing, not a link, entry not a directory. */
	write_view("ns", "dangling", "../../../store/sha256/" HEX "x");
	assert_int_equal(
	    cache_view_open_data(root, "ns", "dangling", DIGEST, &fd, &path, err, sizeof(err)),
	    -ENOENT);
	assert_int_equal(
	    cache_view_open_data(root, "ns", "nosuch", DIGEST, &fd, &path, err, sizeof(err)),
	    -ENOENT);
	sh("mkdir -p '%s/caches/ns/realdir/data'", root);
	assert_int_equal(
	    cache_view_open_data(root, "ns", "realdir", DIGEST, &fd, &path, err, sizeof(err)),
	    -EINVAL);
	sh("mkdir -p '%s/store/sha256' && echo x > '%s/store/sha256/%s'", root, root,
	   "1111111111111111111111111111111111111111111111111111111111111111");
	write_view("ns", "file",
	           "../../../store/sha256/"
	           "1111111111111111111111111111111111111111111111111111111111111111");
	assert_int_equal(
	    cache_view_open_data(
	        root, "ns", "file",
	        "sha256:1111111111111111111111111111111111111111111111111111111111111111", &fd,
	        &path, err, sizeof(err)),
	    -ENOTDIR);

	/* Bad names never reach the file system. */
	assert_int_equal(
	    cache_view_open_data(root, "ns", "../../etc", DIGEST, &fd, &path, err, sizeof(err)),
	    -EINVAL);
	assert_int_equal(
	    cache_view_open_data(root, "../x", "good", DIGEST, &fd, &path, err, sizeof(err)),
	    -EINVAL);
}

static void test_publish_roundtrip(void **state)
{
	(void)state;
	make_entry(HEX);
	char *gpus[] = {"GPU-a"};
	struct cache_view_ready in = {
	    .digest = DIGEST,
	    .state = "Ready",
	    .compatible = true,
	    .compatible_gpus = gpus,
	    .ncompatible_gpus = 1,
	    .reason = "",
	    .message = "all good",
	    .updated = "2024-05-01T12:00:00Z",
	};
	assert_int_equal(cache_view_publish(root, "team", "c1", &in), 0);
	/* Publishing again replaces in place. */
	assert_int_equal(cache_view_publish(root, "team", "c1", &in), 0);

	struct cache_view_ready r;
	char err[256];
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), 0);
	assert_string_equal(r.digest, DIGEST);
	assert_string_equal(r.message, "all good");
	assert_int_equal(r.ncompatible_gpus, 1);
	assert_string_equal(r.compatible_gpus[0], "GPU-a");
	cache_view_ready_free(&r);

	char link[PATH_MAX], target[PATH_MAX] = "";
	snprintf(link, sizeof(link), "%s/caches/team/c1/data", root);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	assert_true(n > 0);
	target[n] = '\0';
	assert_string_equal(target, "../../../store/sha256/" HEX);

	int fd;
	char *path;
	assert_int_equal(
	    cache_view_open_data(root, "team", "c1", DIGEST, &fd, &path, err, sizeof(err)), 0);
	close(fd);
	free(path);

	/* Malformed ready.json is reported with the path. */
	sh("echo '{\"digest\": 1}' > '%s/caches/team/c1/ready.json'", root);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "ready.json is malformed"));

	assert_int_equal(cache_view_unpublish(root, "team", "c1"), 0);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), -ENOENT);
	assert_int_equal(cache_view_unpublish(root, "team", "c1"), 0);

	/* A store entry must exist before a view can name it. */
	in.digest[7] = 'f';
	assert_int_equal(cache_view_publish(root, "team", "c2", &in), -ENOENT);
}

/* Records of the states other than Ready: written in place of ready.json,
 * never making a cache mountable, whatever `data` links to. */
static void test_record_states(void **state)
{
	(void)state;
	struct cache_view_ready r;
	char err[256], linked[CACHE_VIEW_DIGEST_LEN + 1] = "";
	struct cache_view_ready pending = {.state = "Pending",
	                                   .compatible = true,
	                                   .reason = "DigestNotResolved",
	                                   .message = "waiting for the image digest"};
	assert_int_equal(cache_view_record(root, "team", "c1", &pending), 0);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), 0);
	assert_string_equal(r.state, "Pending");
	assert_string_equal(r.digest, "");
	assert_string_equal(r.message, "waiting for the image digest");
	cache_view_ready_free(&r);
	assert_int_equal(cache_view_linked_digest(root, "team", "c1", linked), -ENOENT);

	/* Only cache_view_publish() may say Ready; a bad digest is refused. */
	struct cache_view_ready ready = {.digest = DIGEST, .state = "Ready", .compatible = true};
	assert_int_equal(cache_view_record(root, "team", "c1", &ready), -EINVAL);
	struct cache_view_ready bad = {.digest = "sha256:abc", .state = "Failed"};
	assert_int_equal(cache_view_record(root, "team", "c1", &bad), -EINVAL);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), 0);
	assert_string_equal(r.state, "Pending");
	cache_view_ready_free(&r);

	/* Ready, then the image changes and the new one is pulled: the record
	 * says so while `data` still links the old digest. */
	make_entry(HEX);
	assert_int_equal(cache_view_publish(root, "team", "c1", &ready), 0);
	assert_int_equal(cache_view_linked_digest(root, "team", "c1", linked), 0);
	assert_string_equal(linked, DIGEST);
	struct cache_view_ready pulling = {.digest = "sha256:" HEX2,
	                                   .state = "Pulling",
	                                   .compatible = true,
	                                   .reason = "Pulling",
	                                   .message = "pulling and extracting the image"};
	assert_int_equal(cache_view_record(root, "team", "c1", &pulling), 0);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), 0);
	assert_string_equal(r.state, "Pulling");
	assert_string_equal(r.digest, "sha256:" HEX2);
	cache_view_ready_free(&r);
	assert_int_equal(cache_view_linked_digest(root, "team", "c1", linked), 0);
	assert_string_equal(linked, DIGEST);

	/* A data link that does not point into the store names no digest. */
	write_view("team", "c2", "/etc");
	assert_int_equal(cache_view_linked_digest(root, "team", "c2", linked), -EINVAL);
	write_view("team", "c3", "../../../store/sha256/" HEX "/../" HEX);
	assert_int_equal(cache_view_linked_digest(root, "team", "c3", linked), -EINVAL);

	assert_int_equal(cache_view_unpublish(root, "team", "c1"), 0);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), -ENOENT);
	assert_int_equal(cache_view_linked_digest(root, "team", "c1", linked), -ENOENT);
}

/* A record that replaces a Ready one is fsync'd (file and directory): a
 * power cut must not bring back a permission that was taken away. The
 * writes before a cache is first Ready are not: losing one leaves a record
 * that is not Ready. */
static void test_record_durability(void **state)
{
	(void)state;
	struct cache_view_ready pending = {.state = "Pending", .compatible = true};
	struct cache_view_ready pulling = {
	    .digest = DIGEST, .state = "Pulling", .compatible = true};
	struct cache_view_ready ready = {.digest = DIGEST, .state = "Ready", .compatible = true};
	struct cache_view_ready failed = {.digest = DIGEST, .state = "Failed", .compatible = true};
	struct cache_view_ready r;
	char err[256];
	make_entry(HEX);
	atomic_store(&fsyncs, 0);
	assert_int_equal(cache_view_record(root, "team", "c1", &pending), 0);
	assert_int_equal(cache_view_record(root, "team", "c1", &pulling), 0);
	assert_int_equal(cache_view_publish(root, "team", "c1", &ready), 0);
	assert_int_equal(atomic_load(&fsyncs), 0);

	/* Ready again (the GPUs changed, or another digest): durable */
	assert_int_equal(cache_view_publish(root, "team", "c1", &ready), 0);
	assert_int_equal(atomic_load(&fsyncs), 2);
	/* Ready taken away: durable */
	assert_int_equal(cache_view_record(root, "team", "c1", &failed), 0);
	assert_int_equal(atomic_load(&fsyncs), 4);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), 0);
	assert_string_equal(r.state, "Failed");
	cache_view_ready_free(&r);
	/* from Failed on: not */
	assert_int_equal(cache_view_record(root, "team", "c1", &pending), 0);
	assert_int_equal(atomic_load(&fsyncs), 4);

	/* A record that cannot be read lets nothing mount: replaced without fsync */
	sh("printf '' > '%s/caches/team/c1/ready.json'", root);
	assert_int_equal(cache_view_publish(root, "team", "c1", &ready), 0);
	assert_int_equal(atomic_load(&fsyncs), 4);
	assert_int_equal(cache_view_ready_read(root, "team", "c1", &r, err, sizeof(err)), 0);
	assert_string_equal(r.state, "Ready");
	cache_view_ready_free(&r);
}

static struct cache_view_pod pod(const char *vid, const char *digest)
{
	struct cache_view_pod p = {
	    .name = "p",
	    .namespace = "team",
	    .uid = "uid-1",
	    .volume_id = (char *)vid,
	    .target_path = "/var/lib/kubelet/pods/x/volumes/mount",
	    .digest = (char *)digest,
	    .read_only = true,
	    .started = 1714564800,
	};
	return p;
}

/* A finished pod leaves the list of pods for the finished ones, with its
 * record; the newest 16 are kept. */
static void test_usage_finished(void **state)
{
	(void)state;
	char run[PATH_MAX];
	snprintf(run, sizeof(run), "%s/run-fin", root);
	struct cache_view_pod a = pod("vol-a", DIGEST), b = pod("vol-b", DIGEST);
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &a), 0);
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &b), 0);
	cJSON *rec = cJSON_Parse("{\"podName\":\"p-a\",\"volumeId\":\"vol-a\",\"misses\":3}");
	assert_int_equal(cache_view_usage_finish(run, "team", "c1", "vol-a", rec), 0);
	struct cache_view_usage u;
	assert_int_equal(cache_view_usage_read(run, "team", "c1", &u), 0);
	assert_int_equal(u.npods, 1);
	assert_string_equal(u.pods[0].volume_id, "vol-b");
	assert_int_equal(cJSON_GetArraySize(u.finished), 1);
	const cJSON *f = cJSON_GetArrayItem(u.finished, 0);
	assert_int_equal(cJSON_GetObjectItem(f, "misses")->valueint, 3);
	assert_true(cJSON_IsString(cJSON_GetObjectItem(f, "finished")));
	cache_view_usage_free(&u);
	size_t n = 9;
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), 0);
	assert_int_equal(n, 1); /* finished pods use nothing */
	for (int i = 0; i < 20; i++) {
		cJSON_ReplaceItemInObject(rec, "misses", cJSON_CreateNumber(i));
		assert_int_equal(cache_view_usage_finish(run, "team", "c1", "gone", rec), 0);
	}
	assert_int_equal(cache_view_usage_read(run, "team", "c1", &u), 0);
	assert_int_equal(cJSON_GetArraySize(u.finished), CACHE_VIEW_FINISHED_MAX);
	assert_int_equal(
	    cJSON_GetObjectItem(cJSON_GetArrayItem(u.finished, 15), "misses")->valueint, 19);
	cache_view_usage_free(&u);
	assert_int_equal(cache_view_usage_finish(run, "team", "c1", "x", NULL), -EINVAL);
	cJSON_Delete(rec);
	/* a file whose finished pods are not objects is malformed */
	char path[PATH_MAX + 64];
	snprintf(path, sizeof(path), "%s/usage/team/c1/usage.json", run);
	FILE *fh = fopen(path, "w");
	assert_non_null(fh);
	fputs("{\"pods\":[],\"finished\":[7]}", fh);
	fclose(fh);
	assert_int_equal(cache_view_usage_read(run, "team", "c1", &u), -EINVAL);
}

static void test_usage(void **state)
{
	(void)state;
	char run[PATH_MAX];
	snprintf(run, sizeof(run), "%s/run", root);
	size_t n = 99;
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), 0);
	assert_int_equal(n, 0);

	/* every write of the file changes its stamp; reading does not */
	struct cache_view_usage_stamp none, s1, s2, s3;
	assert_int_equal(cache_view_usage_stamp(run, "team", "c1", &none), 0);
	assert_true(none.dev == 0 && none.ino == 0 && none.mtime_ns == 0 && none.size == 0);

	struct cache_view_pod a = pod("vol-a", DIGEST), b = pod("vol-b", DIGEST);
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &a), 0);
	assert_int_equal(cache_view_usage_stamp(run, "team", "c1", &s1), 0);
	assert_int_not_equal(s1.ino, 0);
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &b), 0);
	assert_int_equal(cache_view_usage_stamp(run, "team", "c1", &s2), 0);
	assert_memory_not_equal(&s1, &s2, sizeof(s1));
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &b), 0); /* replace, not dup */
	assert_int_equal(cache_view_usage_stamp(run, "team", "c1", &s3), 0);
	assert_memory_not_equal(&s2, &s3, sizeof(s2));
	assert_int_equal(cache_view_usage_stamp(run, "team", "c1", &s2), 0);
	assert_memory_equal(&s2, &s3, sizeof(s2)); /* read twice, unchanged */
	assert_int_equal(cache_view_usage_add(run, NULL, "shared", &a), 0);
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), 0);
	assert_int_equal(n, 2);

	struct cache_view_usage u;
	assert_int_equal(cache_view_usage_read(run, "team", "c1", &u), 0);
	assert_int_equal(u.npods, 2);
	assert_string_equal(u.namespace, "team");
	assert_string_equal(u.pods[0].volume_id, "vol-a");
	assert_string_equal(u.pods[0].target_path, "/var/lib/kubelet/pods/x/volumes/mount");
	assert_true(u.pods[0].read_only);
	assert_int_equal(u.pods[0].started, 1714564800);
	cache_view_usage_free(&u);

	bool used = false;
	assert_int_equal(cache_view_digest_in_use(run, DIGEST, &used), 0);
	assert_true(used);
	assert_int_equal(cache_view_digest_in_use(run, "sha256:" HEX2, &used), 0);
	assert_false(used);

	struct cache_view_usage *list;
	size_t nl;
	assert_int_equal(cache_view_usage_list(run, &list, &nl), 0);
	assert_int_equal(nl, 2);
	cache_view_usage_list_free(list, nl);

	assert_int_equal(cache_view_usage_remove(run, "team", "c1", "vol-a"), 0);
	assert_int_equal(cache_view_usage_remove(run, "team", "c1", "vol-a"), 0);
	assert_int_equal(cache_view_usage_remove(run, "team", "gone", "vol-a"), 0);
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(cache_view_usage_remove(run, "team", "c1", "vol-b"), 0);
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), 0);
	assert_int_equal(n, 0);

	/* A fallback volume is listed, says why, and uses nothing. */
	struct cache_view_pod fb = pod("vol-fb", "");
	fb.read_only = false;
	fb.fallback = true;
	fb.fallback_state = "Pulling";
	fb.fallback_reason = "Pulling";
	fb.fallback_message = "GKMCache team/c1 is not ready on this node yet";
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &fb), 0);
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(cache_view_usage_read(run, "team", "c1", &u), 0);
	assert_int_equal(u.npods, 1);
	assert_true(u.pods[0].fallback);
	assert_string_equal(u.pods[0].fallback_state, "Pulling");
	assert_string_equal(u.pods[0].fallback_reason, "Pulling");
	assert_string_equal(u.pods[0].fallback_message, fb.fallback_message);
	cache_view_usage_free(&u);
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &a), 0);
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(cache_view_usage_read(run, "team", "c1", &u), 0);
	assert_false(u.pods[1].fallback);
	assert_string_equal(u.pods[1].fallback_reason, "");
	cache_view_usage_free(&u);
	assert_int_equal(cache_view_usage_remove(run, "team", "c1", "vol-a"), 0);
	assert_int_equal(cache_view_usage_remove(run, "team", "c1", "vol-fb"), 0);
	sh("echo '{\"pods\":[{\"name\":\"p\",\"namespace\":\"team\",\"uid\":\"u\","
	   "\"volumeId\":\"v\",\"targetPath\":\"/t\",\"digest\":\"\",\"readOnly\":false,"
	   "\"started\":\"2024-05-01T12:00:00Z\",\"fallback\":\"yes\"}]}' > "
	   "'%s/usage/team/c1/usage.json'",
	   run);
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), -EINVAL);
	sh("rm '%s/usage/team/c1/usage.json'", run);

	/* A malformed usage file is an error for its cache (nothing is
	 * overwritten) and skipped by the list. */
	sh("echo '{\"pods\":[{\"name\":1}]}' > '%s/usage/team/c1/usage.json'", run);
	assert_int_equal(cache_view_in_use(run, "team", "c1", &n), -EINVAL);
	assert_int_equal(cache_view_usage_add(run, "team", "c1", &a), -EINVAL);
	sh("grep -q '\"name\":1' '%s/usage/team/c1/usage.json'", run);
	assert_int_equal(cache_view_usage_list(run, &list, &nl), 0);
	assert_int_equal(nl, 1);
	assert_string_equal(list[0].name, "shared");
	assert_string_equal(list[0].namespace, "");
	cache_view_usage_list_free(list, nl);

	/* No temp files left behind by atomic writes. */
	sh("test -z \"$(find '%s' -name '*.tmp')\"", run);
}

struct adder {
	char run[PATH_MAX];
	int id;
};

static void *add_many(void *arg)
{
	struct adder *a = arg;
	for (int i = 0; i < 10; i++) {
		char vid[32];
		snprintf(vid, sizeof(vid), "vol-%d-%d", a->id, i);
		struct cache_view_pod p = pod(vid, DIGEST);
		if (cache_view_usage_add(a->run, "team", "busy", &p) != 0)
			return (void *)1;
	}
	return NULL;
}

static void test_usage_concurrent(void **state)
{
	(void)state;
	struct adder a[8];
	pthread_t t[8];
	for (int i = 0; i < 8; i++) {
		snprintf(a[i].run, sizeof(a[i].run), "%s/run", root);
		a[i].id = i;
		assert_int_equal(pthread_create(&t[i], NULL, add_many, &a[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		void *ret;
		pthread_join(t[i], &ret);
		assert_null(ret);
	}
	size_t n;
	assert_int_equal(cache_view_in_use(a[0].run, "team", "busy", &n), 0);
	assert_int_equal(n, 80);
}

/* The ask for an evicted cache: the CSI plugin leaves it, the agent reads
 * when it was; it does not disturb the usage file beside it. */
static void test_wanted(void **state)
{
	(void)state;
	char run[600], path[700];
	int64_t at = 0;
	snprintf(run, sizeof(run), "%s/run", root);
	assert_int_equal(cache_view_wanted_at(run, "team", "llama", &at), -ENOENT);
	int64_t before = (int64_t)time(NULL);
	assert_int_equal(cache_view_want(run, "team", "llama"), 0);
	assert_int_equal(cache_view_wanted_at(run, "team", "llama", &at), 0);
	assert_true(at >= before);
	/* asked again later: the time moves */
	snprintf(path, sizeof(path), "%s/usage/team/llama/wanted", run);
	sh("touch -d @100 '%s'", path);
	assert_int_equal(cache_view_wanted_at(run, "team", "llama", &at), 0);
	assert_true(at == 100);
	assert_int_equal(cache_view_want(run, "team", "llama"), 0);
	assert_int_equal(cache_view_wanted_at(run, "team", "llama", &at), 0);
	assert_true(at >= before);
	/* cluster scope, and names that are no names */
	assert_int_equal(cache_view_want(run, "", "shared"), 0);
	snprintf(path, sizeof(path), "%s/usage/_cluster/shared/wanted", run);
	sh("test -f '%s'", path);
	assert_int_equal(cache_view_want(run, "team", "../x"), -EINVAL);
	assert_int_equal(cache_view_wanted_at(run, "../x", "y", &at), -EINVAL);
	/* something else in its place is no ask */
	snprintf(path, sizeof(path), "%s/usage/team/odd/wanted", run);
	sh("mkdir -p '%s'", path);
	assert_int_equal(cache_view_wanted_at(run, "team", "odd", &at), -EINVAL);
	struct cache_view_usage u;
	assert_int_equal(cache_view_usage_read(run, "team", "llama", &u), 0);
	assert_int_equal(u.npods, 0);
	cache_view_usage_free(&u);
}

/* The capture marker (agent) and the hand-over of a volume's directory
 * (CSI plugin). */
static void test_capture(void **state)
{
	(void)state;
	make_entry(HEX);
	struct cache_view_ready in = {.digest = DIGEST,
	                              .state = "Ready",
	                              .compatible = true,
	                              .reason = "",
	                              .message = "",
	                              .updated = "2024-05-01T12:00:00Z"};
	assert_int_equal(cache_view_publish(root, "team", "c1", &in), 0);
	assert_false(cache_view_capture_on(root, "team", "c1"));
	assert_int_equal(cache_view_capture_set(root, "team", "c1", true), 0);
	assert_true(cache_view_capture_on(root, "team", "c1"));
	assert_int_equal(cache_view_capture_set(root, "team", "c1", true), 0);
	assert_false(cache_view_capture_on(root, "team", "c2"));
	assert_false(cache_view_capture_on(root, "team", "../c1"));
	assert_int_equal(cache_view_capture_set(root, "team", "../c1", true), -EINVAL);

	/* a volume's directory moves, upper layer and all, with pod.json beside it */
	char vdir[PATH_MAX], dir[PATH_MAX];
	snprintf(vdir, sizeof(vdir), "%s/csi/volumes/v-1", root);
	sh("mkdir -p '%s/upper/io.triton.cache/H' && echo k > '%s/upper/io.triton.cache/H/k.cubin'",
	   vdir, vdir);
	assert_int_equal(
	    cache_view_capture_handover(root, "team", "c1", "v-1", vdir, "{\"name\":\"p\"}"), 0);
	assert_int_equal(access(vdir, F_OK), -1);
	snprintf(dir, sizeof(dir), "%s/captures/team/c1", root);
	sh("test \"$(cat '%s'/v-1.*/upper/io.triton.cache/H/k.cubin)\" = k && "
	   "grep -q '\"name\":\"p\"' '%s'/v-1.*/pod.json",
	   dir, dir);
	/* nothing there to hand over: an error, nothing created */
	assert_int_equal(cache_view_capture_handover(root, "team", "c1", "v-2", vdir, "{}"),
	                 -ENOENT);

	/* the marker goes with the view */
	assert_int_equal(cache_view_unpublish(root, "team", "c1"), 0);
	assert_false(cache_view_capture_on(root, "team", "c1"));
	assert_int_equal(cache_view_capture_set(root, "team", "c1", false), 0);
}

static void test_rfc3339(void **state)
{
	(void)state;
	char buf[40];
	cache_view_rfc3339(0, buf, sizeof(buf));
	assert_string_equal(buf, "1970-01-01T00:00:00Z");
	time_t t;
	assert_int_equal(cache_view_parse_rfc3339("2024-05-01T12:00:00Z", &t), 0);
	assert_int_equal(t, 1714564800);
	assert_int_equal(cache_view_parse_rfc3339("2024-05-01T12:00:00Zjunk", &t), -EINVAL);
	assert_int_equal(cache_view_parse_rfc3339("yesterday", &t), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test(test_ready_parse_good),
	    cmocka_unit_test(test_ready_parse_malformed),
	    cmocka_unit_test_setup_teardown(test_open_data, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_publish_roundtrip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_record_states, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_record_durability, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_usage, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_usage_finished, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_usage_concurrent, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_capture, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_wanted, setup, teardown),
	    cmocka_unit_test(test_rfc3339),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
