-- policies/aggregate.lua through the real engine.
local gkmspec = require 'gkmspec'

local root = os.getenv('GKM_ROOT') or '.'
local e = assert(gkmspec.engine{ dir = root .. '/policies' })
local D = 'sha256:' .. string.rep('a', 64)

local function entry(state, reason, message)
  return { digest = D, state = state, reason = reason, message = message, pods = 0 }
end

local function aggregate(nodes, extra)
  local input = {
    cache = { kind = 'GKMCache', namespace = 'default', name = 'c', generation = 2,
              annotations = { ['gkm.io/resolvedDigest'] = D }, status = {} },
    digest = D, verification = { enabled = true, resolvedBy = 'webhook' },
    nodes = nodes, now = '2026-11-21T10:00:00Z',
  }
  for k, v in pairs(extra or {}) do input[k] = v end
  local r, status, msg = e:call('aggregate', input)
  assert(r, tostring(status) .. ': ' .. tostring(msg))
  return r
end

local function cond(r, t)
  for _, c in ipairs(r.conditions) do
    if c.type == t then return c end
  end
end

describe('aggregate policy', function()
  it('is Ready when every node that can use the cache is ready', function()
    local r = aggregate({
      { name = 'n1', entry = entry('Ready') },
      { name = 'n2', entry = entry('Ready') },
      { name = 'n3', entry = entry('Incompatible', 'ArchitectureMismatch', 'sm_75 cache on sm_90') },
    })
    assert.are.equal(3, r.totalNodes)
    assert.are.equal(2, r.readyNodes)
    local ready = cond(r, 'Ready')
    assert.are.equal('True', ready.status)
    assert.truthy(ready.message:find('ready on 2 of 3 nodes; 1 without a compatible GPU', 1, true), ready.message)
    assert.are.equal('True', cond(r, 'Verified').status)
    assert.are.equal('False', cond(r, 'Progressing').status)
    assert.are.equal(2, ready.observedGeneration)
  end)

  it('counts a node without a compatible GPU as incompatible, not failed', function()
    local r = aggregate({
      { name = 'n1', entry = entry('Ready') },
      { name = 'n3', entry = entry('Incompatible', 'ArchitectureMismatch', 'sm_75 cache on sm_90') },
      { name = 'n2', entry = entry('Incompatible', 'BackendMismatch', 'cuda cache on hip') },
    })
    assert.are.equal(0, r.failedNodes)
    assert.are.equal(2, r.incompatibleNodes)
    assert.are.equal(0, r.counts.nodeErrorCnt)
    assert.are.same({}, r.failedNodeConditions)
    assert.are.same({ ArchitectureMismatch = { 'n3' }, BackendMismatch = { 'n2' } }, r.incompatibleNodeConditions)
    local err = cond(r, 'Error')
    assert.are.equal('False', err.status)
    assert.are.equal('no node failed; 2 without a compatible GPU (not a failure)', err.message)
    assert.are.equal('True', cond(r, 'Ready').status)
  end)

  it('keeps the Error condition in step with the failed count', function()
    local r = aggregate({
      { name = 'n1', entry = entry('Failed', 'PullFailed', 'registry timed out') },
      { name = 'n2', entry = entry('Incompatible', 'BackendMismatch', 'x') },
    })
    assert.are.equal(1, r.failedNodes)
    assert.are.equal(1, r.incompatibleNodes)
    assert.are.same({ PullFailed = { 'n1' } }, r.failedNodeConditions)
    assert.are.equal('True', cond(r, 'Error').status)
    assert.are.equal('n1: registry timed out', cond(r, 'Error').message)
  end)

  it('groups failed nodes by reason and raises Error', function()
    local r = aggregate({
      { name = 'b', entry = entry('Failed', 'PullFailed', 'registry timed out') },
      { name = 'a', entry = entry('Failed', 'PullFailed', 'registry timed out') },
      { name = 'c', entry = entry('Ready') },
    })
    assert.are.same({ 'a', 'b' }, r.failedNodeConditions.PullFailed)
    assert.are.equal('True', cond(r, 'Error').status)
    assert.are.equal('NodesFailed', cond(r, 'Ready').reason)
    assert.truthy(cond(r, 'Error').message:find('a: registry timed out', 1, true))
  end)

  it('is Progressing while nodes have not reported or report another digest', function()
    local old = entry('Ready')
    old.digest = 'sha256:' .. string.rep('b', 64)
    local r = aggregate({ { name = 'n1' }, { name = 'n2', entry = old } })
    assert.are.equal(0, r.readyNodes)
    assert.are.equal('True', cond(r, 'Progressing').status)
    assert.truthy(cond(r, 'Progressing').message:find('n1, n2', 1, true))
  end)

  it('counts the pods the nodes list, in the CRD counts', function()
    local used = entry('Ready')
    used.pods = { { podName = 'p1', volumeId = 'v1' }, { podName = 'p2', volumeId = 'v2' } }
    local r = aggregate({
      { name = 'n1', entry = used },
      { name = 'n2', entry = entry('Ready') },
      { name = 'n3', entry = entry('Failed', 'PullFailed', 'x') },
    })
    assert.are.same({ nodeCnt = 3, nodeInUseCnt = 1, nodeNotInUseCnt = 1, nodeErrorCnt = 1,
                      podRunningCnt = 2 }, r.counts)
    assert.are.equal(2, r.podsUsing)
  end)

  it('counts a node that evicted the cache neither as failed nor as work in progress', function()
    local r = aggregate({
      { name = 'n1', entry = entry('Ready') },
      { name = 'n2', entry = entry('Evicted', 'HighThreshold', 'evicted from the store of node n2') },
      { name = 'n3', entry = entry('Incompatible', 'BackendMismatch', 'cuda cache on hip') },
    })
    assert.are.equal(1, r.readyNodes)
    assert.are.equal(0, r.failedNodes)
    local ready = cond(r, 'Ready')
    assert.are.equal('True', ready.status)
    assert.truthy(ready.message:find('ready on 1 of 3 nodes; 1 without a compatible GPU; evicted from 1 to free space',
      1, true), ready.message)
    assert.are.equal('False', cond(r, 'Progressing').status)
    assert.are.equal('False', cond(r, 'Error').status)
    -- a node that evicted it keeps its label: a pod placed there has it pulled again
    local gpus = { { ids = { 0 } } }
    local ready1, evicted2 = entry('Ready'), entry('Evicted', 'HighThreshold', 'x')
    ready1.compatibleGPUs, evicted2.compatibleGPUs = gpus, gpus
    r = aggregate({ { name = 'n1', entry = ready1 }, { name = 'n2', entry = evicted2 } })
    assert.are.same({ 'n1', 'n2' }, r.labeledNodes)
    -- evicted everywhere it can run: not Ready, and why
    r = aggregate({
      { name = 'n2', entry = entry('Evicted', 'HighThreshold', 'x') },
      { name = 'n3', entry = entry('Evicted', 'PullNeedsSpace', 'y') },
    })
    ready = cond(r, 'Ready')
    assert.are.equal('False', ready.status)
    assert.are.equal('Evicted', ready.reason)
    assert.are.equal('False', cond(r, 'Progressing').status)
    -- a node still pulling is work in progress all the same
    r = aggregate({
      { name = 'n1', entry = entry('Ready') },
      { name = 'n2', entry = entry('Evicted', 'HighThreshold', 'x') },
      { name = 'n3', entry = entry('Pulling', 'Pulling', 'y') },
    })
    assert.are.equal('Progressing', cond(r, 'Ready').reason)
    assert.are.equal('True', cond(r, 'Progressing').status)
  end)

  it('says NoCompatibleNodes when no node can use it', function()
    local r = aggregate({ { name = 'n1', entry = entry('Incompatible', 'BackendMismatch', 'x') } })
    assert.are.equal('NoCompatibleNodes', cond(r, 'Ready').reason)
  end)

  it('reports VerificationDisabled when verification is off', function()
    local r = aggregate({}, { verification = { enabled = false, resolvedBy = 'operator' } })
    local v = cond(r, 'Verified')
    assert.are.equal('False', v.status)
    assert.are.equal('VerificationDisabled', v.reason)
    assert.are.equal('NoNodes', cond(r, 'Ready').reason)
  end)

  it('reports verification done by the nodes where no webhook runs', function()
    local base = { cache = { generation = 1, annotations = {}, status = {} }, digest = D,
                   verification = { enabled = true, resolvedBy = 'operator' }, now = 'x' }
    base.nodes = { { name = 'n1', entry = entry('Ready') } }
    assert.are.equal('VerifiedOnNodes', cond(assert(e:call('aggregate', base)), 'Verified').reason)
    base.nodes = { { name = 'n1', entry = entry('Failed', 'Unsigned', 'image is not signed') } }
    local v = cond(assert(e:call('aggregate', base)), 'Verified')
    assert.are.equal('False', v.status)
    assert.are.equal('Unsigned', v.reason)
  end)

  it('never takes the gkm.io/resolvedDigest annotation for a verified signature', function()
    -- the annotation set by hand where no webhook looks; nothing has checked the image
    local r = aggregate({ { name = 'n1', entry = entry('Pulling') } })
    local v = cond(r, 'Verified')
    assert.are.equal('Unknown', v.status)
    assert.are.equal('AwaitingVerification', v.reason)
    assert.truthy(v.message:find('no proof', 1, true), v.message)
    assert.falsy(v.message:find('webhook verified', 1, true), v.message)
  end)

  it('says what the operator found with its own keys, and for which digest', function()
    local function verified(state, nodes, digest)
      return cond(aggregate(nodes or { { name = 'n1', entry = entry('Pulling') } }, {
        verification = { enabled = true, resolvedBy = 'webhook',
                         operator = { state = state, digest = digest or D, message = 'M' } } }), 'Verified')
    end
    local v = verified('verified')
    assert.are.same({ 'True', 'SignatureVerified' }, { v.status, v.reason })
    assert.truthy(v.message:find('the operator verified the signature of ' .. D .. ': M', 1, true), v.message)
    v = verified('unsigned')
    assert.are.same({ 'False', 'Unsigned' }, { v.status, v.reason })
    v = verified('untrusted')
    assert.are.same({ 'False', 'SignatureNotTrusted' }, { v.status, v.reason })
    v = verified('error')
    assert.are.same({ 'Unknown', 'VerificationError' }, { v.status, v.reason })
    v = verified('pending')
    assert.are.same({ 'Unknown', 'AwaitingVerification' }, { v.status, v.reason })
    -- a verdict on another digest says nothing about this one
    v = verified('verified', nil, 'sha256:' .. string.rep('c', 64))
    assert.are.same({ 'Unknown', 'AwaitingVerification' }, { v.status, v.reason })
    -- nodes that refuse the image outweigh the operator's verdict
    v = verified('verified', { { name = 'n1', entry = entry('Failed', 'SignatureNotTrusted', 'no key') } })
    assert.are.same({ 'False', 'SignatureNotTrusted' }, { v.status, v.reason })
    -- ready nodes verified it themselves, webhook or not
    v = verified('pending', { { name = 'n1', entry = entry('Ready') } })
    assert.are.same({ 'True', 'VerifiedOnNodes' }, { v.status, v.reason })
  end)

  it('keeps lastTransitionTime while a condition does not change', function()
    local input_status = { conditions = { { type = 'Ready', status = 'True', reason = 'Ready',
      message = 'x', lastTransitionTime = '2026-01-01T00:00:00Z' } } }
    local r = assert(e:call('aggregate', {
      cache = { generation = 1, status = input_status, annotations = {} },
      digest = D, verification = { enabled = true }, now = '2026-11-21T10:00:00Z',
      nodes = { { name = 'n1', entry = entry('Ready') } },
    }))
    assert.are.equal('2026-01-01T00:00:00Z', cond(r, 'Ready').lastTransitionTime)
    assert.are.equal('2026-11-21T10:00:00Z', cond(r, 'Progressing').lastTransitionTime)
  end)

  it('survives malformed input', function()
    local r = assert(e:call('aggregate', { nodes = { 'junk', { name = 7 }, { name = 'x', entry = 'bad' } } }))
    assert.are.equal(1, r.totalNodes)
    assert.are.equal('DigestNotResolved', cond(r, 'Ready').reason)
  end)

  it('labels the nodes where the cache is Ready for a GPU, and only those', function()
    local gpu = { { ids = { 0 } } }
    local function with_gpus(en, gpus)
      en.compatibleGPUs = gpus
      return en
    end
    local stale = with_gpus(entry('Ready'), gpu)
    stale.digest = 'sha256:' .. string.rep('b', 64)
    local r = aggregate({
      { name = 'n1', entry = with_gpus(entry('Ready'), gpu) },
      { name = 'n2', entry = with_gpus(entry('Incompatible', 'BackendMismatch', 'cuda cache on hip'), {}) },
      { name = 'n3', entry = with_gpus(entry('Failed', 'Unsigned', 'not signed'), gpu) },
      { name = 'n4', entry = with_gpus(entry('Pulling'), gpu) },
      { name = 'n5', entry = stale },                             -- Ready on another digest
      { name = 'n6', entry = with_gpus(entry('Ready'), {}) },      -- Ready, but no GPU can use it
      { name = 'n7', entry = entry('Ready') },                    -- no GPU list at all
      { name = 'n8' },                                            -- no report yet
      { name = 'n9', entry = with_gpus(entry('Ready'), { { ids = { 0, 1 } } }) },
    })
    assert.are.same({ 'n1', 'n9' }, r.labeledNodes)
  end)

  it('labels no node when none is Ready', function()
    local r = aggregate({ { name = 'n1', entry = entry('Pending') } })
    assert.are.same({}, r.labeledNodes)
  end)

  it('refuses labeledNodes that are not a list of node names', function()
    for _, v in ipairs({ '"n1"', '{ 7 }', '{ "Not_A_Node" }', '{ n1 = true }' }) do
      local bad = assert(gkmspec.engine{ files = { ['aggregate.lua'] =
        'return { evaluate = function() return { totalNodes = 0, readyNodes = 0, failedNodes = 0, '
        .. 'podsUsing = 0, resolvedDigest = "", lastUpdated = "", conditions = {}, labeledNodes = '
        .. v .. ' } end }' } })
      local r, status, msg = bad:call('aggregate', {})
      assert.is_nil(r, v)
      assert.are.equal('bad return value', status)
      assert.truthy(msg:find('labeledNodes', 1, true), msg)
    end
  end)

  it('refuses a broken aggregate result', function()
    local bad = assert(gkmspec.engine{ files = { ['aggregate.lua'] =
      'return { evaluate = function() return { totalNodes = -1 } end }' } })
    local r, status, msg = bad:call('aggregate', {})
    assert.is_nil(r)
    assert.are.equal('bad return value', status)
    assert.truthy(msg:find('totalNodes', 1, true), msg)
  end)

  describe('captures (spec.capture)', function()
    local C1, C2 = 'sha256:' .. string.rep('1', 64), 'sha256:' .. string.rep('2', 64)
    local K = 'io.triton.cache/H/mul_kernel.cubin'
    local function cand(digest, pod, content, base)
      return { digest = digest, repository = 'r/cand', baseDigest = base or D, files = 2, bytes = 9,
               targets = { { backend = 'cuda', arch = 75, warp_size = 32 } },
               paths = { { path = K, digest = content },
                         { path = 'io.triton.cache/H/mul_kernel.json', digest = 'sha256:j' } },
               pod = { name = pod, namespace = 'default', uid = 'u-' .. pod },
               capturedAt = '2026-11-21T10:00:0' .. pod:sub(-1) .. 'Z' }
    end
    local function with(captures)
      local en = entry('Ready')
      en.captures = captures
      return en
    end

    it('lists one candidate per digest with every pod and node it came from', function()
      local r = aggregate({
        { name = 'n1', entry = with({ cand(C1, 'p1', 'sha256:x') }) },
        { name = 'n2', entry = with({ cand(C1, 'p2', 'sha256:x') }) },
      })
      assert.are.equal(1, #r.candidates)
      local c = r.candidates[1]
      assert.are.equal(C1, c.digest)
      assert.are.same({ { name = 'p1', namespace = 'default', uid = 'u-p1', node = 'n1' },
                        { name = 'p2', namespace = 'default', uid = 'u-p2', node = 'n2' } }, c.pods)
      assert.are.equal('2026-11-21T10:00:02Z', c.capturedAt)
      assert.is_nil(r.captureConflicts)
      assert.is_nil(r.captureRefusals)
    end)

    it('lists a pod captured twice (on demand, then at exit) once', function()
      local r = aggregate({ { name = 'n1', entry = with({ cand(C1, 'p1', 'sha256:x'), cand(C1, 'p1', 'sha256:x') }) } })
      assert.are.equal(1, #r.candidates[1].pods)
    end)

    it('reports a path two candidates hold with different contents as a conflict', function()
      local r = aggregate({
        { name = 'n1', entry = with({ cand(C1, 'p1', 'sha256:x'), cand(C2, 'p3', 'sha256:y') }) },
      })
      assert.are.equal(2, #r.candidates)
      assert.are.same({ { path = K, digests = { C1, C2 } } }, r.captureConflicts)
    end)

    it('lists refusals, and leaves out candidates on another base', function()
      local r = aggregate({
        { name = 'n1', entry = with({ cand(C1, 'p1', 'sha256:x', 'sha256:' .. string.rep('b', 64)),
          { refused = { reason = 'Symlink', message = 'x is a symlink' }, pod = { name = 'p4' },
            capturedAt = 't' } }) },
      })
      assert.is_nil(r.candidates)
      assert.are.same({ { reason = 'Symlink', message = 'x is a symlink', pod = { name = 'p4', node = 'n1' },
                          capturedAt = 't' } }, r.captureRefusals)
    end)
  end)

  describe('hits', function()
    local function pods(...)
      local ready = entry('Ready')
      ready.pods = { ... }
      return ready
    end
    it('counts pods with and without misses, and the most missed kernels', function()
      local r = aggregate({
        { name = 'n1', entry = pods({ volumeId = 'a', misses = 0 },
                                    { volumeId = 'b', misses = 2,
                                      missedKernels = { 'mul (cuda 90)', 'add (cuda 90)' } }) },
        { name = 'n2', entry = pods({ volumeId = 'c', misses = 1, missedKernels = { 'mul (cuda 90)' } },
                                    { volumeId = 'd' }) },
      })
      assert.are.same({ podsWithoutMiss = 1, podsWithMisses = 2, kernelsCompiled = 3,
                        mostMissed = { 'mul (cuda 90) (2 pods)', 'add (cuda 90) (1 pod)' } }, r.hits)
    end)
    it('counts an onMiss "empty" pod, and says nothing where no pod reports', function()
      local inc = entry('Incompatible')
      inc.fallbackPods = { { volumeId = 'f', misses = 4 } }
      assert.are.same({ podsWithoutMiss = 0, podsWithMisses = 1, kernelsCompiled = 4 },
                      aggregate({ { name = 'n1', entry = inc } }).hits)
      -- pods that finished count too
      inc.finishedPods = { { volumeId = 'x', misses = 0 }, { volumeId = 'y', misses = 2 } }
      assert.are.same({ podsWithoutMiss = 1, podsWithMisses = 2, kernelsCompiled = 6 },
                      aggregate({ { name = 'n1', entry = inc } }).hits)
      assert.is_nil(aggregate({ { name = 'n1', entry = pods({ volumeId = 'ro' }) } }).hits)
    end)
  end)
end)
