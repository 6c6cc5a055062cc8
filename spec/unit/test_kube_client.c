/* The API client against the recorded exchanges of a real API server:
 * each test replays a fixture's response through a loopback server and
 * checks what the client sent and what it made of the answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>

#include "kube_client.h"
#include "metrics.h"
#include "kube_replay.h"

struct env {
	struct replay *srv;
	struct kube_config *cfg;
	struct kube_client *c;
	char dir[256];
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	e->srv = replay_start();
	snprintf(e->dir, sizeof(e->dir), "%s/kcfg.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	assert_non_null(mkdtemp(e->dir));
	char path[512];
	snprintf(path, sizeof(path), "%s/config", e->dir);
	FILE *f = fopen(path, "w");
	fprintf(f,
	        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
	        "clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:%d/\n"
	        "contexts:\n- name: t\n  context: {cluster: c, user: u, namespace: default}\n"
	        "users:\n- name: u\n  user:\n    token: s3cret\n",
	        e->srv->port);
	fclose(f);
	char err[256];
	assert_int_equal(kube_config_load_file(path, NULL, &e->cfg, err, sizeof(err)), 0);
	struct kube_client_opts o = {.request_timeout_ms = 3000, .max_response = 1 << 20};
	assert_int_equal(kube_client_new(e->cfg, &o, &e->c), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	kube_client_free(e->c);
	kube_config_free(e->cfg);
	replay_stop(e->srv);
	char path[512];
	snprintf(path, sizeof(path), "%s/config", e->dir);
	unlink(path);
	rmdir(e->dir);
	free(e);
	return 0;
}

static cJSON *fixture(const char *name)
{
	cJSON *j = replay_load(name);
	if (!j)
		fail_msg("fixture %s not found (KUBE_FIXTURES)", name);
	return j;
}

/* Push the fixture's response; returns the parsed fixture (caller frees). */
static cJSON *script(struct env *e, const char *name)
{
	cJSON *fx = fixture(name);
	replay_push_fixture(e->srv, fx);
	return fx;
}

static const char *req_path(const cJSON *fx)
{
	return cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "request"), "path")->valuestring;
}

static void pct_decode(const char *in, char *out, size_t len)
{
	size_t j = 0;
	for (size_t i = 0; in[i] && j + 1 < len; i++) {
		if (in[i] == '%' && in[i + 1] && in[i + 2]) {
			char hx[3] = {in[i + 1], in[i + 2], 0};
			out[j++] = (char)strtol(hx, NULL, 16);
			i += 2;
		} else {
			out[j++] = in[i];
		}
	}
	out[j] = 0;
}

/* The request the client sent equals the recorded one (after decoding). */
static void assert_same_path(const struct replay_req *q, const cJSON *fx)
{
	char a[4096], b[4096];
	pct_decode(q->path, a, sizeof(a));
	pct_decode(req_path(fx), b, sizeof(b));
	assert_string_equal(a, b);
}

static struct kube_resource widgets(void)
{
	struct kube_resource r = {.group = "example.com",
	                          .version = "v1",
	                          .plural = "widgets",
	                          .kind = "Widget",
	                          .namespaced = true};
	return r;
}

static void test_get(void **state)
{
	struct env *e = *state;
	cJSON *fx = script(e, "08-get.json");
	struct kube_resource r = widgets();
	cJSON *obj = NULL;
	struct kube_error err;
	assert_int_equal(kube_client_get(e->c, &r, "default", "w1", &obj, &err), 0);
	assert_string_equal(kube_obj_uid(obj), "4d47fcc8-f340-4b42-a070-65df24648a0f");
	assert_string_equal(kube_obj_rv(obj), "322");
	assert_string_equal(e->srv->req[0].method, "GET");
	assert_same_path(&e->srv->req[0], fx);
	assert_string_equal(e->srv->req[0].authorization, "Bearer s3cret");
	struct metric *m = metrics_counter("gkm_kube_requests_total", "", "verb,code");
	assert_true(metrics_value(m, METRICS_L("GET", "200")) >= 1);
	cJSON_Delete(obj);
	cJSON_Delete(fx);
}

