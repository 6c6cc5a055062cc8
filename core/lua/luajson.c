#include "luajson.h"

#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void luajson_push(lua_State *L, const cJSON *j)
{
	luaL_checkstack(L, 3, "JSON nesting too deep");
	if (!j || cJSON_IsNull(j) || cJSON_IsInvalid(j)) {
		lua_pushnil(L);
	} else if (cJSON_IsBool(j)) {
		lua_pushboolean(L, cJSON_IsTrue(j));
	} else if (cJSON_IsNumber(j)) {
		double d = j->valuedouble;
		if (d == floor(d) && fabs(d) < 9007199254740992.0)
			lua_pushinteger(L, (lua_Integer)d);
		else
			lua_pushnumber(L, d);
	} else if (cJSON_IsString(j)) {
		lua_pushstring(L, j->valuestring);
	} else if (cJSON_IsArray(j)) {
		lua_createtable(L, cJSON_GetArraySize(j), 0);
		lua_Integer i = 1;
		const cJSON *c;
		cJSON_ArrayForEach(c, j)
		{
			if (cJSON_IsNull(c))
				continue;
			luajson_push(L, c);
			lua_rawseti(L, -2, i++);
		}
	} else {
		lua_createtable(L, 0, cJSON_GetArraySize(j));
		const cJSON *c;
		cJSON_ArrayForEach(c, j)
		{
			if (cJSON_IsNull(c) || !c->string)
				continue;
			luajson_push(L, c);
			lua_setfield(L, -2, c->string);
		}
	}
}

struct conv {
	char *err;
	size_t errlen;
	size_t nodes;
	char path[256];
};

static cJSON *fail(struct conv *cv, const char *what)
{
	snprintf(cv->err, cv->errlen, "at %s: %s", cv->path[0] ? cv->path : "(top)", what);
	return NULL;
}

static cJSON *convert(lua_State *L, int idx, struct conv *cv, int depth);

/* Classify a table: 1 = array 1..n, 2 = string-keyed map, 0 = empty, -1 = mixed. */
static int table_kind(lua_State *L, int idx, size_t *n)
{
	size_t count = 0, strings = 0;
	lua_Integer max = 0;
	lua_pushnil(L);
	while (lua_next(L, idx)) {
		lua_pop(L, 1);
		count++;
		if (lua_type(L, -1) == LUA_TSTRING)
			strings++;
		else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) > 0)
			max = lua_tointeger(L, -1) > max ? lua_tointeger(L, -1) : max;
		else {
			lua_pop(L, 1);
			return -1;
		}
	}
	*n = count;
	if (count == 0)
		return 0;
	if (strings == count)
		return 2;
	if (strings == 0 && (size_t)max == count)
		return 1;
	return -1;
}

static cJSON *convert_table(lua_State *L, int idx, struct conv *cv, int depth)
{
	size_t n = 0;
	int kind = table_kind(L, idx, &n);
	size_t plen = strlen(cv->path);
	cJSON *out = NULL;
	if (kind < 0)
		return fail(cv, "table mixes array and map keys (or has non-string keys)");
	if (kind == 1) {
		out = cJSON_CreateArray();
		for (size_t i = 1; out && i <= n; i++) {
			snprintf(cv->path + plen, sizeof(cv->path) - plen, "[%zu]", i);
			lua_rawgeti(L, idx, (lua_Integer)i);
			cJSON *c = convert(L, lua_gettop(L), cv, depth + 1);
			lua_pop(L, 1);
			if (!c) {
				cJSON_Delete(out);
				return NULL;
			}
			cJSON_AddItemToArray(out, c);
		}
	} else {
		out = cJSON_CreateObject();
		lua_pushnil(L);
		while (out && lua_next(L, idx)) {
			const char *k = lua_tostring(L, -2); /* keys are strings here */
			snprintf(cv->path + plen, sizeof(cv->path) - plen, ".%s", k);
			cJSON *c = convert(L, lua_gettop(L), cv, depth + 1);
			lua_pop(L, 1);
			if (!c) {
				lua_pop(L, 1);
				cJSON_Delete(out);
				return NULL;
			}
			cJSON_AddItemToObject(out, k, c);
		}
	}
	cv->path[plen] = '\0';
	return out;
}

static cJSON *convert(lua_State *L, int idx, struct conv *cv, int depth)
{
	if (depth > LUAJSON_MAX_DEPTH)
		return fail(cv, "nesting deeper than 64 levels (or a cycle)");
	if (++cv->nodes > LUAJSON_MAX_NODES)
		return fail(cv, "more than 1000000 values");
	if (!lua_checkstack(L, 4))
		return fail(cv, "Lua stack exhausted");
	switch (lua_type(L, idx)) {
	case LUA_TNIL:
		return cJSON_CreateNull();
	case LUA_TBOOLEAN:
		return cJSON_CreateBool(lua_toboolean(L, idx));
	case LUA_TNUMBER: {
		double d =
		    lua_isinteger(L, idx) ? (double)lua_tointeger(L, idx) : lua_tonumber(L, idx);
		if (!isfinite(d))
			return fail(cv, "number is not finite (NaN or inf)");
		return cJSON_CreateNumber(d);
	}
	case LUA_TSTRING:
		return cJSON_CreateString(lua_tostring(L, idx));
	case LUA_TTABLE:
		return convert_table(L, idx, cv, depth);
	default: {
		char what[64];
		snprintf(what, sizeof(what), "%s values cannot leave Lua", luaL_typename(L, idx));
		return fail(cv, what);
	}
	}
}

cJSON *luajson_to_json(lua_State *L, int idx, char *err, size_t errlen)
{
	struct conv cv = {.err = err, .errlen = errlen, .nodes = 0, .path = ""};
	idx = lua_absindex(L, idx);
	return convert(L, idx, &cv, 0);
}
