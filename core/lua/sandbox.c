#include "sandbox.h"

#include <errno.h>
#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedded.h"
#include "engine_module.h"
#include "log.h"
#include "loop.h"

/* How often (in VM instructions) the budget hook runs before it trips. */
#define HOOK_STEP 1000

/* Registry keys (addresses are unique). */
static const char key_loaded = 'L'; /* name -> module value, or key_loading while loading */
static const char key_loading = 'l';
static const char key_env = 'E';    /* the frozen global proxy every chunk gets as _ENV */
static const char key_frozen = 'F'; /* marker field in metatables of frozen proxies */

/* The ENGINE_MODULE entries collected by the linker. */
extern const struct engine_module __start_gkm_modules[] __attribute__((weak));
extern const struct engine_module __stop_gkm_modules[] __attribute__((weak));

struct sandbox *sandbox_of(lua_State *L)
{
	return *(struct sandbox **)lua_getextraspace(L);
}

/* ---- memory ---- */

static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
	struct sandbox *sb = ud;
	size_t old = ptr ? osize : 0; /* with ptr NULL, osize is a type tag */
	if (nsize == 0) {
		free(ptr);
		sb->mem_used -= old;
		return NULL;
	}
	if (nsize > old && sb->mem_used + (nsize - old) > sb->mem_cap) {
		sb->mem_refused = true;
		return NULL;
	}
	void *p = realloc(ptr, nsize);
	if (!p) {
		sb->mem_refused = true;
		return NULL;
	}
	sb->mem_used = sb->mem_used - old + nsize;
	if (sb->mem_used > sb->mem_peak)
		sb->mem_peak = sb->mem_used;
	return p;
}

/* ---- budget ---- */

static void budget_hook(lua_State *L, lua_Debug *ar);

/* Count n more instructions against the budget; raise once it is spent. */
static void spend(lua_State *L, struct sandbox *sb, uint64_t n)
{
	if (!sb->tripped) {
		sb->instr_used += n;
		if (sb->instr_used > sb->instr_max)
			snprintf(sb->trip_msg, sizeof(sb->trip_msg),
			         "instruction budget of %llu exceeded",
			         (unsigned long long)sb->instr_max);
		else if (loop_now_ms() > sb->deadline_ms)
			snprintf(sb->trip_msg, sizeof(sb->trip_msg),
			         "time budget of %llu ms exceeded",
			         (unsigned long long)sb->wall_ms);
		else
			return;
		sb->tripped = true;
		/* From now on fire on every instruction: a pcall in the script may
		 * catch one error, but the next instruction it runs raises again. */
		lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1);
	}
	luaL_error(L, "%s", sb->trip_msg);
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
	(void)ar;
	struct sandbox *sb = sandbox_of(L);
	if (sb->armed)
		spend(L, sb, HOOK_STEP);
}

void sandbox_charge(lua_State *L, double steps)
{
	struct sandbox *sb = sandbox_of(L);
	if (sb->armed)
		spend(L, sb, steps < 1 ? 1 : steps > 1e18 ? (uint64_t)1e18 : (uint64_t)steps);
}

void sandbox_arm(struct sandbox *sb, uint64_t instructions, uint64_t wall_ms)
{
	sb->armed = true;
	sb->tripped = false;
	sb->mem_refused = false;
	sb->blocked[0] = '\0';
	sb->trip_msg[0] = '\0';
	sb->instr_used = 0;
	sb->instr_max = instructions;
	sb->wall_ms = wall_ms;
	sb->deadline_ms = loop_now_ms() + wall_ms;
	lua_sethook(sb->L, budget_hook, LUA_MASKCOUNT, HOOK_STEP);
}

void sandbox_disarm(struct sandbox *sb)
{
	sb->armed = false;
	lua_sethook(sb->L, NULL, 0, 0);
}

/* ---- blocked functions ---- */

static int blocked_call(lua_State *L)
{
	struct sandbox *sb = sandbox_of(L);
	const char *name = lua_tostring(L, lua_upvalueindex(1));
	if (!sb->blocked[0])
		snprintf(sb->blocked, sizeof(sb->blocked), "%s", name);
	return luaL_error(L, "blocked function '%s': not available in the gkm policy sandbox",
	                  name);
}

static void push_blocked(lua_State *L, const char *name)
{
	lua_pushstring(L, name);
	lua_pushcclosure(L, blocked_call, 1);
}