static void test_get_missing(void **state)
{
	struct env *e = *state;
	cJSON *fx = script(e, "32-get-missing.json");
	struct kube_resource r = widgets();
	cJSON *obj = NULL;
	struct kube_error err;
	assert_int_equal(kube_client_get(e->c, &r, "default", "nope", &obj, &err), -ENOENT);
	assert_null(obj);
	assert_int_equal(err.http_code, 404);
	assert_int_equal(err.reason, KUBE_NOT_FOUND);
	assert_string_equal(err.name, "nope");
	assert_string_equal(err.message, "widgets.example.com \"nope\" not found");
	assert_false(kube_error_retryable(&err));
	cJSON_Delete(fx);
}

static void test_create(void **state)
{
	struct env *e = *state;
	cJSON *fx = script(e, "07-create.json");
	struct kube_resource r = widgets();
	cJSON *body = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "request"), "body");
	cJSON *out = NULL;
	struct kube_error err;
	assert_int_equal(kube_client_create(e->c, &r, "default", body, &out, &err), 0);
	assert_int_equal(err.http_code, 201);
	assert_string_equal(kube_obj_rv(out), "322");
	struct replay_req *q = &e->srv->req[0];
	assert_string_equal(q->method, "POST");
	assert_same_path(q, fx);
	assert_string_equal(q->content_type, "application/json");
	cJSON *sent = cJSON_Parse(q->body);
	assert_true(cJSON_Compare(sent, body, true));
	cJSON_Delete(sent);
	cJSON_Delete(out);
	cJSON_Delete(fx);
}

static void test_create_invalid(void **state)
{
	struct env *e = *state;
	cJSON *fx = script(e, "33-create-invalid.json");
	struct kube_resource r = widgets();
	cJSON *body = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "request"), "body");
	struct kube_error err;
	assert_int_equal(kube_client_create(e->c, &r, "default", body, NULL, &err), -EINVAL);
	assert_int_equal(err.reason, KUBE_INVALID);
	assert_int_equal(err.ncauses, 2);
	assert_string_equal(err.causes[0].reason, "FieldValueInvalid");
	assert_string_equal(err.causes[0].field, "spec.size");
	assert_string_equal(err.causes[1].reason, "FieldValueRequired");
	assert_string_equal(err.causes[1].field, "spec.image");
	assert_string_equal(err.kind, "Widget");
	cJSON_Delete(fx);
}

static void test_create_malformed_and_media(void **state)
{
	struct env *e = *state;
	cJSON *fx1 = script(e, "34-create-malformed.json");
	cJSON *fx2 = script(e, "35-patch-wrong-type.json");
	cJSON *out = NULL;
	struct kube_error err;
	struct kube_request rq = {.method = "POST",
	                          .path = req_path(fx1),
	                          .content_type = "application/json",
	                          .body = "{\"apiVersion\": \"example.com/v1\", \"kind\": ",
	                          .body_len = 41};
	assert_int_equal(kube_client_do(e->c, &rq, &out, &err), -EINVAL);
	assert_int_equal(err.reason, KUBE_BAD_REQUEST);
	assert_int_equal(err.http_code, 400);
	assert_non_null(strstr(err.message, "json parse error"));
	struct kube_request rq2 = {.method = "PATCH",
	                           .path = req_path(fx2),
	                           .content_type = "text/plain",
	                           .body = "{}",
	                           .body_len = 2};
	assert_int_equal(kube_client_do(e->c, &rq2, &out, &err), -EINVAL);
	assert_int_equal(err.reason, KUBE_UNSUPPORTED_MEDIA);
	assert_string_equal(err.reason_text, "UnsupportedMediaType");
	assert_null(out);
	cJSON_Delete(fx1);
	cJSON_Delete(fx2);
}

static cJSON *yaml_body(const cJSON *fx)
{
	const char *y =
	    cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "request"), "body")->valuestring;
	cJSON *j = NULL;
	char err[128];
	assert_int_equal(kube_config_yaml_to_json(y, strlen(y), &j, err, sizeof(err)), 0);
	return j;
}

