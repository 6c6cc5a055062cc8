-- Aggregation policy: turns the per-node reports of one cache into the
-- status users read with `kubectl get gkmc` and `kubectl describe gkmc`.
--
-- The operator calls evaluate(input) for a cache whenever one of its node
-- reports changes (debounced: a burst of reports gives one call).
--
-- Input (plain tables):
--   cache = { kind = "GKMCache", namespace = "ns", name = "n", generation = 3,
--             annotations = { ["gkm.io/resolvedDigest"] = "sha256:..." },
--             status = { ...the current status, conditions included... } }
--   digest       = "sha256:..."   the digest the operator resolved ("" if none yet)
--   verification = { enabled = true, resolvedBy = "webhook" | "operator",
--                    operator = { state, digest, message } }
--                  operator: present where the operator has trusted keys and a
--                  digest: its own check of this cache's signature, through the
--                  cache's image reference. state: "verified", "unsigned",
--                  "untrusted", "error" (the registry could not be read) or
--                  "pending". The gkm.io/resolvedDigest annotation pins a digest;
--                  anyone who may edit the cache can set it, so it proves nothing.
--   nodes = { { name = "node-1",
--               entry = { digest, state, reason, message, pods, lastUpdated,
--                         compatibleGPUs = {{ids}}, incompatibleGPUs = {{ids, reason, message}} }
--             }, ... }                one per node that runs gkm; entry nil = no report yet
--   now = "2026-11-21T10:00:00Z"
--
-- Output: the status to apply:
--   { resolvedDigest, totalNodes, readyNodes, failedNodes, incompatibleNodes,
--     failedNodeConditions = { Reason = { "node-1", ... } },       -- Failed nodes
--     incompatibleNodeConditions = { Reason = { "node-2", ... } }, -- Incompatible nodes
--     podsUsing,
--     counts = { nodeCnt, nodeInUseCnt, nodeNotInUseCnt, nodeErrorCnt, podRunningCnt },
--     conditions = { {type, status, reason, message, lastTransitionTime, observedGeneration} },
--     lastUpdated,
--     candidates, captureConflicts, captureRefusals (spec.capture: see M.captures),
--     hits (see M.hits),
--     labeledNodes = { "node-1", ... } }
--   labeledNodes is no part of the status: the nodes whose Node object gets the
--   cache's label (key in status.nodeLabel, value "ready"), which pods select
--   with node affinity. The operator sets the labels of every Node to match;
--   left out, the cache labels no Node. A node that evicted the cache keeps
--   its label (M.label_evicted_nodes): a pod placed there has it pulled again.
-- Node entry states written by the agent: Pending, Waiting (for a pull slot of
-- spec.rollout), Pulling, Ready, Incompatible, Failed, Deleting (reason
-- NotSelected: a node the cache is no longer for, kept while pods use it; not
-- counted), Evicted. An entry with servingDigest still serves the digest it
-- was Ready with to its pods. Incompatible is not a failure: a node without a GPU the
-- cache was built for is counted apart (incompatibleNodes), never in
-- failedNodes, nodeErrorCnt or the Error condition. Evicted is no failure
-- either, nor work in progress: the node took the cache out of its store to
-- free space (no pod there used it) and pulls it again when a pod there asks
-- for it; Ready counts the other nodes (M.ignore_evicted_nodes). An empty reason map may
-- be returned: the operator leaves empty maps out of the status it applies.
-- A node entry lists the pods that mount the cache
-- (pods = { { podName, podNamespace, podUID, volumeId } }).
local M = {}

-- States that count as "still working on it".
M.progressing_states = { Pending = true, Waiting = true, Pulling = true, Deleting = true }

-- Whether a cache counts as Ready while some nodes have no compatible GPU.
-- true: Ready means "ready on every node that can use it" (and on at least one).
M.ignore_incompatible_nodes = true

-- Whether the nodes that evicted the cache keep its Node label, so that pods
-- are still placed there (their mount waits while the node pulls the cache
-- again). false: pods go only where it is Ready, and while it is Ready
-- nowhere a pod that requires it waits Pending until a cache change makes a
-- node pull it again.
M.label_evicted_nodes = true

-- Whether a cache counts as Ready while some nodes evicted it (and it is
-- ready on at least one): true, as the kubelet's image garbage collection
-- makes no workload unready.
M.ignore_evicted_nodes = true

-- Longest node list spelled out in a message.
M.max_nodes_in_message = 5

-- Hits: what the pods that mount the cache had to compile themselves. The
-- agent counts, for each writable volume (and each onMiss "empty" one), the
-- kernels in the pod's own layer that the cache lacks (pods[].misses, the
-- first names in pods[].missedKernels), and the CSI plugin counts them once
-- more when the volume is unpublished (finishedPods[], the last 16 per
-- node). Read-only volumes cannot be written, so they are not counted. nil
-- when no pod reports.
M.most_missed = 5

