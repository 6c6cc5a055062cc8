/* gkmspec: a Lua module for busted specs that drives gkm's real engine and
 * sandbox (the same C objects the gkm binary is linked from).
 *
 *   local gkmspec = require 'gkmspec'
 *   local e, err = gkmspec.engine{ dir = 'policies', files = { ['x.lua'] = src },
 *                                  memory = 8 << 20, instructions = 1e6, timeout_ms = 500 }
 *   local result, status, message = e:call('admission', input)
 *       -- result is a table on success; nil, status ("timeout", ...), message otherwise
 *   local s = gkmspec.slot{ memory = ... }
 *   local ok, err = s:load{ dir = ..., files = ... }   -- swap only on success
 *   s:generation(), s:digest(), s:call(hook, input), s:last_error()
 *   gkmspec.call_fn(e, 'gkm.module', 'fn', input)  -- any module function
 *
 * Tables cross as JSON (cJSON), exactly as the daemons pass them. */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "engine.h"
#include "luajson.h"

#define ENGINE_MT "gkmspec.engine"
#define SLOT_MT "gkmspec.slot"

static struct engine_limits limits_from(lua_State *L, int idx)
{
	struct engine_limits lim = engine_limits_default;
	if (lua_getfield(L, idx, "memory") == LUA_TNUMBER)
		lim.memory_bytes = (size_t)lua_tointeger(L, -1);
	if (lua_getfield(L, idx, "instructions") == LUA_TNUMBER)
		lim.instructions = (uint64_t)lua_tonumber(L, -1);
	if (lua_getfield(L, idx, "timeout_ms") == LUA_TNUMBER)
		lim.wall_ms = (uint64_t)lua_tointeger(L, -1);
	lua_pop(L, 3);
	return lim;
}

/* Bundle from {dir=..., files={name=src}}; raises a Lua error on failure. */
static struct bundle *bundle_from(lua_State *L, int idx)
{
	char err[512];
	struct bundle *b = NULL;
	int rc;
	if (lua_getfield(L, idx, "dir") == LUA_TSTRING)
		rc = bundle_from_dir(lua_tostring(L, -1), &b, err, sizeof(err));
	else
		rc = bundle_builtin(&b);
	lua_pop(L, 1);
	if (rc != 0) {
		lua_pushfstring(L, "bundle: %s", err);
		return NULL;
	}
	if (lua_getfield(L, idx, "files") == LUA_TTABLE) {
		lua_pushnil(L);
		while (lua_next(L, -2)) {
			size_t len;
			const char *src = lua_tolstring(L, -1, &len);
			if (bundle_put(b, lua_tostring(L, -2), src ? src : "", src ? len : 0, err,
			               sizeof(err)) != 0) {
				bundle_free(b);
				lua_pushfstring(L, "bundle: %s", err);
				return NULL;
			}
			lua_pop(L, 1);
		}
	}
	lua_pop(L, 1);
	bundle_seal(b);
	return b;
}

static int push_outcome(lua_State *L, enum engine_status st, cJSON *out,
                        const struct engine_error *err)
{
	if (st == ENGINE_OK) {
		luajson_push(L, out);
		cJSON_Delete(out);
		return 1;
	}
	lua_pushnil(L);
	lua_pushstring(L, engine_status_name(st));
	lua_pushstring(L, err->message);
	return 3;
}

static cJSON *input_arg(lua_State *L, int idx)
{
	char err[256];
	if (lua_isnoneornil(L, idx))
		return cJSON_CreateObject();
	cJSON *j = luajson_to_json(L, idx, err, sizeof(err));
	if (!j)
		luaL_error(L, "input: %s", err);
	return j;
}

static int call_engine(lua_State *L, struct engine *e, const char *module, const char *fn,
                       int input_idx)
{
	cJSON *input = input_arg(L, input_idx), *out = NULL;
	struct engine_error err = {0};
	enum engine_status st = module ? engine_call_fn(e, module, fn, input, NULL, &out, &err)
	                               : engine_call(e, fn, input, &out, &err);
	cJSON_Delete(input);
	return push_outcome(L, st, out, &err);
}

static struct engine **check_engine(lua_State *L, int idx)
{
	return luaL_checkudata(L, idx, ENGINE_MT);
}