static void test_apply_conflict_force(void **state)
{
	struct env *e = *state;
	cJSON *f10 = script(e, "10-ssa-create.json");
	cJSON *f11 = script(e, "11-ssa-conflict.json");
	cJSON *f12 = script(e, "12-ssa-force.json");
	struct kube_resource r = widgets();
	struct kube_error err;
	cJSON *out = NULL;
	cJSON *alice = yaml_body(f10), *bob = yaml_body(f11);
	struct kube_apply_opts oa = {.field_manager = "alice"};
	assert_int_equal(kube_client_apply(e->c, &r, "default", NULL, alice, &oa, &out, &err), 0);
	assert_int_equal(err.http_code, 201);
	cJSON_Delete(out);
	out = NULL;
	struct kube_apply_opts ob = {.field_manager = "bob"};
	assert_int_equal(kube_client_apply(e->c, &r, "default", NULL, bob, &ob, &out, &err),
	                 -EBUSY);
	assert_int_equal(err.reason, KUBE_CONFLICT);
	assert_int_equal(err.ncauses, 1);
	assert_string_equal(err.causes[0].reason, "FieldManagerConflict");
	assert_string_equal(err.causes[0].field, ".spec.size");
	assert_string_equal(err.causes[0].message, "conflict with \"alice\"");
	ob.force = true;
	assert_int_equal(kube_client_apply(e->c, &r, "default", NULL, bob, &ob, &out, &err), 0);
	assert_int_equal(
	    (int)cJSON_GetObjectItem(cJSON_GetObjectItem(out, "spec"), "size")->valuedouble, 3);
	cJSON_Delete(out);
	const cJSON *fx[] = {f10, f11, f12};
	for (int i = 0; i < 3; i++) {
		struct replay_req *q = &e->srv->req[i];
		assert_string_equal(q->method, "PATCH");
		assert_string_equal(q->content_type, "application/apply-patch+yaml");
		assert_same_path(q, fx[i]);
		/* The JSON we send is the same document as the recorded YAML. */
		cJSON *sent = cJSON_Parse(q->body), *want = yaml_body(fx[i]);
		assert_true(cJSON_Compare(sent, want, true));
		cJSON_Delete(sent);
		cJSON_Delete(want);
	}
	cJSON_Delete(alice);
	cJSON_Delete(bob);
	cJSON_Delete(f10);
	cJSON_Delete(f11);
	cJSON_Delete(f12);
}

static void test_apply_status(void **state)
{
	struct env *e = *state;
	const char *files[] = {"13-ssa-status-node1.json", "14-ssa-status-node2.json",
	                       "15-ssa-status-node1-withdraws.json"};
	const char *mgr[] = {"agent/node-1", "agent/node-2", "agent/node-1"};
	struct kube_resource r = widgets();
	for (int i = 0; i < 3; i++) {
		cJSON *fx = script(e, files[i]);
		cJSON *obj = yaml_body(fx), *out = NULL;
		struct kube_apply_opts o = {.field_manager = mgr[i], .force = true, .status = true};
		struct kube_error err;
		assert_int_equal(kube_client_apply(e->c, &r, "default", NULL, obj, &o, &out, &err),
		                 0);
		assert_same_path(&e->srv->req[i], fx);
		cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "response"), "body");
		assert_true(cJSON_Compare(out, want, true));
		cJSON_Delete(out);
		cJSON_Delete(obj);
		cJSON_Delete(fx);
	}
}

static void test_replace_stale(void **state)
{
	struct env *e = *state;
	cJSON *fx = script(e, "17-update-stale-rv.json");
	struct kube_resource r = widgets();
	cJSON *body = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "request"), "body");
	struct kube_error err;
	assert_int_equal(kube_client_replace(e->c, &r, "default", NULL, body, NULL, &err), -EBUSY);
	assert_int_equal(err.reason, KUBE_CONFLICT);
	assert_string_equal(e->srv->req[0].method, "PUT");
	assert_same_path(&e->srv->req[0], fx);
	assert_false(kube_error_retryable(&err));
	cJSON_Delete(fx);
}

