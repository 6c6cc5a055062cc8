-- Placement policy: for each cache a pod mounts, how the admission webhook
-- steers the pod to the nodes where that cache is Ready. The webhook adds node
-- affinity on the cache's Node label (key below, value "ready"): "required"
-- ANDs it into every required nodeSelectorTerm (the pod runs only where the
-- cache is Ready, and waits Pending while no node has it); "preferred" adds a
-- preferredSchedulingTerm of the given weight (the scheduler favours those
-- nodes, the pod may run elsewhere); "none" adds nothing.
--
-- Input (a plain table, built by the webhook):
--   pod    = { namespace = "team-a", name = "vllm-0" (may be "" when the pod
--              has only a generateName), generateName = "vllm-",
--              labels = {...}, annotations = {...},
--              runtime = { triton = "3.2.0" } }  -- annotation gkm.io/runtime
--                                         -- ("triton=3.2.0,..."); absent without it
--   caches = { {
--     volume     = "kernels",              -- the pod's volume name
--     mount      = "csi" | "image" | "claim",  -- a csi.gkm.io volume, an image
--                                          -- volume naming the cache's image, or
--                                          -- the cache's claim (spec.claim)
--     kind       = "GKMCache" | "ClusterGKMCache",
--     namespace  = "team-a",               -- absent for a ClusterGKMCache
--     name       = "llama",
--     label      = "team-a.gkmcache.gkm.io/llama",  -- the Node label key
--     known      = true,                   -- the webhook has the cache object
--     readyNodes = 2, totalNodes = 3,      -- from its status (0 when unknown)
--     ready      = true,                   -- its Ready condition is True
--     attributes = { readOnly = "false" }, -- csi: the volume's attributes
--     image      = "registry/repo:tag@sha256:...",  -- image: what is mounted
--     identity   = { triton = { "3.2.0" }, vllmCodeHash = { ... } },
--                  -- what compiled the cache (its image's identity label);
--                  -- absent when the image records none
--   }, ... }
--
-- Output: { placements = { [volume] = { mode = "required" | "preferred" |
--           "none", weight = 1..100 (preferred only), reason = "for the user",
--           warning = "..." (optional: shown by kubectl, an Event on the cache),
--           refuse = "..." (optional: the pod is denied, RuntimeMismatch) } } }
-- with an entry for every volume of input.caches. The reason is shown in the
-- pod's gkm.io/placement annotation and in the Event on the cache.
local M = {}

-- Weight of a preferred placement (1..100; the scheduler adds it to a node's
-- score when the node carries the label).
M.preferred_weight = 100

local function count(v)
  return math.type(v) == "integer" and v > 0 and v or 0
end

local function where(c)
  return string.format("ready on %d of %d nodes", count(c.readyNodes), count(c.totalNodes))
end

local function cache_name(c)
  if c.kind == "ClusterGKMCache" then
    return "ClusterGKMCache " .. tostring(c.name)
  end
  return string.format("GKMCache %s/%s", tostring(c.namespace), tostring(c.name))
end

-- A CSI volume is mounted only where the agent made the cache Ready, so the
-- pod is required to run there; while no node has it, the pod waits Pending
-- (not stuck in ContainerCreating on a node that will never have it).
-- A volume with onMiss "empty" starts anywhere (elsewhere with an empty
-- directory, compiling its kernels), so the Ready nodes are only preferred.
local function csi(c)
  local attrs = type(c.attributes) == "table" and c.attributes or {}
  if attrs.onMiss == "empty" then
    return { mode = "preferred", weight = M.preferred_weight, reason = (c.known and where(c) or
      cache_name(c) .. " does not exist (yet)") ..
      '; onMiss "empty": on another node the pod starts with an empty cache directory and compiles its kernels' }
  end
  if not c.known then
    return { mode = "required", reason = cache_name(c) ..
      " does not exist (yet); the pod waits until it exists and is Ready on a node" }
  end
  if count(c.readyNodes) == 0 then
    return { mode = "required", reason = "not Ready on any node yet (" .. where(c) ..
      "); the pod waits until a node has it" }
  end
  return { mode = "required", reason = where(c) }
end

-- An image volume is pulled by the kubelet wherever the pod runs: it works
-- anywhere, but only the nodes where gkm made the cache Ready have GPUs it is
-- compatible with. Require those while there are any; prefer them otherwise,
-- so that the pod still starts (and compiles its kernels) elsewhere.
local function image(c)
  if count(c.readyNodes) > 0 then
    return { mode = "required", reason = where(c) .. " (GPU-compatible, image pulled)" }
  end
  return { mode = "preferred", weight = M.preferred_weight,
    reason = "not Ready on any node yet; the kubelet pulls the image wherever the pod runs" }
end

-- A claim's PersistentVolume carries its own node affinity where the cache
-- asks for it (spec.claim.placement), set when the claim was made: nothing
-- is added to the pod.
local function claim()
  return { mode = "none", reason = "a claim: its volume's node affinity places the pod " ..
    "(spec.claim.placement)" }
end

-- A pod that says which runtime it runs (annotation gkm.io/runtime,
-- "triton=3.2.0") and mounts a cache compiled by another: its kernels will
-- not hit. "warn" admits the pod with a warning and an Event on the cache,
-- "refuse" denies it, "ignore" says nothing.
M.runtime_mismatch = "warn"

-- The first factor the pod names that the cache's identity records with
-- other values: "triton=3.3.0, but ... compiled by triton 3.2.0"; nil when
-- none differs (or either side says nothing).
local function mismatch(pod, c)
  local runtime = type(pod.runtime) == "table" and pod.runtime or {}
  local identity = type(c.identity) == "table" and c.identity or {}
  local keys = {}
  for k in pairs(runtime) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local have = identity[k]
    if type(have) == "table" and #have > 0 then
      local found = false
      for _, v in ipairs(have) do found = found or v == runtime[k] end
      if not found then
        return string.format("the pod runs %s=%s, but %s was compiled by %s %s: its kernels will " ..
          "not hit and are compiled again in the pod", k, tostring(runtime[k]), cache_name(c), k,
          table.concat(have, ", "))
      end
    end
  end
end

function M.evaluate(input)
  local placements = {}
  local caches = type(input.caches) == "table" and input.caches or {}
  local pod = type(input.pod) == "table" and input.pod or {}
  for _, c in ipairs(caches) do
    if type(c) == "table" and type(c.volume) == "string" then
      local p = c.mount == "image" and image(c) or c.mount == "claim" and claim() or csi(c)
      local why = M.runtime_mismatch ~= "ignore" and mismatch(pod, c) or nil
      if why and M.runtime_mismatch == "refuse" then
        p.refuse = why
      elseif why then
        p.warning = why
      end
      placements[c.volume] = p
    end
  end
  return { placements = placements }
end

return M