static int l_engine(lua_State *L)
{
	luaL_checktype(L, 1, LUA_TTABLE);
	struct engine_limits lim = limits_from(L, 1);
	struct bundle *b = bundle_from(L, 1);
	if (!b) {
		lua_pushnil(L);
		lua_insert(L, -2);
		return 2;
	}
	struct engine *e = NULL;
	struct engine_error err = {0};
	int rc = engine_new(b, &lim, &e, &err);
	bundle_free(b);
	if (rc != 0) {
		lua_pushnil(L);
		lua_pushstring(L, err.message);
		lua_pushstring(L, engine_status_name(err.status));
		return 3;
	}
	struct engine **ud = lua_newuserdatauv(L, sizeof(*ud), 0);
	*ud = e;
	luaL_setmetatable(L, ENGINE_MT);
	return 1;
}

static int l_engine_call(lua_State *L)
{
	return call_engine(L, *check_engine(L, 1), NULL, luaL_checkstring(L, 2), 3);
}

static int l_call_fn(lua_State *L)
{
	return call_engine(L, *check_engine(L, 1), luaL_checkstring(L, 2), luaL_checkstring(L, 3),
	                   4);
}

static int l_engine_digest(lua_State *L)
{
	lua_pushstring(L, engine_digest(*check_engine(L, 1)));
	return 1;
}

static int l_engine_memory(lua_State *L)
{
	lua_pushinteger(L, (lua_Integer)engine_memory(*check_engine(L, 1)));
	return 1;
}

static int l_engine_gc(lua_State *L)
{
	struct engine **ud = check_engine(L, 1);
	if (*ud)
		engine_unref(*ud);
	*ud = NULL;
	return 0;
}

static struct engine_slot *check_slot(lua_State *L, int idx)
{
	return luaL_checkudata(L, idx, SLOT_MT);
}

static int l_slot(lua_State *L)
{
	struct engine_limits lim = lua_istable(L, 1) ? limits_from(L, 1) : engine_limits_default;
	struct engine_slot *s = lua_newuserdatauv(L, sizeof(*s), 0);
	engine_slot_init(s, &lim);
	luaL_setmetatable(L, SLOT_MT);
	return 1;
}

static int l_slot_load(lua_State *L)
{
	struct engine_slot *s = check_slot(L, 1);
	luaL_checktype(L, 2, LUA_TTABLE);
	struct bundle *b = bundle_from(L, 2);
	if (!b) {
		lua_pushboolean(L, 0);
		lua_insert(L, -2);
		return 2;
	}
	struct engine_error err = {0};
	int rc = engine_slot_load(s, b, &err);
	bundle_free(b);
	lua_pushboolean(L, rc == 0);
	if (rc == 0)
		return 1;
	lua_pushstring(L, err.message);
	return 2;
}

static int l_slot_call(lua_State *L)
{
	struct engine_slot *s = check_slot(L, 1);
	if (!s->current)
		return luaL_error(L, "slot has no engine loaded");
	return call_engine(L, s->current, NULL, luaL_checkstring(L, 2), 3);
}

static int l_slot_generation(lua_State *L)
{
	lua_pushinteger(L, (lua_Integer)check_slot(L, 1)->generation);
	return 1;
}

static int l_slot_digest(lua_State *L)
{
	struct engine_slot *s = check_slot(L, 1);
	if (s->current)
		lua_pushstring(L, engine_digest(s->current));
	else
		lua_pushnil(L);
	return 1;
}

static int l_slot_last_error(lua_State *L)
{
	lua_pushstring(L, check_slot(L, 1)->last_error);
	return 1;
}

static int l_slot_gc(lua_State *L)
{
	engine_slot_clear(check_slot(L, 1));
	return 0;
}

static void new_class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc)
{
	luaL_newmetatable(L, name);
	lua_newtable(L);
	luaL_setfuncs(L, methods, 0);
	lua_setfield(L, -2, "__index");
	lua_pushcfunction(L, gc);
	lua_setfield(L, -2, "__gc");
	lua_pop(L, 1);
}

int luaopen_gkmspec(lua_State *L)
{
	static const luaL_Reg engine_methods[] = {{"call", l_engine_call},
	                                          {"call_fn", l_call_fn},
	                                          {"digest", l_engine_digest},
	                                          {"memory", l_engine_memory},
	                                          {NULL, NULL}};
	static const luaL_Reg slot_methods[] = {{"load", l_slot_load},
	                                        {"call", l_slot_call},
	                                        {"generation", l_slot_generation},
	                                        {"digest", l_slot_digest},
	                                        {"last_error", l_slot_last_error},
	                                        {NULL, NULL}};
	static const luaL_Reg funcs[] = {{"engine", l_engine}, {"slot", l_slot}, {NULL, NULL}};
	new_class(L, ENGINE_MT, engine_methods, l_engine_gc);
	new_class(L, SLOT_MT, slot_methods, l_slot_gc);
	luaL_newlib(L, funcs);
	return 1;
}