/* __index of a stub library: any field is a blocked function named lib.field. */
static int stub_index(lua_State *L)
{
	const char *lib = lua_tostring(L, lua_upvalueindex(1));
	const char *field = luaL_checkstring(L, 2);
	lua_pushfstring(L, "%s.%s", lib, field);
	lua_pushcclosure(L, blocked_call, 1);
	return 1;
}

/* ---- frozen proxies ---- */

static int frozen_newindex(lua_State *L)
{
	const char *what = lua_tostring(L, lua_upvalueindex(1));
	const char *k = lua_tostring(L, 2);
	if (strcmp(what, "_G") == 0)
		return luaL_error(L,
		                  "assignment to global '%s': globals are frozen in gkm policies "
		                  "(use a local)",
		                  k ? k : "?");
	return luaL_error(L, "cannot modify '%s.%s': built-in tables are read-only", what,
	                  k ? k : "?");
}

/* Globals are strict: reading a name that does not exist is an error, which
 * catches typos in policies at the line that has them. */
static int strict_index(lua_State *L)
{
	lua_pushvalue(L, 2);
	lua_rawget(L, lua_upvalueindex(1));
	if (lua_isnil(L, -1) && lua_type(L, 2) == LUA_TSTRING)
		return luaL_error(L, "undefined global '%s'", lua_tostring(L, 2));
	return 1;
}

static int frozen_next(lua_State *L)
{
	/* iterate the real table (upvalue), ignoring the proxy argument */
	lua_settop(L, 2);
	if (lua_next(L, lua_upvalueindex(1)))
		return 2;
	lua_pushnil(L);
	return 1;
}

static int frozen_pairs_mm(lua_State *L)
{
	lua_pushvalue(L, lua_upvalueindex(1));
	lua_pushcclosure(L, frozen_next, 1);
	lua_pushvalue(L, 1);
	lua_pushnil(L);
	return 3;
}

static int frozen_len(lua_State *L)
{
	lua_pushinteger(L, (lua_Integer)lua_rawlen(L, lua_upvalueindex(1)));
	return 1;
}

/* Replace the table at the top of the stack by a read-only proxy of it. */
static void freeze_top(lua_State *L, const char *name, bool strict)
{
	int real = lua_gettop(L);
	lua_newtable(L);          /* proxy */
	lua_createtable(L, 0, 6); /* metatable */
	lua_pushvalue(L, real);
	if (strict)
		lua_pushcclosure(L, strict_index, 1);
	lua_setfield(L, -2, "__index");
	lua_pushstring(L, name);
	lua_pushcclosure(L, frozen_newindex, 1);
	lua_setfield(L, -2, "__newindex");
	lua_pushvalue(L, real);
	lua_pushcclosure(L, frozen_pairs_mm, 1);
	lua_setfield(L, -2, "__pairs");
	lua_pushvalue(L, real);
	lua_pushcclosure(L, frozen_len, 1);
	lua_setfield(L, -2, "__len");
	lua_pushliteral(L, "frozen");
	lua_setfield(L, -2, "__metatable");
	lua_pushboolean(L, 1);
	lua_rawsetp(L, -2, &key_frozen);
	lua_setmetatable(L, -2);
	lua_replace(L, real);
}

static bool is_frozen(lua_State *L, int idx)
{
	if (!lua_getmetatable(L, idx))
		return false;
	lua_rawgetp(L, -1, &key_frozen);
	bool f = lua_toboolean(L, -1);
	lua_pop(L, 2);
	return f;
}

/* ---- replacements for base functions ---- */

static int safe_rawset(lua_State *L)
{
	luaL_checktype(L, 1, LUA_TTABLE);
	if (is_frozen(L, 1))
		return luaL_error(L, "rawset on a frozen table is not allowed");
	luaL_checkany(L, 2);
	luaL_checkany(L, 3);
	lua_settop(L, 3);
	lua_rawset(L, 1);
	return 1;
}

static int safe_setmetatable(lua_State *L)
{
	luaL_checktype(L, 1, LUA_TTABLE);
	if (is_frozen(L, 1))
		return luaL_error(L, "setmetatable on a frozen table is not allowed");
	int t = lua_type(L, 2);
	luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
	if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
		return luaL_error(L, "cannot change a protected metatable");
	/* A finalizer runs when the collector decides, with hooks off and
	 * after the budget is disarmed: outside every limit. Lua marks an
	 * object for finalization only when its metatable has __gc (read raw)
	 * at this moment, so this one check closes the route. */
	lua_pushliteral(L, "__gc");
	if (t == LUA_TTABLE && lua_rawget(L, 2) != LUA_TNIL) {
		lua_settop(L, 0);
		push_blocked(L, "setmetatable with __gc (finalizers run outside the budget)");
		lua_call(L, 0, 0);
	}
	lua_settop(L, 2);
	lua_setmetatable(L, 1);
	return 1;
}

