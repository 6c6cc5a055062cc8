/* core/fallback_notice: the Event each fallback volume's pod gets, once per
 * volume, recorded through the real file object store (events.jsonl) by the
 * real worker pool. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fallback_notice.h"
#include "fsutil.h"
#include "loop.h"
#include "objstore.h"
#include "workers.h"

static char dir[256];

static struct cache_view_pod fallback_pod(const char *name, const char *volume_id)
{
	struct cache_view_pod p = {
	    .name = (char *)name,
	    .namespace = "team-a",
	    .uid = "uid-1",
	    .volume_id = (char *)volume_id,
	    .target_path = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/c/mount",
	    .digest = "",
	    .fallback = true,
	    .fallback_state = "Pulling",
	    .fallback_reason = "Pulling",
	    .fallback_message = "GKMCache team-a/llama is not ready on this node yet (Pulling: "
	                        "pulling and extracting the image)",
	};
	return p;
}

static void test_event(void **state)
{
	(void)state;
	struct cache_view_pod p = fallback_pod("vllm-0", "csi-abc");
	cJSON *reg = NULL;
	char msg[1024];
	assert_int_equal(fallback_notice_event(&p, &reg, msg, sizeof(msg)), 0);
	assert_string_equal(obj_str(reg, "apiVersion"), "v1");
	assert_string_equal(obj_str(reg, "kind"), "Pod");
	assert_string_equal(obj_str(reg, "metadata.name"), "vllm-0");
	assert_string_equal(obj_str(reg, "metadata.namespace"), "team-a");
	assert_string_equal(obj_str(reg, "metadata.uid"), "uid-1");
	cJSON_Delete(reg);
	assert_string_equal(msg, "GKMCache team-a/llama is not ready on this node yet (Pulling: "
	                         "pulling and extracting the image); volume csi-abc is an empty, "
	                         "writable directory instead (onMiss: empty), so the kernels are "
	                         "compiled as without a cache");

	/* Nothing to tell: no fallback, or no pod named. */
	p.fallback = false;
	assert_int_equal(fallback_notice_event(&p, &reg, msg, sizeof(msg)), -EINVAL);
	p = fallback_pod("", "csi-abc");
	assert_int_equal(fallback_notice_event(&p, &reg, msg, sizeof(msg)), -EINVAL);
}

/* Events recorded so far: "<pod> <reason>|..." per line of events.jsonl. */
static char *events(void)
{
	char path[300], *text = NULL;
	size_t len = 0;
	snprintf(path, sizeof(path), "%s/events.jsonl", dir);
	if (fsutil_read_file(path, 1 << 20, &text, &len) != 0)
		return strdup("");
	return text;
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

/* A notice recording into a file object store in dir. */
struct env {
	struct loop *l;
	struct objstore *os;
	struct workers *w;
	struct fallback_notice *fn;
};

static void env_start(struct env *e)
{
	memset(e, 0, sizeof(*e));
	assert_int_equal(loop_new(&e->l), 0);
	assert_int_equal(objstore_file_new(dir, e->l, 1000, &e->os), 0);
	assert_int_equal(workers_new(e->l, 2, &e->w), 0);
	assert_int_equal(fallback_notice_new(e->w, e->os, &e->fn), 0);
}

/* Waits for the Events on their way; returns what events.jsonl holds
 * (caller frees). */
static char *env_stop(struct env *e)
{
	workers_free(e->w);
	loop_drain(e->l);
	char *ev = events();
	fallback_notice_free(e->fn);
	e->os->ops->free(e->os);
	loop_free(e->l);
	return ev;
}

static void test_once_per_volume(void **state)
{
	(void)state;
	struct env env;
	env_start(&env);
	struct fallback_notice *fn = env.fn;

	struct cache_view_pod pods[3] = {fallback_pod("a", "v-a"), fallback_pod("b", "v-b"),
	                                 fallback_pod("c", "v-c")};
	pods[2].fallback = false; /* a volume of the cache itself */
	struct cache_view_usage u = {
	    .namespace = "team-a", .name = "llama", .pods = pods, .npods = 3};
	fallback_notice_usage(fn, "team-a/llama", &u);
	fallback_notice_usage(fn, "team-a/llama", &u); /* read again: nothing new */
	/* Another cache with the same volume ids is another volume. */
	fallback_notice_usage(fn, "team-a/other", &u);
	/* v-a is gone, then a new volume of that id is told again. */
	u.pods = &pods[1];
	u.npods = 2;
	fallback_notice_usage(fn, "team-a/llama", &u);
	u.pods = pods;
	u.npods = 3;
	fallback_notice_usage(fn, "team-a/llama", &u);
	/* A cache the agent forgets forgets its volumes. */
	fallback_notice_usage(fn, "team-a/other", NULL);
	fallback_notice_usage(fn, "team-a/other", &u);

	char *ev = env_stop(&env);
	assert_int_equal(count(ev, "\"reason\":\"CacheFallback\""), 7);
	assert_int_equal(count(ev, "\"name\":\"a\""), 4);
	assert_int_equal(count(ev, "\"name\":\"b\""), 3);
	assert_int_equal(count(ev, "\"name\":\"c\""), 0);
	assert_int_equal(count(ev, "\"type\":\"Warning\""), 7);
	assert_int_equal(count(ev, "\"kind\":\"Pod\""), 7);
	assert_int_equal(count(ev, "volume v-b is an empty, writable directory instead"), 3);
	free(ev);
}

/* The usage files themselves, of any cache: told once, forgotten with the
 * file, told again when it comes back. */
static void test_scan(void **state)
{
	(void)state;
	struct env env;
	env_start(&env);
	struct fallback_notice *fn = env.fn;
	char run[300];
	snprintf(run, sizeof(run), "%s/run", dir);

	struct cache_view_pod a = fallback_pod("a", "v-a"), b = fallback_pod("b", "v-b");
	assert_int_equal(cache_view_usage_add(run, "team-a", "nosuch", &a), 0);
	assert_int_equal(cache_view_usage_add(run, NULL, "shared", &b), 0);
	fallback_notice_scan(fn, run);
	fallback_notice_scan(fn, run);
	/* What a reconcile of a known cache reads is the same volume. */
	struct cache_view_usage u;
	assert_int_equal(cache_view_usage_read(run, NULL, "shared", &u), 0);
	fallback_notice_usage(fn, "_cluster/shared", &u);
	cache_view_usage_free(&u);
	assert_int_equal(cache_view_usage_remove(run, "team-a", "nosuch", "v-a"), 0);
	fallback_notice_scan(fn, run);
	assert_int_equal(cache_view_usage_add(run, "team-a", "nosuch", &a), 0);
	fallback_notice_scan(fn, run);

	char *ev = env_stop(&env);
	assert_int_equal(count(ev, "\"name\":\"a\""), 2);
	assert_int_equal(count(ev, "\"name\":\"b\""), 1);
	free(ev);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "%s/gkm-notice.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_event),
	    cmocka_unit_test_setup_teardown(test_once_per_volume, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_scan, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
