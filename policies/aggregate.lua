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
--     labeledNodes = { "node-1", ... } }
--   labeledNodes is no part of the status: the nodes whose Node object gets the
--   cache's label (key in status.nodeLabel, value "ready"), which pods select
--   with node affinity. The operator sets the labels of every Node to match;
--   left out, the cache labels no Node.
-- Node entry states written by the agent: Pending, Pulling, Ready, Incompatible,
-- Failed, Deleting. Incompatible is not a failure: a node without a GPU the
-- cache was built for is counted apart (incompatibleNodes), never in
-- failedNodes, nodeErrorCnt or the Error condition. An empty reason map may
-- be returned: the operator leaves empty maps out of the status it applies.
-- A node entry lists the pods that mount the cache
-- (pods = { { podName, podNamespace, podUID, volumeId } }).
local M = {}

-- States that count as "still working on it".
M.progressing_states = { Pending = true, Pulling = true, Deleting = true }

-- Whether a cache counts as Ready while some nodes have no compatible GPU.
-- true: Ready means "ready on every node that can use it" (and on at least one).
M.ignore_incompatible_nodes = true

-- Longest node list spelled out in a message.
M.max_nodes_in_message = 5

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
  local by_reason, incompatible_by_reason, failed_names, waiting, labeled = {}, {}, {}, {}, {}
  for _, n in ipairs(nodes) do
    if type(n) == "table" and type(n.name) == "string" then
      total = total + 1
      local e = type(n.entry) == "table" and n.entry or nil
      -- a report for another digest is stale: the node has not caught up yet
      if e and digest ~= "" and e.digest and e.digest ~= "" and e.digest ~= digest then
        e = nil
      end
      local state = e and e.state or "Pending"
      local node_pods = pod_count(e)
      pods = pods + node_pods
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
  local refused = by_reason.Unsigned or by_reason.SignatureNotTrusted
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
    verified = { "False", by_reason.Unsigned and "Unsigned" or "SignatureNotTrusted",
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
  local ready_status, ready_reason, ready_msg
  if digest == "" then
    ready_status, ready_reason, ready_msg = "False", "DigestNotResolved", "the image digest is not resolved yet"
  elseif total == 0 then
    ready_status, ready_reason, ready_msg = "False", "NoNodes", "no node runs the gkm agent"
  elseif usable == 0 then
    ready_status, ready_reason, ready_msg = "False", "NoCompatibleNodes",
      string.format("none of the %d nodes has a GPU this cache was built for", total)
  elseif ready >= 1 and ready == usable then
    ready_status, ready_reason = "True", "Ready"
    ready_msg = string.format("ready on %d of %d nodes", ready, total)
    if incompatible > 0 then
      ready_msg = ready_msg .. string.format("; %d without a compatible GPU", incompatible)
    end
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

  return {
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
