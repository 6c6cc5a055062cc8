/* The daemons' object store on the API server (objstore_kube.c), against
 * the recorded exchanges of a real API server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>

#include "objstore_kube.h"
#include "kube_replay.h"

struct senv {
	struct replay *srv;
	char dir[256];
	char kubeconfig[300];
	struct loop *l;
	struct objstore *s;
	unsigned added, synced;
	bool stopped;
};

static int ssetup(void **state)
{
	struct senv *e = calloc(1, sizeof(*e));
	e->srv = replay_start();
	snprintf(e->dir, sizeof(e->dir), "%s/okube.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	assert_non_null(mkdtemp(e->dir));
	snprintf(e->kubeconfig, sizeof(e->kubeconfig), "%s/config", e->dir);
	FILE *f = fopen(e->kubeconfig, "w");
	fprintf(
	    f,
	    "current-context: t\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:%d'}}]\n"
	    "contexts: [{name: t, context: {cluster: c, user: u}}]\n"
	    "users: [{name: u, user: {token: tok}}]\n",
	    e->srv->port);
	fclose(f);
	assert_int_equal(loop_new(&e->l), 0);
	char err[256];
	assert_int_equal(objstore_kube_new(e->kubeconfig, NULL, e->l, "gkm-test", "node-1", &e->s,
	                                   err, sizeof(err)),
	                 0);
	*state = e;
	return 0;
}

static int steardown(void **state)
{
	struct senv *e = *state;
	if (!e->stopped)
		e->s->ops->free(e->s);
	loop_free(e->l);
	replay_stop(e->srv);
	unlink(e->kubeconfig);
	rmdir(e->dir);
	free(e);
	return 0;
}

static void on_event(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct senv *e = ud;
	if (t == OBJSTORE_ADDED && kube_obj_name(obj))
		e->added++;
}

static void stop_now(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

static void on_synced(void *ud)
{
	struct senv *e = ud;
	e->synced++;
	/* free the store (its informers) from the loop, then let the drains
	 * posted before run out */
	e->s->ops->free(e->s);
	e->stopped = true;
	assert_int_equal(loop_post(e->l, stop_now, NULL), 0);
}

