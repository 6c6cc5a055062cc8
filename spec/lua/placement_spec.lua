-- policies/placement.lua and the gkm.cache_label binding through the real engine.
local gkmspec = require 'gkmspec'

local root = os.getenv('GKM_ROOT') or '.'
local e = assert(gkmspec.engine{ dir = root .. '/policies' })

local function cache(over)
  local c = { volume = 'kernels', mount = 'csi', kind = 'GKMCache', namespace = 'team-a',
              name = 'llama', label = 'team-a.gkmcache.gkm.io/llama', known = true,
              readyNodes = 2, totalNodes = 3, ready = true }
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

local function place(caches)
  return assert(e:call('placement', { pod = { namespace = 'team-a', name = 'vllm-0' },
                                      caches = caches })).placements
end

describe('placement policy', function()
  it("adds nothing for a cache's claim: its volume carries the affinity", function()
    local p = place({ cache{ mount = 'claim' } }).kernels
    assert.are.equal('none', p.mode)
    assert.truthy(p.reason:find('spec.claim.placement', 1, true), p.reason)
  end)

  describe('a pod that names its runtime (gkm.io/runtime)', function()
    local function run(engine, runtime, identity)
      return assert(engine:call('placement', {
        pod = { namespace = 'team-a', name = 'vllm-0', runtime = runtime },
        caches = { cache{ identity = identity } } })).placements.kernels
    end
    it('is warned when the cache was compiled by another version', function()
      local p = run(e, { triton = '3.3.0' }, { triton = { '3.2.0' } })
      assert.are.equal('required', p.mode)
      assert.is_nil(p.refuse)
      assert.are.equal('the pod runs triton=3.3.0, but GKMCache team-a/llama was compiled by triton ' ..
        '3.2.0: its kernels will not hit and are compiled again in the pod', p.warning)
    end)
    it('is not warned for a version the cache holds, or when either side says nothing', function()
      assert.is_nil(run(e, { triton = '3.2.0' }, { triton = { '3.1.0', '3.2.0' } }).warning)
      assert.is_nil(run(e, { triton = '3.3.0' }, nil).warning)
      assert.is_nil(run(e, nil, { triton = { '3.2.0' } }).warning)
      assert.is_nil(run(e, { vllm = '0.11.0' }, { triton = { '3.2.0' } }).warning)
    end)
    it('is refused with runtime_mismatch = "refuse"', function()
      local src = assert(io.open(root .. '/policies/placement.lua')):read('a')
      src = src:gsub('M.runtime_mismatch = "warn"', 'M.runtime_mismatch = "refuse"')
      local strict = assert(gkmspec.engine{ files = { ['placement.lua'] = src } })
      local p = run(strict, { triton = '3.3.0' }, { triton = { '3.2.0' } })
      assert.is_nil(p.warning)
      assert.truthy(p.refuse:find('compiled by triton 3.2.0', 1, true), p.refuse)
    end)
  end)

  it('requires the nodes where a CSI cache is Ready, and says where', function()
    local p = place({ cache() }).kernels
    assert.are.equal('required', p.mode)
    assert.are.equal('ready on 2 of 3 nodes', p.reason)
  end)

  it('still requires them for a CSI cache Ready nowhere: the mount would wait anyway', function()
    local p = place({ cache{ readyNodes = 0, ready = false } }).kernels
    assert.are.equal('required', p.mode)
    assert.truthy(p.reason:find('not Ready on any node yet', 1, true), p.reason)
    local u = place({ cache{ known = false, readyNodes = 0, totalNodes = 0 } }).kernels
    assert.are.equal('required', u.mode)
    assert.truthy(u.reason:find('GKMCache team-a/llama does not exist', 1, true), u.reason)
  end)

  it('only prefers the Ready nodes for a CSI volume with onMiss "empty": it starts anywhere', function()
    for _, c in ipairs({ cache{ attributes = { onMiss = 'empty' } },
                         cache{ attributes = { onMiss = 'empty' }, readyNodes = 0, ready = false },
                         cache{ attributes = { onMiss = 'empty' }, known = false, readyNodes = 0 } }) do
      local p = place({ c }).kernels
      assert.are.equal('preferred', p.mode)
      assert.are.equal(100, p.weight)
      assert.truthy(p.reason:find('onMiss "empty"', 1, true), p.reason)
    end
    assert.truthy(place({ cache{ attributes = { onMiss = 'empty' } } }).kernels.reason
                    :find('ready on 2 of 3 nodes', 1, true))
    assert.are.equal('required', place({ cache{ attributes = { onMiss = 'fail' } } }).kernels.mode)
    assert.are.equal('required', place({ cache{ attributes = 'junk' } }).kernels.mode)
  end)

  it('requires Ready nodes for an image volume, and prefers them when there are none', function()
    local r = place({ cache{ mount = 'image' } }).kernels
    assert.are.equal('required', r.mode)
    local p = place({ cache{ mount = 'image', readyNodes = 0 } }).kernels
    assert.are.equal('preferred', p.mode)
    assert.are.equal(100, p.weight)
    assert.truthy(p.reason:find('kubelet pulls the image', 1, true), p.reason)
  end)

  it('decides each volume of a pod on its own', function()
    local ps = place({ cache{ volume = 'a' },
                       cache{ volume = 'b', mount = 'image', kind = 'ClusterGKMCache',
                              namespace = nil, readyNodes = 0 } })
    assert.are.equal('required', ps.a.mode)
    assert.are.equal('preferred', ps.b.mode)
  end)

  it('handles malformed input without crashing', function()
    local r = assert(e:call('placement', {}))
    assert.are.same({}, r.placements)
    r = assert(e:call('placement', { caches = { 'junk', 7, { volume = 3 },
                                                { volume = 'v', known = true, readyNodes = 'many' } } }))
    assert.are.equal('required', r.placements.v.mode)
    assert.truthy(r.placements.v.reason:find('ready on 0 of 0', 1, true), r.placements.v.reason)
  end)

  it('a policy returning nonsense is refused by the validator, not obeyed', function()
    local function with(src)
      return assert(gkmspec.engine{ dir = root .. '/policies', files = { ['placement.lua'] = src } })
    end
    local cases = {
      { 'return { evaluate = function() return { placements = { v = { mode = "always" } } } end }',
        'mode' },
      { 'return { evaluate = function() return { placements = { v = { mode = "preferred" } } } end }',
        'weight' },
      { 'return { evaluate = function() return { placements = { v = { mode = "preferred", weight = 500 } } } end }',
        'weight' },
      { 'return { evaluate = function() return { placements = { v = { mode = "none", reason = 5 } } } end }',
        'reason' },
      { 'return { evaluate = function() return { mode = "required" } end }', 'placements' },
    }
    for _, c in ipairs(cases) do
      local r, status, msg = with(c[1]):call('placement', { caches = { cache{ volume = 'v' } } })
      assert.is_nil(r)
      assert.are.equal('bad return value', status)
      assert.truthy(msg:find(c[2], 1, true), msg)
    end
  end)
end)

