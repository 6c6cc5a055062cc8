#include "engine.h"

#include <errno.h>
#include <lauxlib.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "luajson.h"
#include "metrics.h"
#include "sandbox.h"

const struct engine_limits engine_limits_default = {
    .memory_bytes = 32u << 20,
    .instructions = 200000000u,
    .wall_ms = 2000,
};

struct engine {
	atomic_int refs;
	struct sandbox sb;
	struct bundle *bundle;
	struct engine_limits lim;
};

extern const struct engine_hook __start_gkm_hooks[] __attribute__((weak));
extern const struct engine_hook __stop_gkm_hooks[] __attribute__((weak));

const char *engine_status_name(enum engine_status s)
{
	switch (s) {
	case ENGINE_OK:
		return "ok";
	case ENGINE_ERROR:
		return "error";
	case ENGINE_TIMEOUT:
		return "timeout";
	case ENGINE_NOMEM:
		return "out of memory";
	case ENGINE_BLOCKED:
		return "blocked function";
	case ENGINE_BAD_RETURN:
		return "bad return value";
	case ENGINE_NO_HOOK:
		return "missing hook";
	}
	return "unknown";
}

const struct engine_hook *engine_hook_find(const char *name)
{
	/* start/stop symbols of one linker section */
	// cppcheck-suppress comparePointers
	for (const struct engine_hook *h = __start_gkm_hooks; h && h < __stop_gkm_hooks; h++)
		if (strcmp(h->name, name) == 0)
			return h;
	return NULL;
}

static struct metric *lua_errors(void)
{
	static struct metric *m;
	if (!m)
		m = metrics_counter("gkm_lua_errors_total",
		                    "Lua policy runs that did not return a valid result, by kind",
		                    "kind");
	return m;
}

/* The kind label: engine_status_name() in snake case, as label values go. */
static void count_lua_error(enum engine_status st)
{
	char kind[32];
	const char *name = engine_status_name(st);
	size_t i = 0;
	for (; name[i] && i + 1 < sizeof(kind); i++)
		kind[i] = name[i] == ' ' ? '_' : name[i];
	kind[i] = '\0';
	metrics_add(lua_errors(), METRICS_L(kind), 1);
}

