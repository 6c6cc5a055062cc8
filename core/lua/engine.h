/* The Lua engine: one sandboxed lua_State holding the embedded lua/ modules
 * and one policy bundle, built and validated whole, then used read-mostly and
 * swapped whole on reload (see engine_slot). Only ever touched from the loop
 * thread (or the single thread of a CLI command).
 *
 * Exactly one function calls into Lua: engine_call(). It installs the
 * traceback handler, arms the instruction/time budget, converts plain JSON
 * tables in and out, validates the return value and maps every outcome to a
 * typed status. */
#ifndef GKM_ENGINE_H
#define GKM_ENGINE_H

#include <cjson/cJSON.h>
#include <lua.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bundle.h"
#include "engine_module.h"

enum engine_status {
	ENGINE_OK = 0,
	ENGINE_ERROR,      /* a Lua runtime or syntax error */
	ENGINE_TIMEOUT,    /* instruction or wall-clock budget exhausted */
	ENGINE_NOMEM,      /* memory cap reached */
	ENGINE_BLOCKED,    /* the script called a function the sandbox blocks */
	ENGINE_BAD_RETURN, /* the hook returned something its validator refused */
	ENGINE_NO_HOOK,    /* the bundle lacks the hook, or it is not a function */
};

struct engine_error {
	enum engine_status status;
	char message[1024]; /* "compat.lua:12: attempt to ..." plus a traceback */
};

struct engine_limits {
	size_t memory_bytes;   /* cap of the accounting allocator */
	uint64_t instructions; /* per call (and for loading the bundle) */
	uint64_t wall_ms;      /* per call */
};
extern const struct engine_limits engine_limits_default;

/* "ok", "error", "timeout", "out of memory", "blocked function", ... */
const char *engine_status_name(enum engine_status s);

/* ---- Hooks: the entry points C calls, each with a validator. ----
 * Hook "compat" calls require('compat').evaluate(input). Every registered
 * hook must exist in every bundle (a bundle without it is refused).
 * validate gets the converted return value; it returns 0, or -1 with a
 * message in err ("missing field 'compatible'"). */
typedef int (*engine_validate_fn)(const cJSON *result, char *err, size_t errlen);
struct engine_hook {
	const char *name;     /* "compat" */
	const char *module;   /* "compat" (policies/compat.lua) */
	const char *function; /* "evaluate" */
	engine_validate_fn validate;
};
#define ENGINE_HOOK(ident, ...)                                                                    \
	static const struct engine_hook ident                                                      \
	    __attribute__((used, section("gkm_hooks"), aligned(sizeof(void *)))) = {__VA_ARGS__}
const struct engine_hook *engine_hook_find(const char *name);

struct engine;

/* Build an engine from a bundle (the bundle is copied; the caller keeps it).
 * Loads every policy module, checks every registered hook. On failure *out
 * is untouched and err says which file, line and why. Caller releases the
 * engine with engine_unref(). */
__attribute__((warn_unused_result)) int engine_new(const struct bundle *b,
                                                   const struct engine_limits *lim,
                                                   struct engine **out, struct engine_error *err);
struct engine *engine_ref(struct engine *e);
void engine_unref(struct engine *e);

/* Call a hook with a plain-table input. On ENGINE_OK *out receives the
 * validated result (caller frees with cJSON_Delete); otherwise err says why
 * and *out is untouched. Returns the status. */
enum engine_status engine_call(struct engine *e, const char *hook, const cJSON *input, cJSON **out,
                               struct engine_error *err);

/* The same for any module function: require(module)[function](input), for
 * the Lua halves of the daemons (reconcile loops in lua/gkm/). validate may
 * be NULL (then any plain data is accepted). Same single protected path. */
enum engine_status engine_call_fn(struct engine *e, const char *module, const char *function,
                                  const cJSON *input, engine_validate_fn validate, cJSON **out,
                                  struct engine_error *err);

/* Content digest of the bundle the engine was built from ("sha256:<hex>"). */
const char *engine_digest(const struct engine *e);
/* Bytes the engine's Lua state holds now. */
size_t engine_memory(const struct engine *e);
/* Collect the Lua garbage now, as after a burst of calls whose inputs were
 * big (the operator's aggregation of every cache). Same thread rules as
 * engine_call. */
void engine_collect(struct engine *e);

/* ---- The slot a daemon keeps its current engine in. ----
 * engine_slot_load() builds aside and swaps only on success: the previous
 * engine keeps answering when the new bundle is refused. */
struct engine_slot {
	struct engine *current; /* owned reference; NULL before the first load */
	uint64_t generation;    /* bumps on every successful swap */
	char last_error[1024];  /* why the last load was refused ("" if it was not) */
	struct engine_limits limits;
};
void engine_slot_init(struct engine_slot *s, const struct engine_limits *lim);
/* 0 if swapped (or unchanged: same digest, no new generation), -1 if refused. */
int engine_slot_load(struct engine_slot *s, const struct bundle *b, struct engine_error *err);
void engine_slot_clear(struct engine_slot *s);

#endif
