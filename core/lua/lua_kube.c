/* gkm.kube: what a controller's reconcile (see kube_controller.h) may read and
 * ask for. Reads come from the controller's informer caches (no I/O, never
 * blocks); writes are queued, checked now, and carried out by C after the
 * reconcile returned.
 *
 *   -- kube.get{ kind, apiVersion?, namespace?, name } -> object | nil
 *   -- kube.list{ kind, apiVersion?, namespace?, labelSelector? } -> { objects, sorted by key }
 *   -- kube.apply(obj [, { force = true }])         server-side apply (queued)
 *   -- kube.apply_status(obj [, { force = true }])  the same on the status subresource
 *   -- kube.delete{ apiVersion, kind, namespace?, name, uid?, resourceVersion?, propagation? }
 *   -- kube.event(obj, type, reason, message)       a core/v1 Event about obj
 *
 * Every function raises on a programming error (wrong argument, a kind the
 * controller does not watch, called outside a reconcile): a reconcile that
 * raises is retried with backoff and none of its actions run. */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kube_controller.h"
#include "kube_selector.h"
#include "luajson.h"

#define MAX_INFORMERS 8

static struct kube_reconcile *need_reconcile(lua_State *L, const char *fn)
{
	struct kube_reconcile *r = kube_reconcile_current();
	if (!r)
		luaL_error(L, "gkm.kube.%s: only available inside a controller's reconcile", fn);
	return r;
}

static const char *opt_field(lua_State *L, int t, const char *field, const char *fn)
{
	int ty = lua_getfield(L, t, field);
	const char *s = NULL;
	if (ty == LUA_TSTRING)
		s = lua_tostring(L, -1);
	else if (ty != LUA_TNIL)
		luaL_error(L, "gkm.kube.%s: '%s' must be a string", fn, field);
	lua_pop(L, 1); /* the string stays alive: it is in the argument table */
	return s;
}

static const char *req_field(lua_State *L, int t, const char *field, const char *fn)
{
	const char *s = opt_field(L, t, field, fn);
	if (!s || !*s)
		luaL_error(L, "gkm.kube.%s: '%s' is required", fn, field);
	return s;
}

static size_t informers_of(lua_State *L, struct kube_reconcile *r, const char *av, const char *kind,
                           struct kube_informer **inf, const char *fn)
{
	size_t n = kube_reconcile_informers(r, av, kind, inf, MAX_INFORMERS);
	if (!n)
		luaL_error(
		    L, "gkm.kube.%s: this controller does not watch %s%s%s (declare it in watches)",
		    fn, av ? av : "", av ? " " : "", kind);
	return n;
}

#define HOLDER_MT "gkm.kube.json"

static int holder_gc(lua_State *L)
{
	cJSON **slot = luaL_checkudata(L, 1, HOLDER_MT);
	cJSON_Delete(*slot);
	*slot = NULL;
	return 0;
}

/* Push the parsed JSON text as a table (nil when it does not parse). The
 * tree is held by a collectable userdata while converting, so that a memory
 * error raised half way does not leak it. */
static void push_json(lua_State *L, const char *json, size_t len)
{
	cJSON **slot = lua_newuserdatauv(L, sizeof(cJSON *), 0);
	*slot = NULL;
	if (luaL_newmetatable(L, HOLDER_MT)) {
		lua_pushcfunction(L, holder_gc);
		lua_setfield(L, -2, "__gc");
	}
	lua_setmetatable(L, -2);
	*slot = cJSON_ParseWithLength(json, len);
	if (*slot)
		luajson_push(L, *slot);
	else
		lua_pushnil(L);
	cJSON_Delete(*slot);
	*slot = NULL;
	lua_remove(L, -2);
}

