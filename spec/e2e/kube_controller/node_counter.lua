-- A controller for the end-to-end test of gkm.kube: for each GKMCache it
-- counts the GKMCacheNodes that report it (and those that report it Ready)
-- and applies the counts to the cache's status, with an Event when they
-- change. Annotations make it fail on purpose: test/fail raises,
-- test/bad-return returns nonsense after queueing a write (which must then
-- not happen), test/bad-apply queues a valid write and then an object
-- without a name (gkm.kube raises: neither is written).
local kube = require 'gkm.kube'

local M = {}

function M.watches(config)
  return {
    { apiVersion = "gkm.io/v1alpha1", kind = "GKMCache", namespace = config.namespace },
    { apiVersion = "gkm.io/v1alpha1", kind = "GKMCacheNode", namespace = config.namespace,
      labelSelector = { ["gkm.io/test"] = "yes" }, enqueue = "map", debounce_ms = 200 },
  }
end

-- a node report concerns the caches it names
function M.map(ev)
  local keys = {}
  local caches = (ev.object.status or {}).caches or {}
  for name in pairs(caches) do
    keys[#keys + 1] = ev.object.metadata.namespace .. "/" .. name
  end
  return keys
end

function M.reconcile(req)
  local cache = req.object
  if not cache then
    return nil -- deleted: nothing to report
  end
  local ann = cache.metadata.annotations or {}
  if ann["test/fail"] == "yes" then
    error("asked to fail")
  end
  local total, ready = 0, 0
  for _, n in ipairs(kube.list{ kind = "GKMCacheNode", namespace = req.namespace }) do
    local entry = ((n.status or {}).caches or {})[req.name]
    if entry then
      total = total + 1
      if entry.state == "Ready" then
        ready = ready + 1
      end
    end
  end
  local again = kube.get{ kind = "GKMCache", namespace = req.namespace, name = req.name }
  assert(again and again.metadata.uid == cache.metadata.uid, "get must see the same object")
  kube.apply_status({
    apiVersion = "gkm.io/v1alpha1", kind = "GKMCache",
    metadata = { name = req.name, namespace = req.namespace },
    status = { totalNodes = total, readyNodes = ready },
  })
  if ann["test/bad-apply"] == "yes" then
    kube.apply({ apiVersion = "v1", kind = "ConfigMap", metadata = { namespace = req.namespace } })
  end
  if ann["test/bad-return"] == "yes" then
    return { requeue_after = "soon" }
  end
  local st = cache.status or {}
  if st.readyNodes ~= ready or st.totalNodes ~= total then
    kube.event(cache, "Normal", "Counted", ready .. " of " .. total .. " nodes ready")
  end
  return { requeue_after = 300 }
end

return M