static void test_list_pages(void **state)
{
	struct env *e = *state;
	cJSON *f24 = script(e, "24-list-limit.json");
	cJSON *f25 = script(e, "25-list-continue.json");
	/* The last page was not recorded: w5 as the final page, no continue. */
	cJSON *f36 = fixture("36-get-w5.json");
	cJSON *last = cJSON_CreateObject();
	cJSON *items = cJSON_AddArrayToObject(last, "items");
	cJSON_AddItemToArray(
	    items, cJSON_Duplicate(
	               cJSON_GetObjectItem(cJSON_GetObjectItem(f36, "response"), "body"), true));
	cJSON *meta = cJSON_AddObjectToObject(last, "metadata");
	cJSON_AddStringToObject(meta, "resourceVersion", "332");
	cJSON_AddStringToObject(meta, "continue", "");
	char *t = cJSON_PrintUnformatted(last);
	replay_push(e->srv, 200, t, strlen(t), false);
	free(t);

	struct kube_resource r = widgets();
	struct kube_list_opts o = {.limit = 2};
	cJSON *out = NULL;
	char rv[32];
	struct kube_error err;
	assert_int_equal(kube_client_list(e->c, &r, "default", &o, &out, rv, sizeof(rv), &err), 0);
	assert_int_equal(cJSON_GetArraySize(out), 5);
	assert_string_equal(rv, "332");
	const char *names[] = {"w1", "w2", "w3", "w4", "w5"};
	for (int i = 0; i < 5; i++)
		assert_string_equal(kube_obj_name(cJSON_GetArrayItem(out, i)), names[i]);
	assert_same_path(&e->srv->req[0], f24);
	assert_same_path(&e->srv->req[1], f25);
	/* One connection served all three pages (keep-alive). */
	assert_int_equal(e->srv->connections, 1);
	cJSON_Delete(out);
	cJSON_Delete(last);
	cJSON_Delete(f24);
	cJSON_Delete(f25);
	cJSON_Delete(f36);
}

static void test_list_selectors(void **state)
{
	struct env *e = *state;
	cJSON *f26 = script(e, "26-list-label-selector.json");
	cJSON *f27 = script(e, "27-list-field-selector.json");
	struct kube_resource r = widgets();
	cJSON *out = NULL;
	char rv[32];
	struct kube_error err;
	struct kube_list_opts o = {.label_selector = "app=demo"};
	assert_int_equal(kube_client_list(e->c, &r, "default", &o, &out, rv, sizeof(rv), &err), 0);
	assert_int_equal(cJSON_GetArraySize(out), 3);
	/* Exactly the encoding the recorded request used. */
	assert_non_null(strstr(e->srv->req[0].path, "labelSelector=app%3Ddemo"));
	cJSON_Delete(out);
	struct kube_list_opts o2 = {.field_selector = "metadata.name=w3"};
	assert_int_equal(kube_client_list(e->c, &r, "default", &o2, &out, rv, sizeof(rv), &err), 0);
	assert_int_equal(cJSON_GetArraySize(out), 1);
	assert_non_null(strstr(e->srv->req[1].path, "fieldSelector=metadata.name%3Dw3"));
	cJSON_Delete(out);
	cJSON_Delete(f26);
	cJSON_Delete(f27);
}

static void test_list_expired_continue_restarts(void **state)
{
	struct env *e = *state;
	cJSON *f24 = script(e, "24-list-limit.json");
	const char *gone = "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\","
	                   "\"message\":\"The provided continue parameter is too old\","
	                   "\"reason\":\"Expired\",\"code\":410}";
	replay_push(e->srv, 410, gone, strlen(gone), false);
	cJSON *f26 = script(e, "26-list-label-selector.json"); /* a complete list */
	struct kube_resource r = widgets();
	cJSON *out = NULL;
	char rv[32];
	struct kube_error err;
	struct kube_list_opts o = {.limit = 2};
	assert_int_equal(kube_client_list(e->c, &r, "default", &o, &out, rv, sizeof(rv), &err), 0);
	/* Only the fresh list's items, nothing kept from the abandoned one. */
	assert_int_equal(cJSON_GetArraySize(out), 3);
	assert_null(strstr(e->srv->req[2].path, "continue="));
	cJSON_Delete(out);
	cJSON_Delete(f24);
	cJSON_Delete(f26);
}