function M.hits(nodes)
  local with, without, kernels, tally, seen = 0, 0, 0, {}, false
  for _, n in ipairs(nodes) do
    local e = type(n) == "table" and type(n.entry) == "table" and n.entry or {}
    for _, list in ipairs({ e.pods, e.fallbackPods, e.finishedPods }) do
      for _, p in ipairs(type(list) == "table" and list or {}) do
        local m = type(p) == "table" and math.tointeger(p.misses) or nil
        if m then
          seen = true
          kernels = kernels + m
          if m > 0 then with = with + 1 else without = without + 1 end
          for _, k in ipairs(type(p.missedKernels) == "table" and p.missedKernels or {}) do
            tally[tostring(k)] = (tally[tostring(k)] or 0) + 1
          end
        end
      end
    end
  end
  if not seen then
    return nil
  end
  local names = {}
  for k in pairs(tally) do
    names[#names + 1] = k
  end
  table.sort(names, function(a, b)
    if tally[a] ~= tally[b] then return tally[a] > tally[b] end
    return a < b
  end)
  local most = {}
  for i = 1, math.min(#names, M.most_missed) do
    most[i] = string.format("%s (%d pod%s)", names[i], tally[names[i]], tally[names[i]] == 1 and "" or "s")
  end
  return { podsWithoutMiss = without, podsWithMisses = with, kernelsCompiled = kernels,
           mostMissed = #most > 0 and most or nil }
end

-- Pods in a node entry: a list (what the agent writes) or a count.
local function pod_count(e)
  if type(e) ~= "table" then
    return 0
  end
  if type(e.pods) == "table" then
    return #e.pods
  end
  return math.tointeger(e.pods) or 0
end

local function list_nodes(names)
  table.sort(names)
  if #names <= M.max_nodes_in_message then
    return table.concat(names, ", ")
  end
  local shown = {}
  for i = 1, M.max_nodes_in_message do
    shown[i] = names[i]
  end
  return table.concat(shown, ", ") .. string.format(" and %d more", #names - M.max_nodes_in_message)
end

-- Add name to the list of reason in a reason -> node names map.
local function add_node(map, reason, name)
  map[reason] = map[reason] or {}
  table.insert(map[reason], name)
end

-- Keep lastTransitionTime when a condition's status did not change.
local function condition(previous, now, generation, ctype, status, reason, message)
  local since = now
  for _, c in ipairs(previous) do
    if type(c) == "table" and c.type == ctype and c.status == status and c.lastTransitionTime then
      since = c.lastTransitionTime
    end
  end
  return { type = ctype, status = status, reason = reason, message = message,
           lastTransitionTime = since, observedGeneration = generation }
end

-- Captures (spec.capture): each node entry lists what captures of pods'
-- writable volumes gave there (captures = { { digest, repository, baseDigest,
-- files, bytes, targets, paths = { { path, digest } }, pod, capturedAt }
-- or { refused = { reason, message }, pod, capturedAt } }). Candidates on
-- top of the current digest are listed once per digest with every pod they
-- came from; a path that candidates hold with different contents is a
-- conflict (never merged); refusals are listed as they are.
function M.captures(nodes, digest)
  local by_digest, list, refusals, contents = {}, {}, {}, {}
  for _, n in ipairs(nodes) do
    local e = type(n) == "table" and type(n.entry) == "table" and n.entry or {}
    for _, r in ipairs(type(e.captures) == "table" and e.captures or {}) do
      r = type(r) == "table" and r or {}
      local pod = type(r.pod) == "table" and r.pod or {}
      local who = { name = pod.name, namespace = pod.namespace, uid = pod.uid, node = n.name }
      if type(r.refused) == "table" then
        refusals[#refusals + 1] = { reason = r.refused.reason, message = r.refused.message,
                                    pod = who, capturedAt = r.capturedAt }
      elseif type(r.digest) == "string" and (digest == "" or r.baseDigest == digest) then
        local c = by_digest[r.digest]
        if not c then
          c = { digest = r.digest, repository = r.repository, files = r.files, bytes = r.bytes,
                pods = {}, capturedAt = r.capturedAt }
          if type(r.targets) == "table" and #r.targets > 0 then
            c.targets = r.targets
          end
          by_digest[r.digest] = c
          list[#list + 1] = c
        end
        -- a pod captured twice (on demand, then at exit) is listed once
        local key = tostring(who.node) .. "/" .. tostring(who.uid)
        c.seen = c.seen or {}
        if not c.seen[key] then
          c.seen[key] = true
          c.pods[#c.pods + 1] = who
        end
        if tostring(r.capturedAt) > tostring(c.capturedAt) then
          c.capturedAt = r.capturedAt
        end
        for _, f in ipairs(type(r.paths) == "table" and r.paths or {}) do
          if type(f) == "table" and type(f.path) == "string" then
            local at = contents[f.path] or {}
            contents[f.path] = at
            at[tostring(f.digest)] = at[tostring(f.digest)] or {}
            at[tostring(f.digest)][r.digest] = true
          end
        end
      end
    end
  end
  table.sort(list, function(a, b) return a.digest < b.digest end)
  for _, c in ipairs(list) do
    c.seen = nil
  end
  local conflicts = {}
  for path, at in pairs(contents) do
    local kinds, digests = 0, {}
    for _, cands in pairs(at) do
      kinds = kinds + 1
      for d in pairs(cands) do
        digests[#digests + 1] = d
      end
    end
    if kinds > 1 then
      table.sort(digests)
      conflicts[#conflicts + 1] = { path = path, digests = digests }
    end
  end
  table.sort(conflicts, function(a, b) return a.path < b.path end)
  local function some(t)
    return #t > 0 and t or nil
  end
  return some(list), some(conflicts), some(refusals)
end

function M.evaluate(input)
  local cache = type(input.cache) == "table" and input.cache or {}
  local status = type(cache.status) == "table" and cache.status or {}
  local previous = type(status.conditions) == "table" and status.conditions or {}
  local nodes = type(input.nodes) == "table" and input.nodes or {}
  local verification = type(input.verification) == "table" and input.verification or {}
  local now = tostring(input.now or "")
  local generation = math.tointeger(cache.generation) or 0
  local digest = type(input.digest) == "string" and input.digest or ""

  local total, ready, failed, incompatible, progressing, pods, in_use = 0, 0, 0, 0, 0, 0, 0
  local evicted = 0
  local by_reason, incompatible_by_reason, failed_names, waiting, labeled = {}, {}, {}, {}, {}
  for _, n in ipairs(nodes) do
    local reported = type(n) == "table" and type(n.entry) == "table" and n.entry or nil
    local e = reported
    -- a node the cache is no longer for, until its last pod is gone: not counted
    local left = e and e.state == "Deleting" and e.reason == "NotSelected"
    if type(n) == "table" and type(n.name) == "string" and not left then
      total = total + 1
      -- a report for another digest is stale: the node has not caught up yet
      if e and digest ~= "" and e.digest and e.digest ~= "" and e.digest ~= digest then
        e = nil
      end
      local state = e and e.state or "Pending"
      local node_pods = pod_count(e)
      pods = pods + node_pods
      -- a node that serves the digest it had until this one is Ready there
      -- (an upgrade, a wave to come) keeps its label: pods placed there mount it
      if state ~= "Ready" and reported and reported.servingDigest then
        labeled[#labeled + 1] = n.name
      end
      if state == "Ready" then
        ready = ready + 1
        if node_pods > 0 then
          in_use = in_use + 1
        end
        -- labeled where a GPU can use it: a pod placed there gets the cache
        if type(e.compatibleGPUs) == "table" and #e.compatibleGPUs > 0 then
          labeled[#labeled + 1] = n.name
        end
      elseif state == "Incompatible" then
        incompatible = incompatible + 1
        add_node(incompatible_by_reason, e.reason or "NoCompatibleGPU", n.name)
      elseif state == "Evicted" then
        evicted = evicted + 1
        if M.label_evicted_nodes and type(e.compatibleGPUs) == "table" and #e.compatibleGPUs > 0 then
          labeled[#labeled + 1] = n.name
        end
      elseif state == "Failed" then
        failed = failed + 1
        local reason = e.reason or "Failed"
        add_node(by_reason, reason, n.name)
        failed_names[#failed_names + 1] = n.name .. ": " .. tostring(e.message or reason)
      else
        progressing = progressing + 1
        waiting[#waiting + 1] = n.name
      end
    end
  end
  for _, map in ipairs({ by_reason, incompatible_by_reason }) do
    for _, names in pairs(map) do
      table.sort(names)
    end
  end

  local conds = {}
  -- Verified: only what was verified, and by whom
  local annotations = type(cache.annotations) == "table" and cache.annotations or {}
  local refused = by_reason.Unsigned or by_reason.SignatureNotTrusted or by_reason.NoTrustedKeys
  local mine = type(verification.operator) == "table" and verification.operator or {}
  if mine.digest ~= digest then
    mine = {}
  end
  local checked = tostring(mine.message or "")
  local verified
  if verification.enabled == false then
    verified = { "False", "VerificationDisabled",
      "signature verification is turned off; the digest was resolved by the "
        .. tostring(verification.resolvedBy or "operator") .. " without checking signatures" }
  elseif refused then
    verified = { "False", by_reason.Unsigned and "Unsigned"
        or by_reason.SignatureNotTrusted and "SignatureNotTrusted" or "NoTrustedKeys",
      "nodes refused the image: " .. list_nodes(failed_names) }
  elseif mine.state == "verified" then
    verified = { "True", "SignatureVerified", "the operator verified the signature of " .. digest .. ": " .. checked }
  elseif mine.state == "unsigned" then
    verified = { "False", "Unsigned", "the operator found no signature of " .. digest .. ": " .. checked }
  elseif mine.state == "untrusted" then
    verified = { "False", "SignatureNotTrusted",
      "the operator found no signature of " .. digest .. " that verifies with a trusted key: " .. checked }
  elseif ready > 0 then
    -- each node verifies the signature before it extracts
    verified = { "True", "VerifiedOnNodes", "the signature was verified by the nodes that pulled " .. digest }
  elseif mine.state == "error" then
    verified = { "Unknown", "VerificationError", "the operator could not check the signature yet: " .. checked }
  else
    local msg = "no signature verified yet"
    if annotations["gkm.io/resolvedDigest"] then
      msg = msg .. " (the gkm.io/resolvedDigest annotation pins the digest; it is no proof of a signature)"
    end
    verified = { "Unknown", "AwaitingVerification", msg }
  end
  conds[#conds + 1] = condition(previous, now, generation, "Verified", verified[1], verified[2], verified[3])

  -- Ready
  local usable = M.ignore_incompatible_nodes and (total - incompatible) or total
  local serving = M.ignore_evicted_nodes and ready >= 1 and (usable - evicted) or usable
  local ready_status, ready_reason, ready_msg
  if digest == "" then
    ready_status, ready_reason, ready_msg = "False", "DigestNotResolved", "the image digest is not resolved yet"
  elseif total == 0 then
    ready_status, ready_reason, ready_msg = "False", "NoNodes", "no node runs the gkm agent"
  elseif usable == 0 then
    ready_status, ready_reason, ready_msg = "False", "NoCompatibleNodes",
      string.format("none of the %d nodes has a GPU this cache was built for", total)
  elseif ready >= 1 and ready == serving then
    ready_status, ready_reason = "True", "Ready"
    ready_msg = string.format("ready on %d of %d nodes", ready, total)
    if incompatible > 0 then
      ready_msg = ready_msg .. string.format("; %d without a compatible GPU", incompatible)
    end
    if evicted > 0 then
      ready_msg = ready_msg .. string.format("; evicted from %d to free space "
        .. "(pulled again when a pod there asks for it)", evicted)
    end
  elseif ready == 0 and failed == 0 and evicted > 0 and evicted == usable then
    ready_status, ready_reason = "False", "Evicted"
    ready_msg = string.format("evicted from the store of every node that can use it (%d) to free space; "
      .. "pulled again where a pod asks for it", evicted)
  elseif failed > 0 then
    ready_status, ready_reason = "False", "NodesFailed"
    ready_msg = string.format("ready on %d of %d nodes; failed on %d", ready, usable, failed)
  else
    ready_status, ready_reason = "False", "Progressing"
    ready_msg = string.format("ready on %d of %d nodes", ready, usable)
  end
  conds[#conds + 1] = condition(previous, now, generation, "Ready", ready_status, ready_reason, ready_msg)

  -- Progressing
  if progressing > 0 then
    conds[#conds + 1] = condition(previous, now, generation, "Progressing", "True", "Pulling",
      string.format("waiting for %d node(s): %s", progressing, list_nodes(waiting)))
  else
    conds[#conds + 1] = condition(previous, now, generation, "Progressing", "False", "Settled",
      "every node has reported on this digest")
  end

  -- Error
  if failed > 0 then
    conds[#conds + 1] = condition(previous, now, generation, "Error", "True", "NodesFailed",
      list_nodes(failed_names))
  else
    local msg = "no node failed"
    if incompatible > 0 then
      msg = msg .. string.format("; %d without a compatible GPU (not a failure)", incompatible)
    end
    conds[#conds + 1] = condition(previous, now, generation, "Error", "False", "NoErrors", msg)
  end

  local candidates, conflicts, refusals = M.captures(nodes, digest)
  return {
    candidates = candidates,
    captureConflicts = conflicts,
    captureRefusals = refusals,
    hits = M.hits(nodes),
    resolvedDigest = digest,
    totalNodes = total,
    readyNodes = ready,
    failedNodes = failed,
    incompatibleNodes = incompatible,
    failedNodeConditions = by_reason,
    incompatibleNodeConditions = incompatible_by_reason,
    podsUsing = pods,
    -- the CRD's usage counts (the Pods printer column reads podRunningCnt)
    counts = { nodeCnt = total, nodeInUseCnt = in_use, nodeNotInUseCnt = ready - in_use,
               nodeErrorCnt = failed, podRunningCnt = pods },
    conditions = conds,
    lastUpdated = now,
    labeledNodes = labeled,
  }
end

return M
