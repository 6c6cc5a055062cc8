#!/usr/bin/env bash
# Lua engine call overhead: the admission hook through the real engine.
set -eu
cd "$GKM_ROOT"
exec lua5.4 - <<'LUA'
package.cpath = os.getenv("GKM_BUILD") .. "/spec/?.so;" .. package.cpath
local gkmspec = require "gkmspec"
local e = assert(gkmspec.engine{ dir = "policies" })
local input = { image = { ref = "quay.io/a/b:v1", registry = "quay.io" },
                signatures = { { kind = "simple", verified = true } },
                config = { verifyEnabled = true } }
local runs = {}
for r = 1, 5 do
  local n, t0 = 20000, os.clock()
  for _ = 1, n do assert(e:call("admission", input)) end
  runs[r] = n / (os.clock() - t0)
end
table.sort(runs)
print(string.format("admission hook calls/s (CPU time, 5 runs): median %.0f  min %.0f  max %.0f",
  runs[3], runs[1], runs[5]))
LUA