/* kube.get{ kind, apiVersion?, namespace?, name } -> object | nil */
static int k_get(lua_State *L)
{
	struct kube_reconcile *r = need_reconcile(L, "get");
	luaL_checktype(L, 1, LUA_TTABLE);
	const char *kind = req_field(L, 1, "kind", "get");
	const char *av = opt_field(L, 1, "apiVersion", "get");
	const char *ns = opt_field(L, 1, "namespace", "get");
	const char *name = req_field(L, 1, "name", "get");
	struct kube_informer *inf[MAX_INFORMERS];
	size_t n = informers_of(L, r, av, kind, inf, "get");
	for (size_t i = 0; i < n; i++) {
		size_t len;
		const char *t = kube_informer_get_text(inf[i], ns, name, &len);
		if (t) {
			push_json(L, t, len);
			return 1;
		}
	}
	lua_pushnil(L);
	return 1;
}

struct hit {
	const char *key;
	const char *json;
	size_t len;
};

struct collect {
	struct hit *hits;
	size_t n, cap;
	const char *ns;
	const struct kube_selector *sel;
	bool oom;
};

static void collect_one(const char *key, const char *json, size_t len, void *ud)
{
	struct collect *c = ud;
	if (c->oom)
		return;
	if (c->ns) {
		size_t nl = strlen(c->ns);
		if (strncmp(key, c->ns, nl) || key[nl] != '/')
			return;
	}
	for (size_t i = 0; i < c->n; i++) /* the same object from two watches */
		if (!strcmp(c->hits[i].key, key))
			return;
	if (c->n == c->cap) {
		size_t ncap = c->cap ? c->cap * 2 : 64;
		struct hit *h = realloc(c->hits, ncap * sizeof(*h));
		if (!h) {
			c->oom = true;
			return;
		}
		c->hits = h;
		c->cap = ncap;
	}
	c->hits[c->n++] = (struct hit){key, json, len};
}

static int cmp_hit(const void *a, const void *b)
{
	return strcmp(((const struct hit *)a)->key, ((const struct hit *)b)->key);
}

/* Free what list allocated, also when Lua raises (memory) half way. */
static int collect_gc(lua_State *L)
{
	struct collect *c = lua_touserdata(L, 1);
	free(c->hits);
	c->hits = NULL;
	kube_selector_free((struct kube_selector *)c->sel);
	c->sel = NULL;
	return 0;
}

/* kube.list{ kind, apiVersion?, namespace?, labelSelector? } -> { objects } */
static int k_list(lua_State *L)
{
	struct kube_reconcile *r = need_reconcile(L, "list");
	luaL_checktype(L, 1, LUA_TTABLE);
	const char *kind = req_field(L, 1, "kind", "list");
	const char *av = opt_field(L, 1, "apiVersion", "list");
	const char *ns = opt_field(L, 1, "namespace", "list");
	struct kube_informer *inf[MAX_INFORMERS];
	size_t n = informers_of(L, r, av, kind, inf, "list");

	struct collect *c = lua_newuserdatauv(L, sizeof(*c), 0);
	memset(c, 0, sizeof(*c));
	lua_newtable(L);
	lua_pushcfunction(L, collect_gc);
	lua_setfield(L, -2, "__gc");
	lua_setmetatable(L, -2);
	int ud = lua_gettop(L);

	char err[256];
	int ty = lua_getfield(L, 1, "labelSelector");
	struct kube_selector *sel = NULL;
	int rc = 0;
	if (ty == LUA_TSTRING) {
		rc = kube_selector_parse(lua_tostring(L, -1), &sel, err, sizeof(err));
	} else if (ty == LUA_TTABLE) {
		cJSON *m = luajson_to_json(L, -1, err, sizeof(err));
		char *s = NULL;
		rc = m ? kube_selector_from_map(m, &s, err, sizeof(err)) : -1;
		cJSON_Delete(m);
		if (rc == 0)
			rc = kube_selector_parse(s, &sel, err, sizeof(err));
		free(s);
	} else if (ty != LUA_TNIL) {
		return luaL_error(L, "gkm.kube.list: labelSelector must be a string or a map");
	}
	lua_pop(L, 1);
	if (rc < 0)
		return luaL_error(L, "gkm.kube.list: %s", err);
	c->sel = sel;
	c->ns = ns;
	for (size_t i = 0; i < n; i++)
		kube_informer_foreach(inf[i], collect_one, c);
	if (c->oom)
		return luaL_error(L, "gkm.kube.list: out of memory");
	qsort(c->hits, c->n, sizeof(*c->hits), cmp_hit);
	lua_createtable(L, (int)c->n, 0);
	lua_Integer k = 0;
	for (size_t i = 0; i < c->n; i++) {
		cJSON *j = cJSON_ParseWithLength(c->hits[i].json, c->hits[i].len);
		if (!j)
			continue;
		bool match = kube_selector_match_object(sel, j);
		cJSON_Delete(j);
		if (!match)
			continue;
		push_json(L, c->hits[i].json, c->hits[i].len);
		lua_rawseti(L, -2, ++k);
	}
	lua_remove(L, ud); /* its __gc frees hits and the selector */
	return 1;
}

