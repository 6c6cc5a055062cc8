-- gkm.rollout: which nodes may pull a cache's digest now (spec.rollout).
--
-- The operator calls plan(input) with the aggregation's input (see
-- policies/aggregate.lua) each time it aggregates a cache, and applies the
-- answer as status.rollout. The agents read it: a node pulls only once its
-- name is in rollout.pulling (when the cache has spec.rollout.maxPulling, or
-- its image comes through a mirror); until then it reports state Waiting,
-- with waitingSince, and throughMirror when it pulls through a mirror.
-- Everything the plan needs is in the objects (the previous status.rollout
-- and the node reports), so an operator that restarts, or another that takes
-- over, goes on where the last one stopped.
--
-- input = { cache = { rollout = { maxPulling = 5 | "25%" } or nil,
--                     status = { rollout = <the last answer> } },
--           digest = "sha256:...", nodes = { { name, entry } } }
-- answer = { rollout = { digest, maxPulling = n (absent: no limit; through a
--                        mirror at most the nodes Ready, one at first),
--                        pulling = { names, in the order granted },
--                        waiting = { names, first in line first } } or nil }
-- A node keeps its grant while it reports Waiting, Pending or Pulling on this
-- digest (a try after a failure is Pulling); Ready, Failed, Incompatible, a
-- report for another digest or none give the slot to the next in line.
local M = {}

-- The most nodes that pull at once, for n nodes on the digest (nil: no limit).
function M.limit(max, n)
  if math.type(max) == "integer" then
    return math.max(max, 1)
  end
  if type(max) == "string" then
    local pct = tonumber(max:match("^(%d+)%%$"))
    if pct and pct < 100 then
      return math.max(1, (n * pct + 99) // 100)
    end
  end
  return nil
end

local holding = { Waiting = true, Pending = true, Pulling = true }

function M.plan(input)
  local cache = type(input.cache) == "table" and input.cache or {}
  local digest = type(input.digest) == "string" and input.digest or ""
  if digest == "" then
    return {}
  end
  local spec = type(cache.rollout) == "table" and cache.rollout or {}
  local status = type(cache.status) == "table" and cache.status or {}
  local prev = type(status.rollout) == "table" and status.rollout or {}
  if prev.digest ~= digest then
    prev = {}
  end

  local entries, n, ready, mirrored = {}, 0, 0, false
  for _, node in ipairs(type(input.nodes) == "table" and input.nodes or {}) do
    local e = type(node) == "table" and node.entry
    if type(e) == "table" and e.digest == digest and type(node.name) == "string" then
      entries[node.name] = e
      if e.state ~= "Incompatible" and e.state ~= "Deleting" then
        n = n + 1
      end
      ready = ready + (e.state == "Ready" and 1 or 0)
      mirrored = mirrored or e.throughMirror == true
    end
  end
  local limit = M.limit(spec.maxPulling, n)
  -- through a cold mirror every node's miss reaches the origin, and a
  -- pull-through cache may still be storing what it streamed to the first
  -- node when that one is Ready: one node first, then no more nodes pull
  -- than are Ready (the Ready nodes double with each wave)
  if mirrored and (not limit or limit > math.max(1, ready)) then
    limit = math.max(1, ready)
  end

  local pulling, granted = {}, {}
  for _, name in ipairs(type(prev.pulling) == "table" and prev.pulling or {}) do
    local e = entries[name]
    if type(name) == "string" and e and holding[e.state] and not granted[name] then
      pulling[#pulling + 1], granted[name] = name, true
    end
  end
  local line = {}
  for name, e in pairs(entries) do
    if e.state == "Waiting" and not granted[name] then
      line[#line + 1] = { name = name, since = tostring(e.waitingSince or "") }
    end
  end
  table.sort(line, function(a, b)
    if a.since ~= b.since then
      return a.since < b.since
    end
    return a.name < b.name
  end)
  local waiting = {}
  for _, w in ipairs(line) do
    if not limit or #pulling < limit then
      pulling[#pulling + 1] = w.name
    else
      waiting[#waiting + 1] = w.name
    end
  end
  if spec.maxPulling == nil and #pulling == 0 and #waiting == 0 and next(status.rollout or {}) == nil then
    return {}
  end
  return { rollout = { digest = digest, maxPulling = limit, pulling = pulling, waiting = waiting } }
end

return M
