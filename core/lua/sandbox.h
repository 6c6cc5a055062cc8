/* The Lua sandbox: a lua_State whose allocator counts and caps memory, whose
 * globals are an allow-list frozen behind a read-only proxy, where blocked
 * functions are stubs that name themselves, and whose instruction/time budget
 * is enforced by a count hook that a script's own pcall cannot defeat (once
 * tripped, the hook fires on every instruction until control is back in C).
 *
 * Internal to the engine (engine.c is the only user). */
#ifndef GKM_SANDBOX_H
#define GKM_SANDBOX_H

#include <lua.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bundle.h"

struct sandbox {
	lua_State *L;
	/* memory accounting */
	size_t mem_used, mem_cap, mem_peak;
	bool mem_refused; /* an allocation was refused since the last arm */
	/* budget */
	bool armed, tripped;
	uint64_t instr_used, instr_max;
	uint64_t deadline_ms, wall_ms;
	char trip_msg[128];
	/* first blocked function called since the last arm ("os.execute") */
	char blocked[64];
	/* policy files, for require; borrowed from the engine */
	const struct bundle *bundle;
};

/* Create the state: 0, or -ENOMEM. */
__attribute__((warn_unused_result)) int sandbox_open(struct sandbox *sb, size_t mem_cap,
                                                     const struct bundle *b);
void sandbox_close(struct sandbox *sb);

/* Start a budgeted run (resets the per-run flags) / end it. */
void sandbox_arm(struct sandbox *sb, uint64_t instructions, uint64_t wall_ms);
void sandbox_disarm(struct sandbox *sb);

/* Push require(name)'s result (raises on error; call in protected mode). */
void sandbox_require(lua_State *L, const char *name);

/* lua_type of loaded[module][field] read raw (no metamethods run);
 * LUA_TNONE when the module is not loaded or is not a table. */
int sandbox_field_type(struct sandbox *sb, const char *module, const char *field);

/* Charge steps of work done in C (pattern matching) to the running budget;
 * raises, as the budget hook does, once it is spent. */
void sandbox_charge(lua_State *L, double steps);
/* Replace the pattern functions of the string library table at index
 * strlib by bounded ones (sandbox_strlib.c). */
void sandbox_bound_patterns(lua_State *L, int strlib);

/* The sandbox that owns L. */
struct sandbox *sandbox_of(lua_State *L);

#endif
