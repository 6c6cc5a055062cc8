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
--           or nil when the cache object is gone, or not for this node
--           (away = true: spec.nodeSelector, spec.affinity or node groups),
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
--   rollout = { maxPulling = n | "p%", -- spec.rollout.maxPulling as written
--               mirrored = bool,    -- through a mirror (the first wave is one node)
--               pulling = n, waiting = n,  -- the operator's status.rollout for
--               pullingPlace = i,   -- this digest; pullingPlace: granted
--               waitingPlace = i,   -- this node's place in the queue
--               limit = n },        -- at most this many nodes pull at once
--   previous = { ...the entry reported last time... } or nil,
-- }
-- <failure> also says retryIn (seconds until nextAttemptTime) and recheck
-- (a change earned a permanent failure one more try).
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
--               incompatibleGPUs = { { ids, gpuType, reason, message } },
--               servingDigest (the digest the view still serves pods, Ready,
--                 while this one is not Ready here: an upgrade takes nothing away),
--               waitingSince, throughMirror (state Waiting: for a pull slot) }
--             or nil (remove this cache from the node's status),
--   actions = { { type = "fetch_image" } | { type = "pull" } | { type = "link" }
--             | { type = "unlink" } },
--             fetch_image and pull are wishes: the C side starts them when a
--             slot is free, after the backoff of a failure, and for a
--             permanent failure only once something changed (the cache's spec
--             or annotations, the policies)
--   requeue_after = seconds (optional),
-- }
local rollout = require("gkm.rollout")

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
  for _, k in ipairs({ "digest", "state", "reason", "message", "servingDigest" }) do
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
    -- an upgrade: the view keeps serving the digest it was Ready with until
    -- this one is, from the moment the cache names another image (before its
    -- digest is resolved too); an incompatible digest or a deleted cache ends it
    local view = type(input.view) == "table" and input.view or {}
    if view.ready and view.digest and view.digest ~= entry.digest
        and entry.state ~= "Incompatible" and entry.state ~= "Deleting" then
      entry.servingDigest = view.digest
    end
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

-- Whether this node pulls only once the operator grants it a slot: the cache
-- limits how many nodes pull at once (gkm.rollout's rule), or its image comes
-- through a mirror.
local function granted_only(r)
  return r.mirrored == true or rollout.limit(r.maxPulling, 1) ~= nil
end

-- A failure with a try to come, reported with actions. In a rollout the node
-- tries again in its pull slot when the try is due (Pulling, Retrying); while
-- a backoff runs first it reports the failure, and the operator hands the
-- slot to the next in line (the node asks again when the try is due).
-- Otherwise a failure is reported until a try succeeds.
local function retrying(input, entry, f, actions)
  local r = type(input.rollout) == "table" and input.rollout or {}
  if not granted_only(r) or (f.permanent and not f.recheck) then
    return finish(input, failed(entry, f), actions)
  end
  local wait = tonumber(f.retryIn) or 0
  if not f.permanent and wait > 0 then
    return finish(input, failed(entry, f), {}, wait)
  end
  entry.state, entry.reason = "Pulling", "Retrying"
  entry.message = string.format("trying again (%d failed so far): %s", math.tointeger(f.attempts) or 0,
    tostring(f.message or f.reason))
  return finish(input, entry, actions)
end

-- The rollout's word: nil when this node may pull now, else input.rollout.
local function must_wait(input)
  local r = type(input.rollout) == "table" and input.rollout or {}
  if not granted_only(r) or r.pullingPlace then
    return nil
  end
  return r
end

-- State Waiting: for a pull slot, with this node's place when it has one.
local function waiting(input, entry, r, why)
  local prev = input.previous
  entry.state, entry.reason = "Waiting", "RolloutWaiting"
  entry.waitingSince = type(prev) == "table" and prev.state == "Waiting" and prev.digest == entry.digest
    and prev.waitingSince or input.now
  entry.throughMirror = r.mirrored or nil
  local pulling = math.tointeger(r.pulling) or 0
  local limit = math.tointeger(r.limit)
  local slots = limit and string.format("%d of at most %d node(s) pulling", pulling, limit)
    or string.format("%d node(s) pulling", pulling)
  if r.mirrored then
    slots = slots .. "; through a mirror no more nodes pull than are Ready, so that it fills first"
  end
  if r.waitingPlace then
    entry.message = string.format("waiting for a pull slot: %d of %d waiting, %s",
      math.tointeger(r.waitingPlace) or 0, math.tointeger(r.waiting) or 0, slots)
  else
    entry.message = "waiting for the operator to grant a pull slot (spec.rollout.maxPulling"
      .. (r.mirrored and ", a mirror" or "") .. ")"
  end
  if why then
    entry.message = entry.message .. "; " .. why
  end
  return entry
end

-- A failed pull gave its slot back: ask again once a retry is due.
local function failed_in_rollout(input, entry, pull, r)
  if pull.permanent and not pull.recheck then
    return finish(input, failed(entry, pull), {})
  end
  local wait = tonumber(pull.retryIn) or 0
  if not pull.permanent and wait > 0 then
    return finish(input, failed(entry, pull), {}, wait)
  end
  return finish(input, waiting(input, entry, r, "to try again after: " .. tostring(pull.message)), {})
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
        if input.away then
          return finish(input, { digest = view.digest, state = "Deleting", reason = "NotSelected",
            message = string.format("this node is no longer one the cache is for (spec.nodeSelector, "
              .. "spec.affinity, node groups); kept until %d pod(s) stop using it", usage.pods) }, {}, 5)
        end
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
    -- an image without compat labels is read by pulling it: a pull, in its wave
    local r = image.pullToRead and image.state ~= "fetching" and must_wait(input)
    if r and not (store.present and view.digest == digest) then
      local entry = { digest = digest }
      if image.state == "failed" then
        return failed_in_rollout(input, entry, image, r)
      end
      return finish(input, waiting(input, entry, r), {})
    end
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
      local entry = { digest = digest }
      if image.pullToRead then
        return retrying(input, entry, image, actions)
      end
      return finish(input, failed(entry, image), actions)
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
  local r = must_wait(input)
  if pull.state == "failed" then
    if r then
      return failed_in_rollout(input, entry, pull, r)
    end
    return retrying(input, entry, pull, { { type = "pull" } })
  end
  if pull.state == "running" then
    entry.state, entry.reason, entry.message = "Pulling", "Pulling", "pulling and extracting the image"
    return finish(input, entry, {})
  end
  if r then
    return finish(input, waiting(input, entry, r), {})
  end
  entry.state, entry.reason, entry.message = "Pulling", "Pulling", "pulling and extracting the image"
  return finish(input, entry, { { type = "pull" } })
end

return M
