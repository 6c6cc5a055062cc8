/* Built-in C modules reachable from policies as require('gkm.NAME'): the
 * registration both the engine's users (the modules) and the sandbox's
 * require (which finds them) see, so that neither needs the other's header. */
#ifndef GKM_ENGINE_MODULE_H
#define GKM_ENGINE_MODULE_H

#include <lua.h>

/* Register with ENGINE_MODULE(ident, "gkm.name", open_fn) in the file that
 * implements the module; open_fn pushes the module table (luaL_newlib). */
struct engine_module {
	const char *name;
	lua_CFunction open;
};
#define ENGINE_MODULE(ident, ...)                                                                  \
	static const struct engine_module ident                                                    \
	    __attribute__((used, section("gkm_modules"), aligned(sizeof(void *)))) = {__VA_ARGS__}

#endif
