/* gkm.cache_label: the Node label of a cache that is Ready on a node (the
 * scheme of core/cache/cache_label.h), for policies and the reconcile loops.
 *
 *   -- cache_label.key(name [, namespace]) -> key | nil, err
 *        namespace nil or "" for a ClusterGKMCache; err for a name or
 *        namespace no cluster would store. Raises when name is not a string.
 *   -- cache_label.VALUE  the label's value, "ready" */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>

#include "cache_label.h"
#include "engine.h"

static int l_key(lua_State *L)
{
	const char *name = luaL_checkstring(L, 1);
	const char *ns = luaL_optstring(L, 2, NULL);
	char key[CACHE_LABEL_KEY_MAX];
	int rc = cache_label_key(ns, name, key, sizeof(key));
	if (rc == 0) {
		lua_pushstring(L, key);
		return 1;
	}
	lua_pushnil(L);
	if (rc == -EINVAL)
		lua_pushfstring(L, "'%s%s%s' is not a cache name a cluster would store",
		                ns && ns[0] ? ns : "", ns && ns[0] ? "/" : "", name);
	else
		lua_pushstring(L, "out of memory");
	return 2;
}

static const luaL_Reg funcs[] = {{"key", l_key}, {NULL, NULL}};

static int open_cache_label(lua_State *L)
{
	luaL_newlib(L, funcs);
	lua_pushstring(L, CACHE_LABEL_VALUE);
	lua_setfield(L, -2, "VALUE");
	return 1;
}

ENGINE_MODULE(lua_cache_label_module, "gkm.cache_label", open_cache_label);
