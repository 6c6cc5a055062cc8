-- lua/gkm/store_budget.lua (what the node agent evicts from its store, and
-- in which order) through the real engine.
local gkmspec = require 'gkmspec'

local e = assert(gkmspec.engine{})
local GiB = 1024 * 1024 * 1024
local NOW = 1767225600

local function d(c)
  return 'sha256:' .. string.rep(c, 64)
end

-- 100 GiB of file system; entries of 10 GiB each unless said otherwise
local function entry(c, over)
  local x = { digest = d(c), bytes = 10 * GiB, lastUsed = NOW - 3600, named = true, inUse = false,
              caches = { 'GKMCache default/' .. c } }
  for k, v in pairs(over or {}) do x[k] = v end
  return x
end

local function plan(over)
  local input = {
    now = NOW, highPercent = 85, lowPercent = 80, maxBytes = 0, minAgeSeconds = 120,
    fs = { sizeBytes = 100 * GiB, availableBytes = 50 * GiB }, storeBytes = 0, entries = {},
  }
  for k, v in pairs(over or {}) do input[k] = v end
  local r, status, msg = e:call_fn('gkm.store_budget', 'plan', input)
  assert(r, tostring(status) .. ': ' .. tostring(msg))
  return r
end

describe('store budget', function()
  it('evicts nothing under the high threshold', function()
    local r = plan({ fs = { sizeBytes = 100 * GiB, availableBytes = 16 * GiB }, entries = { entry('a') } })
    assert.are.equal(84, r.usagePercent)
    assert.is_nil(r.reason)
    assert.are.same({}, r.evict)
  end)

  it('above the high threshold: the unnamed first, then least recently used, down to the low one', function()
    local r = plan({
      fs = { sizeBytes = 100 * GiB, availableBytes = 5 * GiB }, -- 95% used: free 15 GiB
      entries = {
        entry('a', { lastUsed = NOW - 600 }),
        entry('b', { lastUsed = NOW - 7200 }),                               -- the least recently used named
        entry('c', { named = false, caches = {}, lastUsed = NOW - 60, bytes = 2 * GiB }), -- no cache names it
        entry('e', { lastUsed = NOW - 9000, inUse = true }),                  -- a pod mounts it: never
      },
    })
    assert.are.equal(95, r.usagePercent)
    assert.are.equal('HighThreshold', r.reason)
    -- 2 GiB (c) + 10 GiB (b) = 12 < 15: then a, the next least recently used
    assert.are.same({ d('c'), d('b'), d('a') }, r.evict)
    assert.truthy(r.message:find("95%% used %(high threshold 85%%%), brought down to 80%%"))
    assert.truthy(r.message:find('3 unused image%(s%), 22528 MiB, evicted'))
  end)

  it('stops as soon as the low threshold is reached', function()
    local r = plan({
      fs = { sizeBytes = 100 * GiB, availableBytes = 14 * GiB }, -- 86%: free 6 GiB
      entries = { entry('a', { lastUsed = NOW - 600 }), entry('b', { lastUsed = NOW - 7200 }) },
    })
    assert.are.same({ d('b') }, r.evict)
  end)

  it('never evicts what a pod mounts, nor what was used within the minimum age', function()
    local r = plan({
      fs = { sizeBytes = 100 * GiB, availableBytes = 1 * GiB },
      entries = {
        entry('a', { inUse = true }),
        entry('b', { lastUsed = NOW - 60 }),                               -- used a minute ago
        entry('c', { named = false, caches = {}, lastUsed = NOW - 5 }),    -- a pull may just have committed it
        entry('f', { lastUsed = NOW - 121 }),
      },
    })
    assert.are.same({ d('f') }, r.evict)
    assert.are.equal('HighThreshold', r.reason)
    assert.is_true(r.shortBytes > 0) -- still over: said, not hidden
  end)

  it('ties are broken by digest, so the order is stable', function()
    local r = plan({
      fs = { sizeBytes = 100 * GiB, availableBytes = 1 * GiB },
      entries = { entry('b'), entry('a'), entry('c') }, -- 99% used: free 19 GiB
    })
    assert.are.same({ d('a'), d('b') }, r.evict)
  end)

  it('high 100 turns the threshold off', function()
    local r = plan({ highPercent = 100, lowPercent = 80,
      fs = { sizeBytes = 100 * GiB, availableBytes = 0 }, entries = { entry('a') } })
    assert.are.equal(100, r.usagePercent)
    assert.are.same({}, r.evict)
  end)

  it('over the cap: just enough to go under it', function()
    local r = plan({
      maxBytes = 25 * GiB, storeBytes = 30 * GiB,
      entries = { entry('a', { lastUsed = NOW - 600 }), entry('b', { lastUsed = NOW - 7200 }),
                  entry('c', { lastUsed = NOW - 300 }) },
    })
    assert.are.equal('MaxBytes', r.reason)
    assert.are.same({ d('b') }, r.evict)
    assert.truthy(r.message:find('take 30720 MiB, over its cap of 25600 MiB'))
  end)

  it('a pull refused for room gets it, least recently used first', function()
    local r = plan({
      fs = { sizeBytes = 100 * GiB, availableBytes = 20 * GiB }, -- 80%: under the high threshold
      need = { cache = 'GKMCache default/new', bytes = 20 * GiB, roomBytes = 23 * GiB },
      entries = { entry('a', { lastUsed = NOW - 600 }), entry('b', { lastUsed = NOW - 7200 }) },
    })
    assert.are.equal('PullNeedsSpace', r.reason)
    assert.are.same({ d('b') }, r.evict)
    assert.truthy(r.message:find('a pull of GKMCache default/new needs about 23552 MiB free'))
  end)

  it('a pull under a cap gets room under it', function()
    local r = plan({
      maxBytes = 30 * GiB, storeBytes = 20 * GiB,
      need = { cache = 'GKMCache default/new', bytes = 15 * GiB, roomBytes = 17 * GiB },
      entries = { entry('a', { lastUsed = NOW - 600 }), entry('b', { lastUsed = NOW - 7200 }) },
    })
    assert.are.equal('PullNeedsSpace', r.reason)
    assert.are.same({ d('b') }, r.evict)
  end)

  it('evicts nothing for a pull it cannot make room for', function()
    local r = plan({
      fs = { sizeBytes = 100 * GiB, availableBytes = 20 * GiB },
      need = { cache = 'GKMCache default/huge', bytes = 60 * GiB, roomBytes = 68 * GiB },
      entries = { entry('a'), entry('b', { inUse = true }) },
    })
    assert.are.equal('PullNeedsSpace', r.reason)
    assert.are.same({}, r.evict)
    assert.are.equal(48 * GiB, r.shortBytes) -- 68 GiB asked, 20 GiB free, nothing evicted
    assert.truthy(r.message:find('not enough: nothing evicted'))
  end)

  it('the threshold evicts what it can even when a pull asks for more', function()
    local r = plan({
      fs = { sizeBytes = 100 * GiB, availableBytes = 10 * GiB }, -- 90%: free 10 GiB
      need = { cache = 'GKMCache default/huge', bytes = 60 * GiB, roomBytes = 68 * GiB },
      entries = { entry('a', { lastUsed = NOW - 600 }), entry('b', { lastUsed = NOW - 7200 }) },
    })
    assert.are.equal('HighThreshold', r.reason)
    assert.are.same({ d('b') }, r.evict)
  end)

  it('malformed input evicts nothing', function()
    local r = plan({ fs = 'nope', entries = { 'x', { digest = 7 } }, highPercent = 'x' })
    assert.are.same({}, r.evict)
    r = plan({ fs = { sizeBytes = 0, availableBytes = 0 }, entries = { entry('a') } })
    assert.are.same({}, r.evict)
  end)
end)