static void test_delete_preconditions(void **state)
{
	struct env *e = *state;
	cJSON *f37 = script(e, "37-delete-precondition.json");
	cJSON *f38 = script(e, "38-delete.json");
	struct kube_resource r = widgets();
	struct kube_error err;
	struct kube_delete_opts bad = {.uid = "00000000-0000-0000-0000-000000000000"};
	assert_int_equal(kube_client_delete(e->c, &r, "default", "w5", &bad, &err), -EBUSY);
	assert_int_equal(err.reason, KUBE_CONFLICT);
	assert_non_null(strstr(err.message, "the UID in the precondition"));
	struct kube_delete_opts good = {.uid = "d1fcb85c-49cc-4a39-ab00-cd01c2f00709"};
	assert_int_equal(kube_client_delete(e->c, &r, "default", "w5", &good, &err), 0);
	for (int i = 0; i < 2; i++) {
		struct replay_req *q = &e->srv->req[i];
		const cJSON *fx = i ? f38 : f37;
		assert_string_equal(q->method, "DELETE");
		assert_same_path(q, fx);
		cJSON *sent = cJSON_Parse(q->body);
		cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "request"), "body");
		assert_true(cJSON_Compare(sent, want, true));
		cJSON_Delete(sent);
	}
	cJSON_Delete(f37);
	cJSON_Delete(f38);
}

static void test_lease_exchanges(void **state)
{
	struct env *e = *state;
	cJSON *f39 = script(e, "39-lease-create.json");
	cJSON *f40 = script(e, "40-lease-renew.json");
	cJSON *f41 = script(e, "41-lease-steal-stale.json");
	struct kube_resource r;
	assert_int_equal(kube_resource_builtin("coordination.k8s.io/v1", "Lease", &r), 0);
	struct kube_error err;
	cJSON *out = NULL;
	cJSON *b39 = cJSON_GetObjectItem(cJSON_GetObjectItem(f39, "request"), "body");
	assert_int_equal(kube_client_create(e->c, &r, "default", b39, &out, &err), 0);
	assert_string_equal(kube_obj_rv(out), "348");
	cJSON_Delete(out);
	cJSON *b40 = cJSON_GetObjectItem(cJSON_GetObjectItem(f40, "request"), "body");
	assert_int_equal(kube_client_replace(e->c, &r, NULL, NULL, b40, &out, &err), 0);
	assert_string_equal(kube_obj_rv(out), "349");
	cJSON_Delete(out);
	cJSON *b41 = cJSON_GetObjectItem(cJSON_GetObjectItem(f41, "request"), "body");
	assert_int_equal(kube_client_replace(e->c, &r, NULL, NULL, b41, NULL, &err), -EBUSY);
	assert_int_equal(err.reason, KUBE_CONFLICT);
	assert_same_path(&e->srv->req[0], f39);
	assert_same_path(&e->srv->req[1], f40);
	assert_same_path(&e->srv->req[2], f41);
	cJSON_Delete(f39);
	cJSON_Delete(f40);
	cJSON_Delete(f41);
}