static void give_up(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

static void test_watch_delivers_on_loop(void **state)
{
	struct senv *e = *state;
	cJSON *fx = replay_load("29-list-for-rv.json");
	replay_push_fixture(e->srv, fx);
	cJSON_Delete(fx);
	struct objstore_watch w = {.api_version = "gkm.io/v1alpha1",
	                           .kind = "GKMCache",
	                           .namespace_ = "default",
	                           .label_selector = "app=demo",
	                           .on_event = on_event,
	                           .on_synced = on_synced,
	                           .ud = e};
	assert_int_equal(e->s->ops->watch(e->s, &w), 0);
	loop_add_timer(e->l, 20000, give_up, NULL);
	assert_int_equal(loop_run(e->l), 0);
	assert_int_equal(e->synced, 1);
	assert_int_equal(e->added, 5);
	assert_non_null(
	    strstr(e->srv->req[0].path, "/apis/gkm.io/v1alpha1/namespaces/default/gkmcaches?"));
	assert_non_null(strstr(e->srv->req[0].path, "labelSelector=app%3Ddemo"));
	/* kinds that would need discovery (a blocking call) are refused on the loop */
	struct objstore *s2 = NULL;
	char err[128];
	assert_int_equal(
	    objstore_kube_new(e->kubeconfig, NULL, e->l, NULL, NULL, &s2, err, sizeof(err)), 0);
	struct objstore_watch bad = {
	    .api_version = "example.com/v1", .kind = "Widget", .on_event = on_event};
	assert_int_equal(s2->ops->watch(s2, &bad), -ENOENT);
	s2->ops->free(s2);
}

static void test_apply_get_remove_event(void **state)
{
	struct senv *e = *state;
	/* apply: the recorded status apply of agent/node-1 (a Widget) */
	cJSON *f13 = replay_load("13-ssa-status-node1.json");
	replay_push_fixture(e->srv, f13);
	cJSON *f32 = replay_load("32-get-missing.json");
	cJSON *f38 = replay_load("38-delete.json");
	cJSON *f44 = replay_load("44-event-create-core.json");
	replay_push_fixture(e->srv, f32);
	replay_push_fixture(e->srv, f38);
	replay_push_fixture(e->srv, f44);
	cJSON *obj =
	    cJSON_Parse("{\"apiVersion\":\"gkm.io/v1alpha1\",\"kind\":\"GKMCache\","
	                "\"metadata\":{\"name\":\"w2\",\"namespace\":\"default\"},"
	                "\"status\":{\"nodes\":[{\"name\":\"node-1\",\"state\":\"Ready\"}]}}");
	cJSON *res = NULL;
	char err[256] = "";
	assert_int_equal(
	    e->s->ops->apply(e->s, obj, "gkm-agent/node-1", true, &res, err, sizeof(err)), 0);
	assert_string_equal(kube_obj_rv(res), "325");
	assert_string_equal(e->srv->req[0].method, "PATCH");
	assert_string_equal(e->srv->req[0].content_type, "application/apply-patch+yaml");
	assert_string_equal(e->srv->req[0].path,
	                    "/apis/gkm.io/v1alpha1/namespaces/default/gkmcaches/w2/status"
	                    "?fieldManager=gkm-agent%2Fnode-1&force=true");
	cJSON_Delete(res);
	cJSON *got = NULL;
	assert_int_equal(e->s->ops->get(e->s, "gkm.io/v1alpha1", "GKMCache", "default", "nope",
	                                &got, err, sizeof(err)),
	                 -ENOENT);
	assert_non_null(strstr(err, "not found"));
	assert_int_equal(e->s->ops->remove(e->s, "gkm.io/v1alpha1", "GKMCache", "default", "w5",
	                                   err, sizeof(err)),
	                 0);
	assert_string_equal(e->srv->req[2].method, "DELETE");
	cJSON *w1 = cJSON_Parse(
	    "{\"apiVersion\":\"gkm.io/v1alpha1\",\"kind\":\"GKMCache\","
	    "\"metadata\":{\"name\":\"w1\",\"namespace\":\"default\",\"uid\":\"u-1\"}}");
	assert_int_equal(e->s->ops->event(e->s, w1, "Warning", "Incompatible", "no GPU fits", NULL),
	                 0);
	cJSON *ev = cJSON_Parse(e->srv->req[3].body);
	assert_string_equal(kube_obj_str(ev, "source", "component"), "gkm-test");
	assert_string_equal(kube_obj_str(ev, "source", "host"), "node-1");
	assert_string_equal(kube_obj_str(ev, "involvedObject", "uid"), "u-1");
	assert_string_equal(kube_obj_str(ev, NULL, "type"), "Warning");
	cJSON_Delete(ev);
	cJSON_Delete(w1);
	cJSON_Delete(obj);
	cJSON_Delete(f13);
	cJSON_Delete(f32);
	cJSON_Delete(f38);
	cJSON_Delete(f44);
}

static void test_bad_kubeconfig(void **state)
{
	(void)state;
	struct objstore *s = NULL;
	char err[256] = "";
	assert_int_equal(objstore_kube_new("/nonexistent/kubeconfig", NULL, NULL, NULL, NULL, &s,
	                                   err, sizeof(err)),
	                 -ENOENT);
	assert_null(s);
	assert_non_null(strstr(err, "/nonexistent/kubeconfig"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_watch_delivers_on_loop, ssetup, steardown),
	    cmocka_unit_test_setup_teardown(test_apply_get_remove_event, ssetup, steardown),
	    cmocka_unit_test(test_bad_kubeconfig),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
