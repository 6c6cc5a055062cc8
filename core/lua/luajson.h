/* Plain data across the C/Lua boundary: cJSON <-> Lua tables.
 * Only data crosses: strings, numbers, booleans, tables (arrays and string-keyed
 * maps). Functions, userdata, cycles, mixed keys and excessive depth or size
 * are refused with a message, never followed. Metamethods are not invoked. */
#ifndef GKM_LUAJSON_H
#define GKM_LUAJSON_H

#include <cjson/cJSON.h>
#include <lua.h>
#include <stddef.h>

#define LUAJSON_MAX_DEPTH 64
#define LUAJSON_MAX_NODES 1000000

/* Push j as a Lua value (JSON null becomes nil; in arrays and objects the
 * element is left out). May raise a Lua memory error: call in protected mode. */
void luajson_push(lua_State *L, const cJSON *j);

/* Convert the value at idx. An empty table becomes an empty object, a table
 * with keys 1..n an array, one with string keys an object. Returns NULL and
 * fills err on anything else ("at .gpus[3].ids: function values cannot ..."). */
cJSON *luajson_to_json(lua_State *L, int idx, char *err, size_t errlen);

#endif