static void test_event_core(void **state)
{
	struct env *e = *state;
	cJSON *f44 = script(e, "44-event-create-core.json");
	cJSON *f08 = fixture("08-get.json");
	const cJSON *w1 = cJSON_GetObjectItem(cJSON_GetObjectItem(f08, "response"), "body");
	struct kube_event ev = {.regarding = w1,
	                        .type = "Normal",
	                        .reason = "Pulled",
	                        .message = "cache extracted",
	                        .component = "gkm-agent",
	                        .host = "node-1"};
	struct kube_error err;
	assert_int_equal(kube_client_event(e->c, &ev, &err), 0);
	struct replay_req *q = &e->srv->req[0];
	assert_string_equal(q->method, "POST");
	assert_same_path(q, f44);
	cJSON *sent = cJSON_Parse(q->body);
	cJSON *inv = cJSON_GetObjectItem(sent, "involvedObject");
	/* describe finds Events by involvedObject.uid */
	assert_string_equal(cJSON_GetObjectItem(inv, "uid")->valuestring, kube_obj_uid(w1));
	assert_string_equal(cJSON_GetObjectItem(inv, "kind")->valuestring, "Widget");
	const char *name = kube_obj_name(sent);
	assert_int_equal(strncmp(name, "w1.", 3), 0);
	assert_true(strlen(name) > 3);
	for (const char *p = name; *p; p++)
		assert_true((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' ||
		            *p == '-');
	assert_string_equal(cJSON_GetObjectItem(sent, "reason")->valuestring, "Pulled");
	assert_string_equal(
	    cJSON_GetObjectItem(cJSON_GetObjectItem(sent, "source"), "host")->valuestring,
	    "node-1");
	cJSON_Delete(sent);
	cJSON_Delete(f08);
	cJSON_Delete(f44);
}

static void test_event_build_rules(void **state)
{
	(void)state;
	cJSON *node = cJSON_Parse("{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":"
	                          "{\"name\":\"Node_With_Caps\",\"uid\":\"u1\"}}");
	struct kube_event ev = {.regarding = node, .reason = "Probed", .message = "ok"};
	cJSON *out = NULL;
	struct kube_error err;
	assert_int_equal(kube_event_build(&ev, &out, &err), 0);
	/* cluster-scoped: Events go to "default"; a name that is no DNS
	 * subdomain gets a generic valid one */
	assert_string_equal(kube_obj_namespace(out), "default");
	assert_int_equal(strncmp(kube_obj_name(out), "gkm.", 4), 0);
	assert_string_equal(cJSON_GetObjectItem(out, "type")->valuestring, "Normal");
	cJSON_Delete(out);
	ev.type = "Bad";
	assert_int_equal(kube_event_build(&ev, &out, &err), -EINVAL);
	assert_non_null(strstr(err.message, "Normal or Warning"));
	ev.type = NULL;
	ev.reason = "";
	assert_int_equal(kube_event_build(&ev, &out, &err), -EINVAL);
	cJSON_Delete(node);
	cJSON *nameless = cJSON_Parse("{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}");
	ev.regarding = nameless;
	ev.reason = "X";
	assert_int_equal(kube_event_build(&ev, &out, &err), -EINVAL);
	cJSON_Delete(nameless);
}

static void test_discovery(void **state)
{
	struct env *e = *state;
	cJSON *f06 = script(e, "06-apis-group-version.json");
	cJSON *f47 = script(e, "47-api-v1-resources.json");
	struct kube_resource r;
	struct kube_error err;
	assert_int_equal(kube_client_resource(e->c, "example.com/v1", "Widget", &r, &err), 0);
	assert_string_equal(r.plural, "widgets");
	assert_true(r.namespaced);
	assert_same_path(&e->srv->req[0], f06);
	/* cached: no second request */
	assert_int_equal(kube_client_resource(e->c, "example.com/v1", "Widget", &r, &err), 0);
	assert_int_equal(e->srv->nreq, 1);
	assert_int_equal(kube_client_resource(e->c, "v1", "ComponentStatus", &r, &err), 0);
	assert_string_equal(r.plural, "componentstatuses");
	assert_false(r.namespaced);
	char path[256];
	assert_int_equal(kube_resource_path(&r, "ignored", "cs1", NULL, path, sizeof(path)), 0);
	assert_string_equal(path, "/api/v1/componentstatuses/cs1");
	/* built-ins need no server */
	assert_int_equal(kube_client_resource(e->c, "gkm.io/v1alpha1", "GKMCacheNode", &r, &err),
	                 0);
	assert_int_equal(e->srv->nreq, 2);
	cJSON_Delete(f06);
	cJSON_Delete(f47);
}

/* Every recorded response, replayed through kube_client_do with the
 * recorded request: 2xx gives a JSON object, anything else a typed error
 * carrying the server's code and reason. */
static void test_every_fixture(void **state)
{
	struct env *e = *state;
	const char *dir =
	    getenv("KUBE_FIXTURES") ? getenv("KUBE_FIXTURES") : "spec/fixtures/kube-apiserver";
	struct dirent **names;
	int n = scandir(dir, &names, NULL, alphasort);
	assert_true(n > 40);
	int checked = 0;
	for (int i = 0; i < n; i++) {
		const char *f = names[i]->d_name;
		size_t l = strlen(f);
		if (l < 6 || strcmp(f + l - 5, ".json")) {
			free(names[i]);
			continue;
		}
		cJSON *fx = fixture(f);
		const cJSON *rq = cJSON_GetObjectItem(fx, "request");
		const cJSON *rs = cJSON_GetObjectItem(fx, "response");
		int status = cJSON_GetObjectItem(rs, "status")->valueint;
		const char *path = req_path(fx);
		if (strstr(path, "watch=1")) { /* streams: test_kube_watch */
			cJSON_Delete(fx);
			free(names[i]);
			continue;
		}
		replay_push_fixture(e->srv, fx);
		const cJSON *b = cJSON_GetObjectItem(rq, "body");
		char *body = cJSON_IsNull(b)     ? NULL
		             : cJSON_IsString(b) ? strdup(b->valuestring)
		                                 : cJSON_PrintUnformatted(b);
		const cJSON *hd = cJSON_GetObjectItem(rq, "headers");
		const cJSON *ct = cJSON_GetObjectItem(hd, "Content-Type");
		struct kube_request req = {
		    .method = cJSON_GetObjectItem(rq, "method")->valuestring,
		    .path = path,
		    .content_type = ct ? ct->valuestring : NULL,
		    .body = body,
		    .body_len = body ? strlen(body) : 0,
		};
		cJSON *out = NULL;
		struct kube_error err;
		int rc = kube_client_do(e->c, &req, &out, &err);
		if (status >= 200 && status < 300) {
			if (rc != 0)
				fail_msg("%s: rc %d: %s", f, rc, err.message);
			assert_true(cJSON_IsObject(out));
			assert_true(cJSON_Compare(out, cJSON_GetObjectItem(rs, "body"), true));
		} else {
			const char *reason =
			    cJSON_GetObjectItem(cJSON_GetObjectItem(rs, "body"), "reason")
			        ->valuestring;
			if (rc >= 0)
				fail_msg("%s: HTTP %d accepted", f, status);
			assert_null(out);
			assert_int_equal(err.http_code, status);
			assert_string_equal(err.reason_text, reason);
			assert_true(err.message[0] != 0);
		}
		cJSON_Delete(out);
		free(body);
		cJSON_Delete(fx);
		free(names[i]);
		checked++;
	}
	free(names);
	assert_true(checked >= 46);
}

static void test_bad_responses(void **state)
{
	struct env *e = *state;
	struct kube_resource r = widgets();
	cJSON *out = NULL;
	struct kube_error err;
	/* 200 with a truncated object */
	const char *trunc = "{\"apiVersion\":\"example.com/v1\",\"kind\":\"Wid";
	replay_push(e->srv, 200, trunc, strlen(trunc), false);
	assert_int_equal(kube_client_get(e->c, &r, "default", "w1", &out, &err), -EBADMSG);
	assert_int_equal(err.reason, KUBE_MALFORMED);
	assert_non_null(strstr(err.message, "not a JSON object"));
	/* 200 with JSON that is not an object */
	replay_push(e->srv, 200, "[1,2]", 5, false);
	assert_int_equal(kube_client_get(e->c, &r, "default", "w1", &out, &err), -EBADMSG);
	/* a proxy's HTML page on 502 */
	const char *html = "<html><body>Bad Gateway</body></html>";
	replay_push(e->srv, 502, html, strlen(html), false);
	assert_int_equal(kube_client_get(e->c, &r, "default", "w1", &out, &err), -EAGAIN);
	assert_int_equal(err.http_code, 502);
	assert_true(kube_error_retryable(&err));
	assert_non_null(strstr(err.message, "Bad Gateway"));
	/* 429 with Retry-After */
	const char *tmr =
	    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n";
	replay_push_raw(e->srv, tmr, strlen(tmr));
	assert_int_equal(kube_client_get(e->c, &r, "default", "w1", &out, &err), -EAGAIN);
	assert_int_equal(err.reason, KUBE_TOO_MANY_REQUESTS);
	assert_int_equal(err.retry_after_s, 7);
	/* larger than the client's bound (1 MiB here) */
	size_t big = (1 << 20) + 100;
	char *huge = malloc(big);
	memset(huge, ' ', big);
	huge[0] = '{';
	huge[big - 1] = '}';
	replay_push(e->srv, 200, huge, big, false);
	free(huge);
	assert_int_equal(kube_client_get(e->c, &r, "default", "w1", &out, &err), -EMSGSIZE);
	assert_int_equal(err.reason, KUBE_TOO_LARGE);
	/* a wrong name never reaches the server */
	unsigned before = e->srv->nreq;
	assert_int_equal(kube_client_get(e->c, &r, "default", "../secrets", &out, &err), -EINVAL);
	assert_int_equal(kube_client_get(e->c, &r, "a/b", "w1", &out, &err), -EINVAL);
	assert_int_equal(e->srv->nreq, before);
	assert_null(out);
}

static void test_timeout_and_refused(void **state)
{
	struct env *e = *state;
	struct kube_resource r = widgets();
	struct kube_error err;
	cJSON *out = NULL;
	const char *ok = "{}";
	replay_push(e->srv, 200, ok, 2, false);
	e->srv->resp[e->srv->nresp - 1].delay_ms = 1500;
	struct kube_request rq = {.method = "GET", .path = "/version", .timeout_ms = 300};
	assert_int_equal(kube_client_do(e->c, &rq, &out, &err), -ETIMEDOUT);
	assert_int_equal(err.reason, KUBE_TIMEOUT);
	assert_true(kube_error_retryable(&err));
	/* nothing listens: refused, retryable */
	free(e->cfg->server);
	e->cfg->server = strdup("http://127.0.0.1:1");
	assert_int_equal(kube_client_get(e->c, &r, "default", "w1", &out, &err), -ECONNREFUSED);
	assert_int_equal(err.reason, KUBE_TRANSPORT);
	assert_true(kube_error_retryable(&err));
	assert_null(out);
}

static void test_query_encoding(void **state)
{
	(void)state;
	char buf[128] = "/api/v1/pods";
	assert_int_equal(kube_query_add(buf, sizeof(buf), "labelSelector", "app in (a,b),!x"), 0);
	assert_string_equal(buf, "/api/v1/pods?labelSelector=app%20in%20%28a%2Cb%29%2C%21x");
	assert_int_equal(kube_query_add(buf, sizeof(buf), "fieldManager", "gkm-agent/node-1"), 0);
	assert_non_null(strstr(buf, "%21x&fieldManager=gkm-agent%2Fnode-1"));
	char small[16] = "/x";
	assert_int_equal(kube_query_add(small, sizeof(small), "limit", "1234567890"),
	                 -ENAMETOOLONG);
	assert_string_equal(small, "/x");
	struct kube_resource r;
	assert_int_equal(kube_resource_builtin("gkm.io/v1alpha1", "GKMCache", &r), 0);
	assert_int_equal(kube_resource_path(&r, "ns1", "c1", "status", buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/apis/gkm.io/v1alpha1/namespaces/ns1/gkmcaches/c1/status");
	assert_int_equal(kube_resource_path(&r, NULL, NULL, NULL, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/apis/gkm.io/v1alpha1/gkmcaches");
	assert_int_equal(kube_resource_builtin("v1", "Nope", &r), -ENOENT);
	char av[160];
	assert_int_equal(kube_resource_builtin("v1", "Node", &r), 0);
	kube_resource_api_version(&r, av, sizeof(av));
	assert_string_equal(av, "v1");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_get, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_get_missing, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_create, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_create_invalid, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_create_malformed_and_media, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_apply_conflict_force, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_apply_status, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_replace_stale, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_list_pages, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_list_selectors, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_list_expired_continue_restarts, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_delete_preconditions, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lease_exchanges, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_event_core, setup, teardown),
	    cmocka_unit_test(test_event_build_rules),
	    cmocka_unit_test_setup_teardown(test_discovery, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_every_fixture, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_responses, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_timeout_and_refused, setup, teardown),
	    cmocka_unit_test(test_query_encoding),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