/* load(chunk [, chunkname [, mode [, env]]]): text only, env defaults to the
 * frozen globals. A binary chunk is a blocked operation, not a plain error. */
static int safe_load(lua_State *L)
{
	size_t len = 0;
	const char *s = lua_tolstring(L, 1, &len);
	if (!s)
		return luaL_error(L, "load: only strings can be loaded in the gkm sandbox");
	if (len > 0 && s[0] == LUA_SIGNATURE[0]) {
		lua_settop(L, 0);
		push_blocked(L, "load (binary chunk)");
		lua_call(L, 0, 0);
		return 0;
	}
	const char *name = luaL_optstring(L, 2, "=(load)");
	int env = !lua_isnone(L, 4) ? 4 : 0;
	if (luaL_loadbufferx(L, s, len, name, "t") != LUA_OK) {
		lua_pushnil(L);
		lua_insert(L, -2);
		return 2;
	}
	if (env)
		lua_pushvalue(L, env);
	else
		lua_rawgetp(L, LUA_REGISTRYINDEX, &key_env);
	if (!lua_setupvalue(L, -2, 1))
		lua_pop(L, 1);
	return 1;
}

static int safe_collectgarbage(lua_State *L)
{
	const char *opt = luaL_optstring(L, 1, "collect");
	if (strcmp(opt, "count") == 0) {
		int kb = lua_gc(L, LUA_GCCOUNT, 0), b = lua_gc(L, LUA_GCCOUNTB, 0);
		lua_pushnumber(L, (lua_Number)kb + (lua_Number)b / 1024.0);
		return 1;
	}
	lua_pushfstring(L, "collectgarbage('%s')", opt);
	lua_pushcclosure(L, blocked_call, 1);
	lua_call(L, 0, 0);
	return 0;
}

/* print goes to the daemon's log, one record per call. */
static int lua_print_log(lua_State *L)
{
	luaL_Buffer b;
	int n = lua_gettop(L);
	luaL_buffinit(L, &b);
	for (int i = 1; i <= n; i++) {
		if (i > 1)
			luaL_addchar(&b, '\t');
		luaL_tolstring(L, i, NULL);
		luaL_addvalue(&b);
	}
	luaL_pushresult(&b);
	log_info("lua print", "text", lua_tostring(L, -1));
	return 0;
}

/* ---- require ---- */

static const struct embedded_file *find_embedded(const char *path)
{
	for (const struct embedded_file *f = gkm_embedded; f->name; f++)
		if (strcmp(f->name, path) == 0)
			return f;
	return NULL;
}

static void load_chunk(lua_State *L, const char *src, size_t len, const char *chunkname)
{
	if (luaL_loadbufferx(L, src, len, chunkname, "t") != LUA_OK)
		lua_error(L);
	lua_rawgetp(L, LUA_REGISTRYINDEX, &key_env);
	lua_setupvalue(L, -2, 1);
}

static bool valid_module_name(const char *name)
{
	if (!*name || strlen(name) > 64)
		return false;
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '_' || *p == '.' || *p == '-'))
			return false;
	return strstr(name, "..") == NULL && name[0] != '.';
}

/* Push the loader for name (a function taking no argument), or raise. */
static void push_loader(lua_State *L, const char *name)
{
	struct sandbox *sb = sandbox_of(L);
	char path[128];
	if (strncmp(name, "gkm.", 4) == 0) {
		/* start/stop symbols of one linker section */
		const struct engine_module *end = __stop_gkm_modules;
		// cppcheck-suppress comparePointers
		for (const struct engine_module *m = __start_gkm_modules; m && m < end; m++) {
			if (strcmp(m->name, name) == 0) {
				lua_pushcfunction(L, m->open);
				return;
			}
		}
		snprintf(path, sizeof(path), "lua/gkm/%s.lua", name + 4);
		const struct embedded_file *f = find_embedded(path);
		if (f) {
			char chunk[140];
			snprintf(chunk, sizeof(chunk), "@%s", path + 4);
			load_chunk(L, f->data, f->size, chunk);
			return;
		}
	} else {
		snprintf(path, sizeof(path), "%s.lua", name);
		const struct bundle_file *bf = sb->bundle ? bundle_get(sb->bundle, path) : NULL;
		if (bf) {
			char chunk[140];
			snprintf(chunk, sizeof(chunk), "@%s", path);
			load_chunk(L, bf->source, bf->size, chunk);
			return;
		}
	}
	luaL_error(L,
	           "module '%s' not found (only gkm.* built-ins and the bundle's own modules "
	           "can be required)",
	           name);
}

