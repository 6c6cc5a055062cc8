-- gkm.store_budget: which extracted images the node agent evicts from its
-- store, and why, when the store is over its budget. Like the kubelet's
-- image garbage collection (imageGCHighThresholdPercent 85,
-- imageGCLowThresholdPercent 80): above the high threshold of its file
-- system's usage the store is brought down to the low one. Besides, the
-- store's caches may be capped (maxBytes), and a pull that the room check
-- refused asks for the room it needs.
--
-- What goes first: what no cache object on the node names (a deleted cache,
-- a replaced digest), oldest first; then what a cache names but no pod on
-- the node mounts, least recently used first. Never what a pod mounts, and
-- nothing used (or pulled) less than minAgeSeconds ago.
--
-- The C side (core/node/agent_evict.c) gathers the facts, calls plan(input),
-- checks that every digest it returns is an entry of the input that no pod
-- uses (anything else is a policy error and evicts nothing), takes the
-- caches that name them out of service, removes them, and reports each
-- eviction (an Event on the cache, gkm_store_evictions_total, the node
-- status entry Evicted).
--
-- input = {
--   now = 1767225600,                      -- unix seconds
--   highPercent = 85, lowPercent = 80,     -- of the file system (high 100: no threshold)
--   maxBytes = 0,                          -- the most the store's caches may take (0: no cap)
--   minAgeSeconds = 120,                   -- a cache used this recently stays
--   fs = { sizeBytes = n, availableBytes = n },   -- the store's file system
--   storeBytes = n,                        -- what the entries take (their files' bytes)
--   need = { cache = "ns/name", bytes = n, roomBytes = n } or nil,
--          -- a pull the room check refused: the image's files take bytes,
--          -- and roomBytes free on the file system would let it through
--   entries = { { digest = "sha256:...", bytes = n, lastUsed = unix s,
--                 named = bool,            -- a cache object on the node names it
--                 inUse = bool,            -- a pod on the node mounts it
--                 caches = { "ns/name", ... } } },
-- }
-- answer = {
--   usagePercent = n,                      -- of the file system, as compared with the thresholds
--   reason = "HighThreshold" | "MaxBytes" | "PullNeedsSpace",  -- absent: within budget
--   message = "why, in one sentence",      -- absent: within budget
--   evict = { "sha256:...", ... },         -- in this order
--   shortBytes = n,                        -- what the evictable entries could not free
-- }
local M = {}

-- An entry no cache names is left this long: it may be a pull that
-- committed after the names were gathered.
M.unnamed_min_age = 10

local MiB = 1024 * 1024

local function int(v)
  return math.tointeger(v) or math.tointeger(math.floor(tonumber(v) or 0)) or 0
end

local function mib(b)
  return string.format("%d MiB", (b + MiB - 1) // MiB)
end

-- The entries that may go, in the order they go.
function M.candidates(input)
  local now = int(input.now)
  local min_age = int(input.minAgeSeconds)
  local out = {}
  for _, e in ipairs(type(input.entries) == "table" and input.entries or {}) do
    if type(e) == "table" and type(e.digest) == "string" and not e.inUse then
      local age = now - int(e.lastUsed)
      if age >= (e.named and min_age or M.unnamed_min_age) then
        out[#out + 1] = { digest = e.digest, bytes = int(e.bytes), lastUsed = int(e.lastUsed),
                          named = e.named and true or false }
      end
    end
  end
  table.sort(out, function(a, b)
    if a.named ~= b.named then
      return not a.named
    end
    if a.lastUsed ~= b.lastUsed then
      return a.lastUsed < b.lastUsed
    end
    return a.digest < b.digest
  end)
  return out
end

-- What the budget asks to free, most pressing first: { reason, bytes,
-- all_or_nothing, why }. A pull's room is all or nothing: evicting caches
-- that do not make room for it would only lose them.
local function wants(input)
  local fs = type(input.fs) == "table" and input.fs or {}
  local size, avail = int(fs.sizeBytes), int(fs.availableBytes)
  local high, low = int(input.highPercent), int(input.lowPercent)
  local cap, stored = int(input.maxBytes), int(input.storeBytes)
  local used = math.max(size - avail, 0)
  local pct = size > 0 and used * 100 // size or 0
  local out = {}
  if high < 100 and size > 0 and pct >= high then
    out[#out + 1] = { reason = "HighThreshold", bytes = used - size * low // 100,
      why = string.format("the store's file system is %d%% used (high threshold %d%%), "
        .. "brought down to %d%%", pct, high, low) }
  end
  if cap > 0 and stored > cap then
    out[#out + 1] = { reason = "MaxBytes", bytes = stored - cap,
      why = string.format("the store's caches take %s, over its cap of %s", mib(stored), mib(cap)) }
  end
  local need = type(input.need) == "table" and input.need or nil
  if need then
    local bytes, room, free = int(need.bytes), int(need.roomBytes), 0
    local why = {}
    if room > avail then
      free = room - avail
      why[#why + 1] = string.format("about %s free on the store's file system, which has %s",
        mib(room), mib(avail))
    end
    if cap > 0 and stored + bytes > cap then
      free = math.max(free, stored + bytes - cap)
      why[#why + 1] = string.format("%s under the store's cap of %s, which holds %s",
        mib(bytes), mib(cap), mib(stored))
    end
    if free > 0 then
      out[#out + 1] = { reason = "PullNeedsSpace", bytes = free, all_or_nothing = true,
        why = string.format("a pull of %s needs %s", tostring(need.cache), table.concat(why, " and ")) }
    end
  end
  return out, pct
end

function M.plan(input)
  local asked, pct = wants(input)
  local answer = { usagePercent = pct, evict = {} }
  if #asked == 0 then
    return answer
  end
  local cands = M.candidates(input)
  local total = 0
  for _, c in ipairs(cands) do
    total = total + c.bytes
  end
  -- how many candidates each want takes; the plan takes the most
  local take, first, short = 0, nil, 0
  for _, w in ipairs(asked) do
    local n, freed = 0, 0
    if not (w.all_or_nothing and total < w.bytes) then
      while freed < w.bytes and n < #cands do
        n = n + 1
        freed = freed + cands[n].bytes
      end
    end
    short = math.max(short, w.bytes - freed)
    if n > take then
      take = n
    end
    first = first or (n > 0 and w) or nil
  end
  local w = first or asked[1]
  local freed = 0
  for i = 1, take do
    answer.evict[i] = cands[i].digest
    freed = freed + cands[i].bytes
  end
  answer.reason = w.reason
  answer.shortBytes = short
  if take > 0 then
    answer.message = string.format("%s: %d unused image(s), %s, evicted", w.why, take, mib(freed))
  else
    answer.message = string.format("%s; what no pod here uses frees %s, not enough: nothing evicted",
      w.why, mib(total))
  end
  return answer
end

return M