static void set_error(struct engine_error *err, enum engine_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(struct engine_error *err, enum engine_status st, const char *fmt, ...)
{
	if (!err)
		return;
	va_list ap;
	err->status = st;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
}

/* ---- the one place that calls into Lua ---- */

/* What a protected run does; runs inside lua_pcall so that every allocation
 * and every Lua error on the way in or out is caught. */
struct run {
	const char *module;
	const char *function; /* NULL: only load the module */
	const cJSON *input;
	cJSON *output;
	char conv_err[256];
};

static int traceback(lua_State *L)
{
	const char *msg = lua_tostring(L, 1);
	if (!msg)
		msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
	/* a traceback of C frames only (a syntax error) says nothing more */
	lua_Debug ar;
	for (int level = 1; lua_getstack(L, level, &ar); level++) {
		if (lua_getinfo(L, "S", &ar) && ar.what[0] != 'C') {
			luaL_traceback(L, L, msg, 1);
			return 1;
		}
	}
	lua_pushstring(L, msg);
	return 1;
}

static int protected_run(lua_State *L)
{
	struct run *r = lua_touserdata(L, 1);
	sandbox_require(L, r->module);
	if (!r->function)
		return 0;
	if (!lua_istable(L, -1))
		return luaL_error(L, "module '%s' must return a table of hooks, got %s", r->module,
		                  luaL_typename(L, -1));
	lua_getfield(L, -1, r->function);
	if (!lua_isfunction(L, -1))
		return luaL_error(L, "module '%s' has no function '%s'", r->module, r->function);
	luajson_push(L, r->input);
	lua_call(L, 1, 1);
	r->output = luajson_to_json(L, -1, r->conv_err, sizeof(r->conv_err));
	return 0;
}

/* Run r under the budget; maps the outcome to a typed status. */
static enum engine_status run_protected(struct engine *e, struct run *r, struct engine_error *err)
{
	lua_State *L = e->sb.L;
	int top = lua_gettop(L);
	lua_pushcfunction(L, traceback);
	lua_pushcfunction(L, protected_run);
	lua_pushlightuserdata(L, r);
	sandbox_arm(&e->sb, e->lim.instructions, e->lim.wall_ms);
	int rc = lua_pcall(L, 1, 0, top + 1);
	sandbox_disarm(&e->sb);

	enum engine_status st = ENGINE_OK;
	const char *msg = rc != LUA_OK ? lua_tostring(L, -1) : NULL;
	if (e->sb.tripped) {
		st = ENGINE_TIMEOUT;
		set_error(err, st, "%s: %s", r->module, e->sb.trip_msg);
	} else if (e->sb.blocked[0]) {
		st = ENGINE_BLOCKED;
		set_error(err, st, "%s: called blocked function '%s'%s%s", r->module, e->sb.blocked,
		          msg ? "\n" : "", msg ? msg : "");
	} else if (rc == LUA_ERRMEM || e->sb.mem_refused) {
		st = ENGINE_NOMEM;
		set_error(err, st, "%s: memory limit of %zu bytes reached", r->module,
		          e->sb.mem_cap);
	} else if (rc != LUA_OK) {
		st = ENGINE_ERROR;
		set_error(err, st, "%s", msg ? msg : "unknown Lua error");
	} else if (r->function && !r->output) {
		st = ENGINE_BAD_RETURN;
		set_error(err, st, "%s.%s returned a value that is not plain data: %s", r->module,
		          r->function, r->conv_err);
	}
	lua_settop(L, top);
	if (st != ENGINE_OK) {
		cJSON_Delete(r->output);
		r->output = NULL;
		/* give back what a failed run left behind (a memory bomb's garbage) */
		lua_gc(L, LUA_GCCOLLECT, 0);
		count_lua_error(st);
	}
	return st;
}

static enum engine_status call_fn(struct engine *e, const char *module, const char *function,
                                  const cJSON *input, cJSON **out, struct engine_error *err)
{
	struct run r = {.module = module, .function = function, .input = input};
	enum engine_status st = run_protected(e, &r, err);
	if (st == ENGINE_OK)
		*out = r.output;
	return st;
}

/* A hook is present when its module loads and exports a function of that name. */
static int check_hook(struct engine *e, const struct engine_hook *h, struct engine_error *err)
{
	struct run r = {.module = h->module};
	if (run_protected(e, &r, err) != ENGINE_OK)
		return -1;
	int t = sandbox_field_type(&e->sb, h->module, h->function);
	if (t == LUA_TFUNCTION)
		return 0;
	if (t == LUA_TNONE)
		set_error(err, ENGINE_NO_HOOK,
		          "%s.lua: must return a table with the hook function '%s'", h->module,
		          h->function);
	else if (t == LUA_TNIL)
		set_error(err, ENGINE_NO_HOOK, "%s.lua: does not define the hook function '%s'",
		          h->module, h->function);
	else
		set_error(err, ENGINE_NO_HOOK, "%s.lua: hook '%s' must be a function, got %s",
		          h->module, h->function, lua_typename(e->sb.L, t));
	return -1;
}

int engine_new(const struct bundle *b, const struct engine_limits *lim, struct engine **out,
               struct engine_error *err)
{
	struct engine *e = calloc(1, sizeof(*e));
	if (!e) {
		set_error(err, ENGINE_NOMEM, "out of memory");
		return -ENOMEM;
	}
	atomic_init(&e->refs, 1);
	e->lim = lim ? *lim : engine_limits_default;
	e->bundle = bundle_copy(b);
	if (!e->bundle || sandbox_open(&e->sb, e->lim.memory_bytes, e->bundle) != 0) {
		set_error(err, ENGINE_NOMEM, "cannot create the Lua state");
		goto fail;
	}
	/* load every file of the bundle: a syntax or load-time error anywhere refuses it */
	for (size_t i = 0; i < e->bundle->count; i++) {
		char module[128];
		const char *name = e->bundle->files[i].name;
		size_t n = strlen(name) - 4; /* strip ".lua" */
		if (n >= sizeof(module))
			n = sizeof(module) - 1;
		memcpy(module, name, n);
		module[n] = '\0';
		struct run r = {.module = module};
		if (run_protected(e, &r, err) != ENGINE_OK)
			goto fail;
	}
	/* start/stop symbols of one linker section */
	// cppcheck-suppress comparePointers
	for (const struct engine_hook *h = __start_gkm_hooks; h && h < __stop_gkm_hooks; h++) {
		if (check_hook(e, h, err) != 0)
			goto fail;
	}
	*out = e;
	return 0;
fail:
	engine_unref(e);
	return -EINVAL;
}

struct engine *engine_ref(struct engine *e)
{
	atomic_fetch_add(&e->refs, 1);
	return e;
}

void engine_unref(struct engine *e)
{
	if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
		return;
	sandbox_close(&e->sb);
	bundle_free(e->bundle);
	free(e);
}

enum engine_status engine_call_fn(struct engine *e, const char *module, const char *function,
                                  const cJSON *input, engine_validate_fn validate, cJSON **out,
                                  struct engine_error *err)
{
	cJSON *result = NULL;
	enum engine_status st = call_fn(e, module, function, input, &result, err);
	if (st != ENGINE_OK)
		return st;
	char verr[512] = "";
	if (validate && validate(result, verr, sizeof(verr)) != 0) {
		set_error(err, ENGINE_BAD_RETURN, "%s.%s returned an invalid result: %s", module,
		          function, verr);
		count_lua_error(ENGINE_BAD_RETURN);
		cJSON_Delete(result);
		return ENGINE_BAD_RETURN;
	}
	*out = result;
	return ENGINE_OK;
}

enum engine_status engine_call(struct engine *e, const char *hook, const cJSON *input, cJSON **out,
                               struct engine_error *err)
{
	const struct engine_hook *h = engine_hook_find(hook);
	if (!h) {
		set_error(err, ENGINE_NO_HOOK, "unknown hook '%s'", hook);
		return ENGINE_NO_HOOK;
	}
	return engine_call_fn(e, h->module, h->function, input, h->validate, out, err);
}

const char *engine_digest(const struct engine *e)
{
	return e->bundle->digest;
}

size_t engine_memory(const struct engine *e)
{
	return e->sb.mem_used;
}

void engine_collect(struct engine *e)
{
	lua_gc(e->sb.L, LUA_GCCOLLECT, 0);
}

/* ---- slot ---- */

void engine_slot_init(struct engine_slot *s, const struct engine_limits *lim)
{
	memset(s, 0, sizeof(*s));
	s->limits = lim ? *lim : engine_limits_default;
}

int engine_slot_load(struct engine_slot *s, const struct bundle *b, struct engine_error *err)
{
	static struct metric *reloads;
	if (!reloads)
		reloads = metrics_counter(
		    "gkm_policy_reloads_total",
		    "Policy bundle loads, by result (applied, unchanged, refused)", "result");
	if (s->current && strcmp(engine_digest(s->current), b->digest) == 0) {
		metrics_add(reloads, METRICS_L("unchanged"), 1);
		return 0;
	}
	struct engine *e = NULL;
	struct engine_error local;
	if (!err)
		err = &local;
	if (engine_new(b, &s->limits, &e, err) != 0) {
		snprintf(s->last_error, sizeof(s->last_error), "%s", err->message);
		metrics_add(reloads, METRICS_L("refused"), 1);
		log_error("policy bundle refused; keeping the previous one", "digest", b->digest,
		          "error", err->message);
		return -1;
	}
	if (s->current)
		engine_unref(s->current);
	s->current = e;
	s->generation++;
	s->last_error[0] = '\0';
	metrics_add(reloads, METRICS_L("applied"), 1);
	char gen[24];
	snprintf(gen, sizeof(gen), "%llu", (unsigned long long)s->generation);
	log_info("policy bundle applied", "digest", b->digest, "generation", gen);
	return 0;
}

void engine_slot_clear(struct engine_slot *s)
{
	if (s->current)
		engine_unref(s->current);
	s->current = NULL;
}