void sandbox_require(lua_State *L, const char *name)
{
	if (!valid_module_name(name))
		luaL_error(L, "invalid module name '%s'", name);
	lua_rawgetp(L, LUA_REGISTRYINDEX, &key_loaded);
	int loaded = lua_gettop(L);
	lua_getfield(L, loaded, name);
	if (lua_touserdata(L, -1) == &key_loading)
		luaL_error(L, "module '%s' requires itself (require cycle)", name);
	if (!lua_isnil(L, -1)) {
		lua_replace(L, loaded);
		return;
	}
	lua_pop(L, 1);
	lua_pushlightuserdata(L, (void *)&key_loading);
	lua_setfield(L, loaded, name);
	push_loader(L, name);
	lua_pushstring(L, name);
	lua_call(L, 1, 1);
	if (lua_isnil(L, -1)) {
		lua_pop(L, 1);
		lua_pushboolean(L, 1);
	}
	lua_pushvalue(L, -1);
	lua_setfield(L, loaded, name);
	lua_replace(L, loaded);
}

/* Protected part of sandbox_field_type: args are two C strings as light userdata. */
static int field_type_p(lua_State *L)
{
	const char *module = lua_touserdata(L, 1), *field = lua_touserdata(L, 2);
	int t = LUA_TNONE;
	lua_rawgetp(L, LUA_REGISTRYINDEX, &key_loaded);
	lua_pushstring(L, module);
	if (lua_rawget(L, -2) == LUA_TTABLE) {
		lua_pushstring(L, field);
		t = lua_rawget(L, -2);
	}
	lua_pushinteger(L, t);
	return 1;
}

int sandbox_field_type(struct sandbox *sb, const char *module, const char *field)
{
	lua_State *L = sb->L;
	int top = lua_gettop(L), t = LUA_TNONE;
	lua_pushcfunction(L, field_type_p);
	lua_pushlightuserdata(L, (void *)module);
	lua_pushlightuserdata(L, (void *)field);
	if (lua_pcall(L, 2, 1, 0) == LUA_OK)
		t = (int)lua_tointeger(L, -1);
	lua_settop(L, top);
	return t;
}

static int lua_require(lua_State *L)
{
	const char *name = luaL_checkstring(L, 1);
	lua_settop(L, 1);
	sandbox_require(L, name);
	return 1;
}

/* ---- building the globals ---- */

static const char *const base_allowed[] = {
    "assert",   "error",    "getmetatable", "ipairs",   "next",   "pairs",
    "pcall",    "rawequal", "rawget",       "rawlen",   "select", "tonumber",
    "tostring", "type",     "xpcall",       "_VERSION", NULL,
};
static const char *const os_allowed[] = {"time", "clock", "date", "difftime", NULL};

/* Open lib, keep it as a plain table at the top of the stack. */
static void open_lib(lua_State *L, const char *name, lua_CFunction open)
{
	luaL_requiref(L, name, open, 0);
}

static void copy_fields(lua_State *L, int from, int to, const char *const *names)
{
	for (; *names; names++) {
		lua_getfield(L, from, *names);
		lua_setfield(L, to, *names);
	}
}

/* A library table: allowed functions copied from src (if any), anything else
 * a named blocked stub. Leaves the frozen proxy on the stack. */
static void push_partial_lib(lua_State *L, const char *lib, int src, const char *const *allowed)
{
	lua_newtable(L);
	int t = lua_gettop(L);
	if (src)
		copy_fields(L, src, t, allowed);
	lua_newtable(L);
	lua_pushstring(L, lib);
	lua_pushcclosure(L, stub_index, 1);
	lua_setfield(L, -2, "__index");
	lua_setmetatable(L, t);
	freeze_top(L, lib, false);
}

