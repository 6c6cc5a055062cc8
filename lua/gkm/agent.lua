-- gkm.agent: what the node agent does next for one cache on its node.
--
-- The C side gathers everything it knows about the cache on this node into
-- one plain table, calls decide(input), validates the answer, carries out the
-- actions (fetching the image config, pulling, linking the view) on its
-- worker threads, and applies `entry` to the node's status. decide() is a pure
-- function: the same input gives the same answer, which is what makes it
-- testable and safe to re-run after a policy reload or a restart.
--
-- input = {
--   node  = "node-1", now = "2026-11-21T10:00:00Z",
--   cache = { kind, namespace, name, generation, image = "ref",
--             digest = "sha256:..." or "" (not resolved yet), deleting = bool }
--           or nil when the cache object is gone,
--   gpus  = { { index, uuid, name, arch, driverVersion, ... } },   -- the probe
--   image = { state = "unknown"|"fetching"|"ready"|"failed", <failure> },
--   compat = { gpus = { { index, compatible, reason, message } } }
--            or { error = "why the compat policy failed" } or nil (not run yet),
--   store = { present = bool,                -- extracted on this node, and verified
--                                            -- through this cache's own reference
--             evicted = { reason, message, wanted = bool } or nil },
--                         -- the store's budget evicted the image (gkm.store_budget);
--                         -- wanted: a pod here asked for it since, or the cache
--                         -- was edited: pull it again
--   pull  = { state = "idle"|"running"|"failed", <failure> },
--   view  = { digest = "sha256:..." or nil,    -- what the cache's view links to now
--             compatibleGPUs = { "0", ... } },  -- the GPU ids it was published for
--                                               -- (given while the image is re-read)
--   usage = { pods = n,                       -- pods mounting the cache (CSI)
--             list = { { podName, podNamespace, podUID, volumeId } },
--             fallback = { { podName, podNamespace, podUID, volumeId,
--                            state, reason, message } } },  -- volumes published
--                                  -- as an empty directory (onMiss "empty")
--                                  -- because the cache was not usable here
--             finished = { { podName, podNamespace, podUID, volumeId, misses,
--                            missedKernels, finished } } },  -- pods whose writable
--                                  -- volumes were unpublished here, newest last
--   previous = { ...the entry reported last time... } or nil,
-- }
-- <failure> (state "failed" from the first failure until a try succeeds,
-- while a retry waits or runs too) = { reason, message, attempts = n,
--   permanent = bool,                 -- trying again cannot change it
--   nextAttemptTime = "2026-...Z" }   -- when the agent tries again (not permanent)
-- answer = {
--   entry   = { digest (absent until resolved), state, reason, message, lastUpdated,
--               nextAttemptTime (a failure the agent retries by itself),
--               pods = { { podName, podNamespace, podUID, volumeId } },
--               fallbackPods = { { podName, podNamespace, podUID, volumeId,
--                                  state, reason, message } } (absent when none),
--               finishedPods = { { podName, podNamespace, podUID, volumeId, misses,
--                                  missedKernels, finished } } (absent when none),
--               compatibleGPUs = { { ids, gpuType } },
--               incompatibleGPUs = { { ids, gpuType, reason, message } } }
--             or nil (remove this cache from the node's status),
--   actions = { { type = "fetch_image" } | { type = "pull" } | { type = "link" }
--             | { type = "unlink" } },
--             fetch_image and pull are wishes: the C side starts them when a
--             slot is free, after the backoff of a failure, and for a
--             permanent failure only once something changed (the cache's spec
--             or annotations, the policies)
--   requeue_after = seconds (optional),
-- }
local M = {}

-- GPUs are named by their node-wide index, as in the node status gpus[]
-- list and the compat verdicts.
local function gpu_id(g)
  return g.index
end

-- GPUs with the same type, arch, driver and verdict share one id set.
function M.group(gpus, verdicts)
  local by_index = {}
  for _, v in ipairs(verdicts or {}) do
    if type(v) == "table" and v.index ~= nil then
      by_index[v.index] = v
    end
  end
  local compatible, incompatible, seen = {}, {}, {}
  for _, g in ipairs(gpus or {}) do
    if type(g) == "table" then
      local v = by_index[g.index] or { compatible = false, reason = "NotEvaluated",
                                       message = "the compatibility policy returned no verdict for this GPU" }
      local key = table.concat({ tostring(g.name), tostring(g.arch), tostring(g.driverVersion),
                                 tostring(v.compatible), tostring(v.reason), tostring(v.message) }, "|")
      local set = seen[key]
      if not set then
        set = { ids = {}, gpuType = g.name }
        if not v.compatible then
          set.reason, set.message = v.reason, v.message
          incompatible[#incompatible + 1] = set
        else
          compatible[#compatible + 1] = set
        end
        seen[key] = set
      end
      set.ids[#set.ids + 1] = gpu_id(g)
    end
  end
  return compatible, incompatible
end

local function same_entry(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then
    return false
  end
  for _, k in ipairs({ "digest", "state", "reason", "message" }) do
    if a[k] ~= b[k] then
      return false
    end
  end
  local function volumes(x)
    local out = {}
    for _, p in ipairs(type(x) == "table" and x or {}) do
      out[#out + 1] = tostring(p.volumeId)
    end
    return table.concat(out, ",")
  end
  if volumes(a.pods) ~= volumes(b.pods) or volumes(a.fallbackPods) ~= volumes(b.fallbackPods) then
    return false
  end
  local function sets(x)
    local out = {}
    for _, s in ipairs(x or {}) do
      out[#out + 1] = table.concat(s.ids or {}, ",") .. "|" .. tostring(s.reason)
    end
    return table.concat(out, ";")
  end
  return sets(a.compatibleGPUs) == sets(b.compatibleGPUs) and sets(a.incompatibleGPUs) == sets(b.incompatibleGPUs)
end

local function finish(input, entry, actions, requeue_after)
  if entry then
    -- the node status lists the pods (the CRD's pods[]), not just a count
    local usage = type(input.usage) == "table" and input.usage or {}
    entry.pods = type(usage.list) == "table" and usage.list or {}
    -- pods that asked for the cache and got an empty directory instead
    if type(usage.fallback) == "table" and #usage.fallback > 0 then
      entry.fallbackPods = usage.fallback
    end
    -- pods that finished here, with the kernels they compiled themselves
    if type(usage.finished) == "table" and #usage.finished > 0 then
      entry.finishedPods = usage.finished
    end
    entry.compatibleGPUs = entry.compatibleGPUs or {}
    entry.incompatibleGPUs = entry.incompatibleGPUs or {}
    -- lastUpdated moves only when something else did, so an unchanged
    -- report is an unchanged object and costs no write
    local prev = input.previous
    entry.lastUpdated = (same_entry(entry, prev) and prev.lastUpdated) or input.now
  end
  return { entry = entry, actions = actions, requeue_after = requeue_after }
end

-- A failure is reported as one, with its reason, at every reconcile until a
-- try succeeds: never as progress while its retry waits or runs.
local function failed(entry, f)
  entry.state, entry.reason = "Failed", f.reason or "PullFailed"
  entry.message = f.message or "failed"
  if f.permanent then
    entry.message = entry.message
      .. "; not tried again until the cache (its image, an annotation), the policies or the trusted keys change"
  elseif type(f.nextAttemptTime) == "string" then
    entry.nextAttemptTime = f.nextAttemptTime
  end
  return entry
end

function M.decide(input)
  local cache = input.cache
  local view = type(input.view) == "table" and input.view or {}
  local usage = type(input.usage) == "table" and input.usage or {}
  local in_use = (math.tointeger(usage.pods) or 0) > 0

  -- gone or going: release the view once no pod mounts it
  if type(cache) ~= "table" or cache.deleting then
    if view.digest then
      if in_use then
        -- "Deleting" is the CRD's state for this; look again soon, as the
        -- usage records are local files that change without an event
        return finish(input, { digest = view.digest, state = "Deleting", reason = "InUse",
          message = string.format("deleted; kept until %d pod(s) stop using it", usage.pods) }, {}, 5)
      end
      return finish(input, nil, { { type = "unlink" } })
    end
    return finish(input, nil, {})
  end

  local digest = type(cache.digest) == "string" and cache.digest or ""
  if digest == "" then
    -- no digest member: the CRD's pattern allows no empty digest
    return finish(input, { state = "Pending", reason = "DigestNotResolved",
      message = "waiting for the image digest (set by the admission webhook or the operator)" }, {})
  end

  local image = type(input.image) == "table" and input.image or { state = "unknown" }
  local store = type(input.store) == "table" and input.store or {}
  -- evicted to free space: stays so, with no work, until it is wanted again
  local evicted = type(store.evicted) == "table" and not store.evicted.wanted and store.evicted or nil
  local function evicted_entry(entry)
    local reason, message = tostring(evicted.reason or ""), tostring(evicted.message or "")
    entry.state, entry.reason = "Evicted", reason:match("^%a[%w_]*$") and reason or "Evicted"
    entry.message = message ~= "" and message or "evicted from this node's store"
    return finish(input, entry, {})
  end
  if evicted and (image.state ~= "ready" or type(input.compat) ~= "table") then
    -- after a restart: the image configuration (no layer) tells the GPUs it fits
    local entry = evicted_entry({ digest = digest })
    entry.actions = image.state == "fetching" and {} or { { type = "fetch_image" } }
    return entry
  end
  if image.state ~= "ready" or type(input.compat) ~= "table" then
    local actions = image.state == "fetching" and {} or { { type = "fetch_image" } }
    -- after a restart the image facts are read again; a view still published
    -- for this digest means the node was ready (pods can mount it), and it
    -- stays reported so rather than flapping to Pending or Failed
    local ids = {}
    for _, id in ipairs(type(view.compatibleGPUs) == "table" and view.compatibleGPUs or {}) do
      ids[#ids + 1] = math.tointeger(tonumber(id)) or id
    end
    if store.present and view.digest == digest and #ids > 0 then
      local message = "extracted and ready; re-reading the image configuration"
      if image.state == "failed" then
        message = "extracted and ready; cannot re-read the image configuration: " .. tostring(image.message)
      end
      return finish(input, { digest = digest, state = "Ready", reason = "Ready",
        message = message, compatibleGPUs = { { ids = ids } } }, actions)
    end
    if image.state == "failed" then
      return finish(input, failed({ digest = digest }, image), actions)
    end
    return finish(input, { digest = digest, state = "Pending", reason = "CheckingImage",
      message = "reading the image configuration to check it against this node's GPUs" }, actions)
  end

  if input.compat.error then
    -- a policy that fails is not retried on a timer (the next policy or
    -- cache change runs it again); a view already published keeps serving
    local why = "the compat policy failed: " .. tostring(input.compat.error)
    if store.present and view.digest == digest and type(input.previous) == "table"
        and input.previous.state == "Ready" then
      local entry = {}
      for k, v in pairs(input.previous) do entry[k] = v end
      entry.message = "extracted and ready; " .. why
      return finish(input, entry, {})
    end
    return finish(input, { digest = digest, state = "Failed", reason = "PolicyError",
      message = why .. "; not tried again until the policies or the cache change" }, {})
  end

  local compatible, incompatible = M.group(input.gpus, input.compat.gpus)
  if #compatible == 0 then
    local first = incompatible[1] or { reason = "NoGPUs", message = "this node reports no GPUs" }
    local actions = {}
    if view.digest and not in_use then
      actions[1] = { type = "unlink" }
    end
    return finish(input, { digest = digest, state = "Incompatible", reason = first.reason,
      message = first.message, compatibleGPUs = {}, incompatibleGPUs = incompatible }, actions)
  end

  local entry = { digest = digest, compatibleGPUs = compatible, incompatibleGPUs = incompatible }
  if store.present then
    if view.digest == digest then
      entry.state, entry.reason = "Ready", "Ready"
      entry.message = string.format("extracted and ready for %d GPU group(s)", #compatible)
      return finish(input, entry, {})
    end
    entry.state, entry.reason, entry.message = "Pulling", "Linking", "linking the extracted cache"
    return finish(input, entry, { { type = "link" } })
  end

  if evicted then
    return evicted_entry(entry)
  end
  local pull = type(input.pull) == "table" and input.pull or { state = "idle" }
  if pull.state == "failed" then
    return finish(input, failed(entry, pull), { { type = "pull" } })
  end
  if pull.state == "running" then
    entry.state, entry.reason, entry.message = "Pulling", "Pulling", "pulling and extracting the image"
    return finish(input, entry, {})
  end
  entry.state, entry.reason, entry.message = "Pulling", "Pulling", "pulling and extracting the image"
  return finish(input, entry, { { type = "pull" } })
end

return M
