-- lua/gkm/agent.lua (the node agent's decisions) through the real engine.
local gkmspec = require 'gkmspec'

local e = assert(gkmspec.engine{})
local D = 'sha256:' .. string.rep('c', 64)
local gpus = {
  { index = 0, uuid = 'GPU-a', name = 'NVIDIA H100', arch = 'sm_90', driverVersion = '550.54' },
  { index = 1, uuid = 'GPU-b', name = 'NVIDIA H100', arch = 'sm_90', driverVersion = '550.54' },
  { index = 2, uuid = 'GPU-c', name = 'Tesla T4', arch = 'sm_75', driverVersion = '550.54' },
}
local mixed = { gpus = {
  { index = 0, compatible = true, reason = 'Compatible', message = 'sm_90' },
  { index = 1, compatible = true, reason = 'Compatible', message = 'sm_90' },
  { index = 2, compatible = false, reason = 'ArchitectureMismatch', message = 'built for sm_90, GPU is sm_75' },
} }

local function decide(over)
  local input = {
    node = 'n1', now = '2026-11-21T10:00:00Z',
    cache = { kind = 'GKMCache', namespace = 'default', name = 'c', digest = D, image = 'r/x:v1' },
    gpus = gpus, image = { state = 'ready' }, compat = mixed,
    store = { present = false }, pull = { state = 'idle' }, view = {}, usage = { pods = 0 },
  }
  for k, v in pairs(over or {}) do input[k] = v end
  local r, status, msg = e:call_fn('gkm.agent', 'decide', input)
  assert(r, tostring(status) .. ': ' .. tostring(msg))
  return r
end

local function types(r)
  local t = {}
  for i, a in ipairs(r.actions or {}) do t[i] = a.type end
  return t
end

describe('agent decisions', function()
  it('waits for a digest', function()
    local r = decide({ cache = { kind = 'GKMCache', name = 'c', digest = '' } })
    assert.are.equal('Pending', r.entry.state)
    assert.are.equal('DigestNotResolved', r.entry.reason)
    assert.is_nil(r.entry.digest) -- the CRD allows no empty digest
    assert.are.same({}, types(r))
  end)

  it('fetches the image config before anything else', function()
    local r = decide({ image = { state = 'unknown' }, compat = nil })
    assert.are.same({ 'fetch_image' }, types(r))
    assert.are.same({}, types(decide({ image = { state = 'fetching' }, compat = nil })))
  end)

  it('pulls when a GPU is compatible, grouping GPUs into id sets', function()
    local r = decide()
    assert.are.same({ 'pull' }, types(r))
    assert.are.equal('Pulling', r.entry.state)
    assert.are.same({ { ids = { 0, 1 }, gpuType = 'NVIDIA H100' } }, r.entry.compatibleGPUs)
    assert.are.same({ { ids = { 2 }, gpuType = 'Tesla T4', reason = 'ArchitectureMismatch',
      message = 'built for sm_90, GPU is sm_75' } }, r.entry.incompatibleGPUs)
  end)

  it('never pulls for a node without a compatible GPU', function()
    local none = { gpus = { { index = 0, compatible = false, reason = 'BackendMismatch', message = 'hip cache' } } }
    local r = decide({ gpus = { gpus[1] }, compat = none })
    assert.are.equal('Incompatible', r.entry.state)
    assert.are.equal('BackendMismatch', r.entry.reason)
    assert.are.same({}, types(r))
  end)

  it('a compat policy that fails: Failed/PolicyError, nothing pulled, no retry on a timer', function()
    local r = decide({ compat = { error = "compat: called blocked function 'x'" } })
    assert.are.equal('Failed', r.entry.state)
    assert.are.equal('PolicyError', r.entry.reason)
    assert.truthy(r.entry.message:find("the compat policy failed: compat: called blocked function 'x'", 1, true))
    assert.are.same({}, types(r))
    assert.is_nil(r.requeue_after)
  end)

  it('a compat policy that fails keeps a Ready view serving, saying why', function()
    local prev = { digest = D, state = 'Ready', reason = 'Ready', message = 'extracted and ready',
                   compatibleGPUs = { { ids = { 0, 1 } } }, incompatibleGPUs = {} }
    local r = decide({ compat = { error = 'boom' }, store = { present = true }, view = { digest = D },
                       previous = prev })
    assert.are.equal('Ready', r.entry.state)
    assert.are.same({ { ids = { 0, 1 } } }, r.entry.compatibleGPUs)
    assert.truthy(r.entry.message:find('the compat policy failed: boom', 1, true))
    assert.are.same({}, types(r))
  end)

  it('links an extracted digest without pulling again (restart, shared digest)', function()
    local r = decide({ store = { present = true } })
    assert.are.same({ 'link' }, types(r))
    local ready = decide({ store = { present = true }, view = { digest = D } })
    assert.are.equal('Ready', ready.entry.state)
    assert.are.same({}, types(ready))
  end)

  it('stays Ready from its view while it re-reads the image after a restart', function()
    local r = decide({ image = { state = 'unknown' }, compat = nil, store = { present = true },
                       view = { digest = D, compatibleGPUs = { '0', '1' } } })
    assert.are.equal('Ready', r.entry.state)
    assert.are.same({ { ids = { 0, 1 } } }, r.entry.compatibleGPUs)
    assert.are.same({ 'fetch_image' }, types(r))
    local gone = decide({ image = { state = 'unknown' }, compat = nil, store = { present = false },
                          view = { digest = D, compatibleGPUs = { '0' } } })
    assert.are.equal('Pending', gone.entry.state)
  end)

  it('reports a failed pull with its next try, and wants it retried', function()
    local r = decide({ pull = { state = 'failed', reason = 'DigestMismatch', message = 'layer sha256 differs',
                                attempts = 2, permanent = false, nextAttemptTime = '2026-11-21T10:00:04Z' } })
    assert.are.equal('Failed', r.entry.state)
    assert.are.equal('DigestMismatch', r.entry.reason)
    assert.are.equal('layer sha256 differs', r.entry.message)
    assert.are.equal('2026-11-21T10:00:04Z', r.entry.nextAttemptTime)
    assert.are.same({ 'pull' }, types(r))
  end)

  it('a permanent failure names no next try and says what makes it try again', function()
    local r = decide({ pull = { state = 'failed', reason = 'Unsigned', message = 'image is not signed',
                                attempts = 1, permanent = true, nextAttemptTime = '2026-11-21T10:00:01Z' } })
    assert.are.equal('Failed', r.entry.state)
    assert.are.equal('Unsigned', r.entry.reason)
    assert.is_nil(r.entry.nextAttemptTime)
    assert.truthy(r.entry.message:find('not tried again until', 1, true))
  end)

  it('an image that cannot be read is Failed with its next try, and read again', function()
    local r = decide({ image = { state = 'failed', reason = 'RegistryUnavailable', message = 'connection refused',
                                 attempts = 3, permanent = false, nextAttemptTime = '2026-11-21T10:00:08Z' },
                       compat = nil })
    assert.are.equal('Failed', r.entry.state)
    assert.are.equal('RegistryUnavailable', r.entry.reason)
    assert.are.equal('2026-11-21T10:00:08Z', r.entry.nextAttemptTime)
    assert.are.same({ 'fetch_image' }, types(r))
    assert.is_nil(r.requeue_after)
  end)

  it('stays Ready from its view when the image cannot be re-read after a restart', function()
    local r = decide({ image = { state = 'failed', reason = 'RegistryUnavailable', message = 'connection refused' },
                       compat = nil, store = { present = true }, view = { digest = D, compatibleGPUs = { '0' } } })
    assert.are.equal('Ready', r.entry.state)
    assert.truthy(r.entry.message:find('connection refused', 1, true))
    assert.are.same({ 'fetch_image' }, types(r))
  end)

  it('keeps a deleted cache while pods use it, then unlinks', function()
    local pods = { { podName = 'p1', podNamespace = 'default', podUID = 'u1', volumeId = 'v1' },
                   { podName = 'p2', podNamespace = 'default', podUID = 'u2', volumeId = 'v2' } }
    local r = decide({ cache = false, view = { digest = D }, usage = { pods = 2, list = pods } })
    assert.are.equal('Deleting', r.entry.state)
    assert.are.same(pods, r.entry.pods)
    assert.truthy(r.requeue_after)
    assert.are.same({}, types(r))
    local gone = decide({ cache = false, view = { digest = D }, usage = { pods = 0 } })
    assert.is_nil(gone.entry)
    assert.are.same({ 'unlink' }, types(gone))
  end)

  it('keeps lastUpdated when nothing changed', function()
    local first = decide({ store = { present = true }, view = { digest = D } })
    local again = decide({ store = { present = true }, view = { digest = D }, now = '2026-11-21T11:00:00Z',
      previous = first.entry })
    assert.are.equal('2026-11-21T10:00:00Z', again.entry.lastUpdated)
    local mounted = decide({ store = { present = true }, view = { digest = D }, now = '2026-11-21T11:00:00Z',
      previous = first.entry, usage = { pods = 1, list = { { podName = 'p', volumeId = 'v' } } } })
    assert.are.equal('2026-11-21T11:00:00Z', mounted.entry.lastUpdated)
  end)

  it('reports fallback volumes apart; they neither use the cache nor keep it', function()
    local fb = { { podName = 'p3', podNamespace = 'default', podUID = 'u3', volumeId = 'v3',
                   state = 'Pulling', reason = 'Pulling', message = 'not ready on this node yet' } }
    local r = decide({ usage = { pods = 0, list = {}, fallback = fb } })
    assert.are.equal('Pulling', r.entry.state)
    assert.are.same({}, r.entry.pods)
    assert.are.same(fb, r.entry.fallbackPods)
    assert.is_nil(decide({ usage = { pods = 0, list = {}, fallback = {} } }).entry.fallbackPods)
    -- a deleted cache whose only volume is a fallback is released at once
    local gone = decide({ cache = false, view = { digest = D }, usage = { pods = 0, list = {}, fallback = fb } })
    assert.is_nil(gone.entry)
    assert.are.same({ 'unlink' }, types(gone))
    -- a new fallback volume is a change of the entry
    local first = decide({ store = { present = true }, view = { digest = D } })
    local later = decide({ store = { present = true }, view = { digest = D }, now = '2026-11-21T11:00:00Z',
      previous = first.entry, usage = { pods = 0, list = {}, fallback = fb } })
    assert.are.equal('2026-11-21T11:00:00Z', later.entry.lastUpdated)
  end)

  describe('in a rollout (spec.rollout.maxPulling, a mirror)', function()
    local D0 = 'sha256:' .. string.rep('0', 64)
    local waiting = { maxPulling = 2, pulling = 2, waiting = 3, waitingPlace = 2, limit = 2 }

    it('waits for a slot instead of pulling, and says its place', function()
      local r = decide({ rollout = waiting })
      assert.are.same({}, types(r))
      assert.are.equal('Waiting', r.entry.state)
      assert.are.equal('RolloutWaiting', r.entry.reason)
      assert.are.equal('2026-11-21T10:00:00Z', r.entry.waitingSince)
      assert.truthy(r.entry.message:find('2 of 3 waiting', 1, true))
      assert.truthy(r.entry.message:find('2 of at most 2', 1, true))
      -- the place in line is kept from the first report on
      local later = decide({ rollout = waiting, now = '2026-11-21T10:05:00Z', previous = r.entry })
      assert.are.equal('2026-11-21T10:00:00Z', later.entry.waitingSince)
    end)

    it('pulls once granted, and without a rollout as before', function()
      assert.are.same({ 'pull' }, types(decide({ rollout = { maxPulling = 2, pullingPlace = 1, limit = 2 } })))
      assert.are.same({ 'pull' }, types(decide({ rollout = { maxPulling = "100%" } })))
      assert.are.same({ 'pull' }, types(decide({ rollout = {} })))
    end)

    it('waits for its grant whenever gkm.rollout would limit the pulls', function()
      for _, max in ipairs({ 1, 5, "1%", "25%", "99%" }) do
        assert.are.equal('Waiting', decide({ rollout = { maxPulling = max } }).entry.state, tostring(max))
      end
      for _, max in ipairs({ "100%", "150%", "all" }) do
        assert.are.same({ 'pull' }, types(decide({ rollout = { maxPulling = max } })), max)
      end
    end)

    it('says when it waits for the mirror to be filled first', function()
      local r = decide({ rollout = { mirrored = true } })
      assert.are.equal('Waiting', r.entry.state)
      assert.is_true(r.entry.throughMirror)
      assert.truthy(r.entry.message:find('mirror', 1, true))
    end)

    it('reads an image without compat labels by pulling it only in its wave', function()
      local r = decide({ image = { state = 'unknown', pullToRead = true }, compat = nil, rollout = waiting })
      assert.are.equal('Waiting', r.entry.state)
      assert.are.same({}, types(r))
      local go = decide({ image = { state = 'unknown', pullToRead = true }, compat = nil,
        rollout = { maxPulling = 2, pullingPlace = 1 } })
      assert.are.same({ 'fetch_image' }, types(go))
    end)

    it('hands its slot back on a failure and asks again when a retry is due', function()
      local f = { state = 'failed', reason = 'RegistryUnavailable', message = 'timed out', attempts = 1 }
      f.retryIn = 20
      local r = decide({ pull = f, rollout = waiting })
      assert.are.equal('Failed', r.entry.state)
      assert.are.equal(20, r.requeue_after)
      f.retryIn = 0
      local again = decide({ pull = f, rollout = waiting })
      assert.are.equal('Waiting', again.entry.state)
      assert.truthy(again.entry.message:find('timed out', 1, true))
      -- granted while a backoff runs: the slot goes back, no pull starts
      f.retryIn = 5
      local backoff = decide({ pull = f, rollout = { maxPulling = 2, pullingPlace = 1 } })
      assert.are.equal('Failed', backoff.entry.state)
      assert.are.same({}, types(backoff))
      assert.are.equal(5, backoff.requeue_after)
      -- granted when the try is due: the retry is a pull in its slot, not a failure
      f.retryIn = 0
      local granted = decide({ pull = f, rollout = { maxPulling = 2, pullingPlace = 1 } })
      assert.are.equal('Pulling', granted.entry.state)
      assert.are.equal('Retrying', granted.entry.reason)
      assert.are.same({ 'pull' }, types(granted))
      -- a permanent failure is Failed and asks for nothing
      local p = decide({ pull = { state = 'failed', reason = 'Unauthorized', permanent = true }, rollout = waiting })
      assert.are.equal('Failed', p.entry.state)
      assert.are.same({}, types(p))
    end)

    it('keeps serving the digest it was Ready with until the new one is', function()
      local r = decide({ rollout = waiting, view = { digest = D0, ready = true } })
      assert.are.equal('Waiting', r.entry.state)
      assert.are.equal(D0, r.entry.servingDigest)
      local pulling = decide({ rollout = { maxPulling = 2, pullingPlace = 1 }, view = { digest = D0, ready = true } })
      assert.are.equal(D0, pulling.entry.servingDigest)
      local done = decide({ store = { present = true }, view = { digest = D, ready = true } })
      assert.are.equal('Ready', done.entry.state)
      assert.is_nil(done.entry.servingDigest)
      -- a view that was never Ready serves nothing
      assert.is_nil(decide({ view = { digest = D0 } }).entry.servingDigest)
    end)

    it('keeps a cache this node is no longer for until its pods are gone', function()
      local r = decide({ cache = false, away = true, view = { digest = D },
        usage = { pods = 1, list = { { podName = 'p', volumeId = 'v' } } } })
      assert.are.equal('Deleting', r.entry.state)
      assert.are.equal('NotSelected', r.entry.reason)
      local gone = decide({ cache = false, away = true, view = { digest = D } })
      assert.is_nil(gone.entry)
      assert.are.same({ 'unlink' }, types(gone))
    end)
  end)

  it('an evicted cache stays Evicted, with no work, until it is wanted again', function()
    local ev = { reason = 'PullNeedsSpace', message = 'evicted from the store of node n1 (40 MiB freed): ...' }
    local r = decide({ store = { present = false, evicted = ev } })
    assert.are.equal('Evicted', r.entry.state)
    assert.are.equal('PullNeedsSpace', r.entry.reason)
    assert.are.equal(ev.message, r.entry.message)
    assert.are.equal(D, r.entry.digest)
    assert.are.same({ { ids = { 0, 1 }, gpuType = 'NVIDIA H100' } }, r.entry.compatibleGPUs)
    assert.are.same({}, types(r)) -- not pulled again
    -- after a restart its configuration is read again (for the GPUs it fits), nothing else
    r = decide({ image = { state = 'unknown' }, compat = nil, store = { present = false, evicted = ev } })
    assert.are.equal('Evicted', r.entry.state)
    assert.are.same({ 'fetch_image' }, types(r))
    r = decide({ image = { state = 'fetching' }, compat = nil, store = { present = false, evicted = ev } })
    assert.are.same({}, types(r))
    -- a reason the CRD would refuse is not passed on
    r = decide({ store = { present = false, evicted = { reason = '', message = '' } } })
    assert.are.equal('Evicted', r.entry.reason)
    assert.are.equal("evicted from this node's store", r.entry.message)
    -- wanted (a pod here asked for it, the cache was edited): pulled again
    ev.wanted = true
    r = decide({ store = { present = false, evicted = ev } })
    assert.are.equal('Pulling', r.entry.state)
    assert.are.same({ 'pull' }, types(r))
    r = decide({ image = { state = 'unknown' }, compat = nil, store = { present = false, evicted = ev } })
    assert.are.same({ 'fetch_image' }, types(r))
    -- an evicted cache on a node without a compatible GPU is Incompatible all the same
    r = decide({ compat = { gpus = { { index = 0, compatible = false, reason = 'ArchitectureMismatch' } } },
      gpus = { gpus[1] }, store = { present = false, evicted = { reason = 'HighThreshold', message = 'm' } } })
    assert.are.equal('Incompatible', r.entry.state)
    -- a deleted one is released as any other
    local gone = decide({ cache = false, store = { present = false, evicted = { reason = 'HighThreshold' } } })
    assert.is_nil(gone.entry)
  end)
end)