static int build_globals(lua_State *L)
{
	lua_newtable(L);
	int G = lua_gettop(L);

	/* base: only the allow-listed functions of the real base library */
	luaL_requiref(L, "_G", luaopen_base, 0);
	int base = lua_gettop(L);
	copy_fields(L, base, G, base_allowed);
	lua_pop(L, 1);

	lua_pushcfunction(L, safe_rawset);
	lua_setfield(L, G, "rawset");
	lua_pushcfunction(L, safe_setmetatable);
	lua_setfield(L, G, "setmetatable");
	lua_pushcfunction(L, safe_load);
	lua_setfield(L, G, "load");
	lua_pushcfunction(L, safe_collectgarbage);
	lua_setfield(L, G, "collectgarbage");
	lua_pushcfunction(L, lua_print_log);
	lua_setfield(L, G, "print");
	lua_pushcfunction(L, lua_require);
	lua_setfield(L, G, "require");
	static const char *const blocked_base[] = {"dofile", "loadfile", "loadstring", "warn",
	                                           "module", "setfenv",  "getfenv",    NULL};
	for (const char *const *b = blocked_base; *b; b++) {
		push_blocked(L, *b);
		lua_setfield(L, G, *b);
	}

	/* string: dump is blocked in the real table too (strings reach it
	 * through their metatable), and the string metatable is protected. */
	open_lib(L, LUA_STRLIBNAME, luaopen_string);
	push_blocked(L, "string.dump");
	lua_setfield(L, -2, "dump");
	sandbox_bound_patterns(L, lua_gettop(L));
	lua_pushliteral(L, "");
	lua_getmetatable(L, -1);
	lua_pushliteral(L, "string");
	lua_setfield(L, -2, "__metatable");
	lua_pop(L, 2);
	lua_pushvalue(L, -1);
	freeze_top(L, "string", false);
	lua_setfield(L, G, "string");
	/* the string metatable's __index must not hand out the mutable table */
	lua_pushliteral(L, "");
	lua_getmetatable(L, -1);
	lua_getfield(L, G, "string");
	lua_setfield(L, -2, "__index");
	lua_pop(L, 3);

	const struct {
		const char *name;
		lua_CFunction open;
	} libs[] = {{LUA_TABLIBNAME, luaopen_table},
	            {LUA_MATHLIBNAME, luaopen_math},
	            {LUA_UTF8LIBNAME, luaopen_utf8}};
	for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
		open_lib(L, libs[i].name, libs[i].open);
		freeze_top(L, libs[i].name, false);
		lua_setfield(L, G, libs[i].name);
	}

	open_lib(L, LUA_OSLIBNAME, luaopen_os);
	push_partial_lib(L, "os", lua_gettop(L), os_allowed);
	lua_setfield(L, G, "os");
	lua_pop(L, 1);
	static const char *const none[] = {NULL};
	static const char *const stub_libs[] = {"io", "debug", "package", "coroutine", NULL};
	for (const char *const *s = stub_libs; *s; s++) {
		push_partial_lib(L, *s, 0, none);
		lua_setfield(L, G, *s);
	}

	/* _G must name the proxy, or `_G.x = 1` would write the real table */
	lua_pushvalue(L, G);
	freeze_top(L, "_G", true);
	lua_pushvalue(L, -1);
	lua_setfield(L, G, "_G");
	lua_rawsetp(L, LUA_REGISTRYINDEX, &key_env);

	/* the global table of the state itself is left empty: chunks only ever
	 * see the frozen proxy as their _ENV */
	lua_newtable(L);
	lua_rawsetp(L, LUA_REGISTRYINDEX, &key_loaded);
	return 0;
}

int sandbox_open(struct sandbox *sb, size_t mem_cap, const struct bundle *b)
{
	memset(sb, 0, sizeof(*sb));
	sb->mem_cap = mem_cap;
	sb->bundle = b;
	lua_State *L = lua_newstate(sandbox_alloc, sb);
	if (!L)
		return -ENOMEM;
	*(struct sandbox **)lua_getextraspace(L) = sb;
	sb->L = L;
	lua_pushcfunction(L, build_globals);
	if (lua_pcall(L, 0, 0, 0) != LUA_OK) {
		log_error("lua sandbox setup failed", "error", lua_tostring(L, -1));
		lua_close(L);
		sb->L = NULL;
		return -ENOMEM;
	}
	return 0;
}

void sandbox_close(struct sandbox *sb)
{
	if (sb->L)
		lua_close(sb->L);
	sb->L = NULL;
}