describe('gkm.cache_label', function()
  local probe = assert(gkmspec.engine{ dir = root .. '/policies', files = { ['probe.lua'] = [[
local label = require 'gkm.cache_label'
local M = {}
function M.key(i)
  local k, err = label.key(i.name, i.namespace)
  return { key = k, err = err, value = label.VALUE }
end
return M
]] } })

  it('gives the key of the scheme and the value ready', function()
    local r = probe:call_fn('probe', 'key', { name = 'llama', namespace = 'team-a' })
    assert.are.equal('team-a.gkmcache.gkm.io/llama', r.key)
    assert.are.equal('ready', r.value)
    r = probe:call_fn('probe', 'key', { name = 'shared' })
    assert.are.equal('clustergkmcache.gkm.io/shared', r.key)
    r = probe:call_fn('probe', 'key', {
      name = 'llama-3-70b-instruct-triton-kernels-for-h100-sxm-and-a100-80gb-pcie' })
    assert.are.equal('clustergkmcache.gkm.io/llama-3-70b-instruct-triton-kernels-for-h100-s-7f9fbf887efcab4e',
                     r.key)
  end)

  it('answers nil and a message for a name no cluster stores', function()
    local r = probe:call_fn('probe', 'key', { name = 'Not_A_Name', namespace = 'team-a' })
    assert.is_nil(r.key)
    assert.truthy(r.err:find('team-a/Not_A_Name', 1, true), r.err)
  end)
end)
