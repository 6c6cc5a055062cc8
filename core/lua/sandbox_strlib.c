/* The string library's pattern functions (find, match, gmatch, gsub),
 * bounded. They run in C, where the budget hook never fires, and Lua's
 * matcher backtracks: each '*', '+' or '-' with more pattern after it may
 * retry every position of the subject, so a few of them over a long
 * annotation value a user wrote take minutes. Before each call the worst
 * case is estimated from the pattern and the subject's length; a call over
 * the per-call cap is refused with an error that says how to fix the
 * pattern, and the estimate is charged to the run's instruction budget. */
#include "sandbox.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

/* Worst-case matcher steps one call may take (about 0.1 s here: Lua's
 * matcher makes some 10^8 steps a second). */
#define PATTERN_MAX_STEPS 2e7

enum pfn { P_FIND, P_MATCH, P_GMATCH, P_GSUB };

static const char *const pfn_names[] = {"string.find", "string.match", "string.gmatch",
                                        "string.gsub"};

/* The end of the single-character class at p (pattern end e): "%x", "[set]",
 * or one character. */
static const char *class_end(const char *p, const char *e)
{
	if (*p == '%')
		return p + 2 <= e ? p + 2 : e;
	if (*p == '[') {
		p++;
		if (p < e && *p == '^')
			p++;
		do { /* the first ']' of a set is a member */
			if (p >= e)
				return e;
			if (*p == '%' && p + 1 < e)
				p++;
			p++;
		} while (p < e && *p != ']');
		return p < e ? p + 1 : e;
	}
	return p + 1;
}

/* Nothing that can fail follows q: only closing captures and a final '$'. */
static bool trailing(const char *q, const char *e)
{
	for (; q < e; q++)
		if (*q != ')' && !(*q == '$' && q + 1 == e))
			return false;
	return true;
}

/* Worst-case steps of matching pattern p (length plen) against a subject
 * of n bytes, from every start position unless anchored. */
static double pattern_cost(const char *p, size_t plen, size_t n, bool anchored)
{
	const char *e = p + plen;
	double per_start = 1, span = (double)n + 1;
	if (p < e && *p == '^') {
		p++;
	}
	while (p < e) {
		if (*p == '(' || *p == ')') {
			p++;
			continue;
		}
		if (*p == '%' && p + 1 < e && p[1] == 'b') { /* %bxy scans to the end */
			per_start *= span;
			p = p + 4 <= e ? p + 4 : e;
			continue;
		}
		if (*p == '%' && p + 1 < e && p[1] == 'f') { /* %f[set]: one test */
			p = class_end(p + 2, e);
			continue;
		}
		if (*p == '%' && p + 1 < e && p[1] >= '0' && p[1] <= '9') { /* back-reference */
			per_start *= span;
			p += 2;
			continue;
		}
		const char *q = class_end(p, e);
		if (q < e && (*q == '*' || *q == '+' || *q == '-')) {
			if (!trailing(q + 1, e))
				per_start *= span;
			q++;
		} else if (q < e && *q == '?') {
			per_start *= 2;
			q++;
		}
		p = q;
	}
	/* a long set is read for every character it tests */
	return per_start * (anchored ? 1 : span) * (1 + (double)plen / 64);
}

static bool has_specials(const char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (strchr("^$*+?.([%-", p[i]))
			return true;
	return false;
}

static int bounded_call(lua_State *L)
{
	enum pfn f = (enum pfn)lua_tointeger(L, lua_upvalueindex(2));
	size_t n = 0, plen = 0;
	luaL_checklstring(L, 1, &n);
	const char *p = luaL_checklstring(L, 2, &plen);
	bool plain = f == P_FIND && (lua_toboolean(L, 4) || !has_specials(p, plen));
	/* gmatch ignores '^' (it would stop the iteration); gsub and the others
	 * keep it as an anchor */
	bool anchored = f != P_GMATCH && plen > 0 && p[0] == '^';
	double cost =
	    plain ? ((double)n + 1) * (1 + (double)plen / 16) : pattern_cost(p, plen, n, anchored);
	if (cost > PATTERN_MAX_STEPS) {
		char msg[320];
		snprintf(msg, sizeof(msg),
		         "%s: pattern '%.60s' may take up to %.3g matching steps on a subject of "
		         "%zu bytes (the limit is %.3g): anchor it with '^', use fewer '-', '*' "
		         "and '+' before the end, or a plain find",
		         pfn_names[f], p, cost, n, PATTERN_MAX_STEPS);
		return luaL_error(L, "%s", msg);
	}
	sandbox_charge(L, cost);
	lua_pushvalue(L, lua_upvalueindex(1));
	lua_insert(L, 1);
	lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
	return lua_gettop(L);
}

void sandbox_bound_patterns(lua_State *L, int strlib)
{
	static const char *const names[] = {"find", "match", "gmatch", "gsub"};
	for (int i = 0; i < 4; i++) {
		lua_getfield(L, strlib, names[i]);
		lua_pushinteger(L, i);
		lua_pushcclosure(L, bounded_call, 2);
		lua_setfield(L, strlib, names[i]);
	}
}