static cJSON *table_arg(lua_State *L, int idx, const char *fn)
{
	char err[256];
	luaL_checktype(L, idx, LUA_TTABLE);
	cJSON *j = luajson_to_json(L, idx, err, sizeof(err));
	if (!j)
		luaL_error(L, "gkm.kube.%s: %s", fn, err);
	return j;
}

static void queue(lua_State *L, struct kube_reconcile *r, cJSON *action, const char *fn)
{
	if (kube_reconcile_add_action(r, action) < 0)
		luaL_error(L, "gkm.kube.%s: more than %d writes in one reconcile", fn,
		           KUBE_CONTROLLER_MAX_ACTIONS);
}

/* An object to apply: apiVersion, kind and metadata.name are required. */
static const char *check_object(const cJSON *o)
{
	const char *av = kube_obj_str(o, NULL, "apiVersion"), *kind = kube_obj_str(o, NULL, "kind");
	const char *name = kube_obj_name(o);
	const cJSON *ns = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(o, "metadata"), "namespace");
	if (!av || !*av || !kind || !*kind)
		return "the object needs apiVersion and kind";
	if (!name || !*name || strlen(name) > 253)
		return "the object needs metadata.name (at most 253 characters)";
	if (ns && !cJSON_IsString(ns))
		return "metadata.namespace must be a string";
	return NULL;
}

static int do_apply(lua_State *L, bool status)
{
	const char *fn = status ? "apply_status" : "apply";
	struct kube_reconcile *r = need_reconcile(L, fn);
	cJSON *obj = table_arg(L, 1, fn);
	const char *bad = check_object(obj);
	if (bad) {
		cJSON_Delete(obj);
		return luaL_error(L, "gkm.kube.%s: %s", fn, bad);
	}
	bool force = true;
	if (!lua_isnoneornil(L, 2)) {
		if (!lua_istable(L, 2)) {
			cJSON_Delete(obj);
			return luaL_error(L, "gkm.kube.%s: options must be a table", fn);
		}
		if (lua_getfield(L, 2, "force") != LUA_TNIL)
			force = lua_toboolean(L, -1);
		lua_pop(L, 1);
	}
	cJSON *a = cJSON_CreateObject();
	if (!a) {
		cJSON_Delete(obj);
		return luaL_error(L, "gkm.kube.%s: out of memory", fn);
	}
	cJSON_AddStringToObject(a, "op", "apply");
	cJSON_AddBoolToObject(a, "status", status);
	cJSON_AddBoolToObject(a, "force", force);
	cJSON_AddItemToObject(a, "object", obj);
	queue(L, r, a, fn);
	return 0;
}

static int k_apply(lua_State *L)
{
	return do_apply(L, false);
}

static int k_apply_status(lua_State *L)
{
	return do_apply(L, true);
}

/* kube.delete{ apiVersion, kind, namespace?, name, uid?, resourceVersion?, propagation? } */
static int k_delete(lua_State *L)
{
	struct kube_reconcile *r = need_reconcile(L, "delete");
	luaL_checktype(L, 1, LUA_TTABLE);
	static const char *const fields[] = {"apiVersion",  "kind", "namespace",
	                                     "name",        "uid",  "resourceVersion",
	                                     "propagation", NULL};
	req_field(L, 1, "apiVersion", "delete");
	req_field(L, 1, "kind", "delete");
	req_field(L, 1, "name", "delete");
	const char *prop = opt_field(L, 1, "propagation", "delete");
	if (prop && strcmp(prop, "Background") && strcmp(prop, "Foreground") &&
	    strcmp(prop, "Orphan"))
		return luaL_error(
		    L, "gkm.kube.delete: propagation must be Background, Foreground or Orphan");
	cJSON *a = cJSON_CreateObject();
	if (!a)
		return luaL_error(L, "gkm.kube.delete: out of memory");
	cJSON_AddStringToObject(a, "op", "delete");
	for (const char *const *f = fields; *f; f++) {
		const char *v = opt_field(L, 1, *f, "delete");
		if (v)
			cJSON_AddStringToObject(a, *f, v);
	}
	queue(L, r, a, "delete");
	return 0;
}

static bool camel_case(const char *s)
{
	if (!s || !*s || strlen(s) > 128 || !((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z')))
		return false;
	for (; *s; s++)
		if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') ||
		      (*s >= '0' && *s <= '9')))
			return false;
	return true;
}

/* kube.event(obj, type, reason, message) */
static int k_event(lua_State *L)
{
	struct kube_reconcile *r = need_reconcile(L, "event");
	const char *type = luaL_checkstring(L, 2);
	const char *reason = luaL_checkstring(L, 3);
	const char *message = luaL_optstring(L, 4, "");
	if (strcmp(type, "Normal") && strcmp(type, "Warning"))
		return luaL_error(L, "gkm.kube.event: type must be \"Normal\" or \"Warning\"");
	if (!camel_case(reason))
		return luaL_error(
		    L, "gkm.kube.event: reason must be a CamelCase word of at most 128 characters");
	cJSON *obj = table_arg(L, 1, "event");
	const char *bad = check_object(obj);
	if (bad) {
		cJSON_Delete(obj);
		return luaL_error(L, "gkm.kube.event: %s", bad);
	}
	/* only what names the object: Events carry a reference, not a copy */
	cJSON *ref = cJSON_CreateObject();
	cJSON *meta = cJSON_AddObjectToObject(ref, "metadata");
	cJSON *a = cJSON_CreateObject();
	if (!ref || !meta || !a) {
		cJSON_Delete(obj);
		cJSON_Delete(ref);
		cJSON_Delete(a);
		return luaL_error(L, "gkm.kube.event: out of memory");
	}
	cJSON_AddStringToObject(ref, "apiVersion", kube_obj_str(obj, NULL, "apiVersion"));
	cJSON_AddStringToObject(ref, "kind", kube_obj_str(obj, NULL, "kind"));
	static const char *const mf[] = {"name", "namespace", "uid", "resourceVersion", NULL};
	for (const char *const *f = mf; *f; f++)
		if (kube_obj_str(obj, "metadata", *f))
			cJSON_AddStringToObject(meta, *f, kube_obj_str(obj, "metadata", *f));
	cJSON_Delete(obj);
	cJSON_AddStringToObject(a, "op", "event");
	cJSON_AddItemToObject(a, "regarding", ref);
	cJSON_AddStringToObject(a, "type", type);
	cJSON_AddStringToObject(a, "reason", reason);
	cJSON_AddStringToObject(a, "message", message);
	queue(L, r, a, "event");
	return 0;
}

static const luaL_Reg funcs[] = {
    {"get", k_get},       {"list", k_list},   {"apply", k_apply}, {"apply_status", k_apply_status},
    {"delete", k_delete}, {"event", k_event}, {NULL, NULL},
};

static int open_kube(lua_State *L)
{
	luaL_newlib(L, funcs);
	return 1;
}

ENGINE_MODULE(lua_kube_module, "gkm.kube", open_kube);
