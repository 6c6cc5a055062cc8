-- policies/compat.lua through the real engine (gkmspec): the real caches'
-- metadata (spec/fixtures/compat/caches, copied from the shared fixtures)
-- against the node inventories gkm gpus produced (spec/fixtures/gpu/inventory).
local gkmspec = require 'gkmspec'
local json = require 'dkjson'

local root = os.getenv('GKM_ROOT') or '.'
local policies = root .. '/policies'
local e = assert(gkmspec.engine{ dir = policies })

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('a')
  f:close()
  return s
end

local function decode(path)
  local v, _, err = json.decode(read(path))
  assert(v, err)
  return v
end

local function inventory(name)
  return decode(root .. '/spec/fixtures/gpu/inventory/' .. name .. '.json').gpus
end

-- The targets of a real cache, read the way the agent reads them when the
-- image has no summary label: each kernel's "target" and "ptx_version", and a
-- vLLM binary cache's device and CUDA version, without duplicates.
local function cache_targets(name)
  local dir = root .. '/spec/fixtures/compat/caches/' .. name
  local p = assert(io.popen("find '" .. dir .. "' -name '*.json' ! -name '__grp__*' | sort"))
  local targets, seen = {}, {}
  for path in p:lines() do
    local j = decode(path)
    local t
    if type(j.target) == 'table' then
      t = { backend = j.target.backend, arch = j.target.arch, warp_size = j.target.warp_size,
            ptx_version = j.ptx_version }
    elseif path:match('cache_key_factors%.json$') then
      t = { backend = j.env.VLLM_TARGET_DEVICE, cuda_version = j.env.VLLM_MAIN_CUDA_VERSION }
    end
    if t then
      local key = json.encode(t, { keyorder = { 'backend', 'arch', 'warp_size', 'ptx_version',
                                               'cuda_version' } })
      if not seen[key] then
        seen[key] = true
        targets[#targets + 1] = t
      end
    end
  end
  p:close()
  return targets
end

local function evaluate(targets, gpus, engine)
  local r, status, msg = (engine or e):call('compat', { cache = { name = 'default/c', targets = targets },
                                                       gpus = gpus })
  assert(r, tostring(status) .. ': ' .. tostring(msg))
  return r.gpus
end

-- One GPU's verdict for one target list.
local function one(targets, gpu, engine)
  return evaluate(targets, { gpu }, engine)[1]
end

local T4 = inventory('t4')[1]
local A100 = inventory('a100')[1]
local H100 = inventory('h100')[1]
local MI210 = inventory('mi210')[1]
local MI300X = inventory('mi300x')[1]

local function with(gpu, changes)
  local g = {}
  for k, v in pairs(gpu) do
    g[k] = v
  end
  for k, v in pairs(changes) do
    g[k] = v ~= json.null and v or nil
  end
  return g
end

-- An engine whose compat.lua is the default one with an edit applied, as an
-- operator would make it in the ConfigMap.
local function edited(from, to)
  local src = read(policies .. '/compat.lua')
  local s, n = src:gsub(from, to, 1)
  assert(n == 1, 'edit did not apply: ' .. from)
  return assert(gkmspec.engine{ files = { ['compat.lua'] = s } })
end

describe('compat policy on the real caches', function()
  local caches = {
    ['triton-cuda-sm75'] = { t4 = 'Compatible', a100 = 'ArchitectureMismatch',
      h100 = 'ArchitectureMismatch', mi210 = 'BackendMismatch', mi300x = 'BackendMismatch' },
    ['triton-hip-gfx90a'] = { t4 = 'BackendMismatch', a100 = 'BackendMismatch',
      h100 = 'BackendMismatch', mi210 = 'Compatible', mi300x = 'ArchitectureMismatch' },
    ['vllm-hip-gfx90a'] = { t4 = 'BackendMismatch', a100 = 'BackendMismatch',
      h100 = 'BackendMismatch', mi210 = 'Compatible', mi300x = 'ArchitectureMismatch' },
    -- a vLLM binary cache records its device and CUDA version but no arch
    ['vllm-binary-llama'] = { t4 = 'UnknownTarget', a100 = 'UnknownTarget',
      h100 = 'UnknownTarget', mi210 = 'UnknownTarget', mi300x = 'UnknownTarget' },
  }
  local names = {}
  for name in pairs(caches) do
    names[#names + 1] = name
  end
  table.sort(names)
  for _, cache in ipairs(names) do
    for _, node in ipairs({ 't4', 'a100', 'h100', 'mi210', 'mi300x' }) do
      local want = caches[cache][node]
      it(cache .. ' on ' .. node .. ': ' .. want, function()
        local gpus = inventory(node)
        local verdicts = evaluate(cache_targets(cache), gpus)
        assert.are.equal(#gpus, #verdicts)
        for i, v in ipairs(verdicts) do
          assert.are.equal(gpus[i].index, v.index)
          assert.are.equal(want, v.reason, v.message)
          assert.are.equal(want == 'Compatible', v.compatible)
          assert.is_true(type(v.message) == 'string' and #v.message > 0 and #v.message <= 1024)
        end
      end)
    end
  end

  it('reads one target from the five kernels of the vLLM cache', function()
    assert.are.same({ { backend = 'hip', arch = 'gfx90a', warp_size = 64 } },
      cache_targets('vllm-hip-gfx90a'))
  end)

  it('says why, in words, without the GPU index', function()
    local v = one(cache_targets('triton-cuda-sm75'), H100)
    assert.are.equal('the cache targets sm_75; the GPU is sm_90 (NVIDIA H100 80GB HBM3)', v.message)
    v = one(cache_targets('triton-hip-gfx90a'), MI300X)
    assert.are.equal('the cache targets gfx90a; the GPU is gfx942 (AMD Instinct MI300X)', v.message)
    v = one(cache_targets('vllm-binary-llama'), H100)
    assert.truthy(v.message:find('target 1: a cuda target has no arch', 1, true), v.message)
  end)

  it('keeps the verdicts of a mixed node apart per GPU', function()
    local gpus = inventory('mixed')
    local v = evaluate(cache_targets('triton-hip-gfx90a'), gpus)
    assert.are.same({ 0, 1, 2 }, { v[1].index, v[2].index, v[3].index })
    assert.are.same({ false, true, true }, { v[1].compatible, v[2].compatible, v[3].compatible })
    assert.are.equal('BackendMismatch', v[1].reason)
  end)
end)

describe('compat policy: CUDA arch', function()
  for _, arch in ipairs({ 75, 75.0, '75', 'sm_75', 'sm75', 'compute_75' }) do
    it('normalises ' .. json.encode(arch) .. ' to sm_75', function()
      assert.are.equal('Compatible', one({ { backend = 'cuda', arch = arch, warp_size = 32 } }, T4).reason)
      assert.are.equal('ArchitectureMismatch',
        one({ { backend = 'cuda', arch = arch, warp_size = 32 } }, A100).reason)
    end)
  end

  it('runs arch-specific sm_90a only on compute capability 9.0', function()
    local t = { { backend = 'cuda', arch = 'sm_90a', warp_size = 32 } }
    assert.are.equal('Compatible', one(t, H100).reason)
    assert.are.equal('ArchitectureMismatch', one(t, with(H100, { arch = 'sm_89', computeCapability = '8.9' })).reason)
    assert.are.equal('ArchitectureMismatch', one({ { backend = 'cuda', arch = '90a' } }, A100).reason)
  end)

  it('runs family-specific sm_100f on 10.x GPUs of at least its minor', function()
    local t = { { backend = 'cuda', arch = 'sm_100f' } }
    assert.are.equal('Compatible', one(t, with(H100, { arch = 'sm_103', computeCapability = '10.3' })).reason)
    assert.are.equal('ArchitectureMismatch', one(t, with(H100, { arch = 'sm_120', computeCapability = '12.0' })).reason)
  end)

  it('matches SM versions exactly by default, by binary compatibility when edited', function()
    local a10 = with(A100, { name = 'NVIDIA A10', arch = 'sm_86', computeCapability = '8.6' })
    local t = { { backend = 'cuda', arch = 80, warp_size = 32 } }
    assert.are.equal('ArchitectureMismatch', one(t, a10).reason)
    local binary = edited('arch_match = "exact"', 'arch_match = "binary"')
    assert.are.equal('Compatible', one(t, a10, binary).reason)
    assert.are.equal('ArchitectureMismatch', one({ { backend = 'cuda', arch = 86 } }, A100, binary).reason)
    assert.are.equal('ArchitectureMismatch', one(t, H100, binary).reason)
  end)
end)

describe('compat policy: warp size and backend', function()
  it('refuses a target built for another warp size', function()
    local v = one({ { backend = 'cuda', arch = 90, warp_size = 64 } }, H100)
    assert.are.equal('WarpSizeMismatch', v.reason)
    local rdna = { index = 0, backend = 'hip', arch = 'gfx1100', warpSize = 32, name = 'AMD Radeon PRO W7900' }
    v = one({ { backend = 'hip', arch = 'gfx1100', warp_size = 64 } }, rdna)
    assert.are.equal('WarpSizeMismatch', v.reason)
    assert.truthy(v.message:find('warp size 64', 1, true))
  end)

  it('accepts the backend spellings of other tools', function()
    assert.are.equal('Compatible', one({ { backend = 'rocm', arch = 'gfx90a', warp_size = 64 } }, MI210).reason)
    assert.are.equal('BackendMismatch', one({ { backend = 'xpu', arch = 'pvc' } }, MI210).reason)
  end)

  it('reports the closest failing target of a multi-target cache', function()
    local t = { { backend = 'hip', arch = 'gfx90a', warp_size = 64 }, { backend = 'cuda', arch = 80, warp_size = 32 } }
    assert.are.equal('ArchitectureMismatch', one(t, H100).reason)
    assert.are.equal('Compatible', one(t, A100).reason)
    assert.are.equal('Compatible', one(t, MI210).reason)
  end)

  it('needs every target to run when the policy says match = "all"', function()
    local t = { { backend = 'cuda', arch = 80 }, { backend = 'cuda', arch = 90 } }
    assert.are.equal('Compatible', one(t, H100).reason)
    local all = edited('M.match = "any"', 'M.match = "all"')
    assert.are.equal('ArchitectureMismatch', one(t, H100, all).reason)
    assert.are.equal('Compatible', one({ t[2] }, H100, all).reason)
  end)
end)

describe('compat policy: PTX ISA and CUDA version against the driver', function()
  it('runs PTX the driver knows', function()
    assert.are.equal('Compatible', one({ { backend = 'cuda', arch = 90, ptx_version = 84 } }, H100).reason)
    assert.are.equal('Compatible', one({ { backend = 'cuda', arch = 90, ptx_version = '8.4' } }, H100).reason)
  end)

  it('refuses PTX newer than the driver with the driver it needs', function()
    local v = one({ { backend = 'cuda', arch = 90, ptx_version = 85 } }, H100)
    assert.are.equal('PtxTooNew', v.reason)
    assert.are.equal("the cache needs CUDA 12.5 (PTX ISA 8.5, driver >= 555.42.02); "
      .. "the GPU's driver 550.54.15 runs CUDA 12.4", v.message)
  end)

  it('refuses a PTX ISA the tables do not list', function()
    local v = one({ { backend = 'cuda', arch = 90, ptx_version = 99 } }, H100)
    assert.are.equal('PtxTooNew', v.reason)
    assert.truthy(v.message:find('does not list', 1, true))
  end)

  it('refuses a cache built with a newer CUDA than the driver runs', function()
    local v = one({ { backend = 'cuda', arch = 80, cuda_version = '12.4' } }, A100)
    assert.are.equal('DriverTooOld', v.reason)
    assert.truthy(v.message:find('driver >= 550.54.14', 1, true), v.message)
    assert.are.equal('Compatible', one({ { backend = 'cuda', arch = 80, cuda_version = '12.2' } }, A100).reason)
  end)

  it('tells the CUDA version from the driver version when the inventory lacks it', function()
    local h = with(H100, { cudaDriverVersion = json.null })
    assert.are.equal('Compatible', one({ { backend = 'cuda', arch = 90, ptx_version = 84 } }, h).reason)
    assert.are.equal('PtxTooNew', one({ { backend = 'cuda', arch = 90, ptx_version = 85 } }, h).reason)
    local v = one({ { backend = 'cuda', arch = 90, ptx_version = 84 } },
      with(h, { driverVersion = json.null }))
    assert.are.equal('UnknownDriver', v.reason)
    -- no driver requirement, no driver check
    assert.are.equal('Compatible',
      one({ { backend = 'cuda', arch = 90 } }, with(h, { driverVersion = json.null })).reason)
  end)

  it('allows a newer driver range once the tables list it (README example)', function()
    local r590 = with(H100, { driverVersion = '590.48.01', cudaDriverVersion = json.null })
    local t = { { backend = 'cuda', arch = 90, ptx_version = 91, cuda_version = '13.1' } }
    assert.are.equal('PtxTooNew', one(t, r590).reason)
    local src = read(policies .. '/compat.lua')
    src = src:gsub('%["9%.0"%] = "13%.0",', '["9.0"] = "13.0", ["9.1"] = "13.1",', 1)
    src = src:gsub('{ cuda = "13%.0", driver = "580%.65%.06" },',
      '{ cuda = "13.0", driver = "580.65.06" },\n    { cuda = "13.1", driver = "590.44.01" },', 1)
    local newer = assert(gkmspec.engine{ files = { ['compat.lua'] = src } })
    assert.are.equal('Compatible', one(t, r590, newer).reason)
    assert.are.equal('PtxTooNew', one(t, with(r590, { driverVersion = '580.95.05' }), newer).reason)
  end)

  it('applies CUDA minor version compatibility when turned on', function()
    local t = { { backend = 'cuda', arch = 90, cuda_version = '12.9' } }
    assert.are.equal('DriverTooOld', one(t, H100).reason)
    local minor = edited('minor_version_compatibility = false', 'minor_version_compatibility = true')
    assert.are.equal('Compatible', one(t, H100, minor).reason)
    assert.are.equal('DriverTooOld',
      one({ { backend = 'cuda', arch = 90, cuda_version = '13.0' } }, H100, minor).reason)
    -- PTX is JIT-compiled by the driver: still needs its ISA's driver
    assert.are.equal('PtxTooNew', one({ { backend = 'cuda', arch = 90, ptx_version = 88 } }, H100, minor).reason)
  end)
end)

describe('compat policy: ROCm targets', function()
  it('honours feature suffixes against the GPU defaults', function()
    assert.are.equal('Compatible',
      one({ { backend = 'hip', arch = 'gfx90a:xnack-', warp_size = 64 } }, MI210).reason)
    assert.are.equal('Compatible', one({ { backend = 'hip', arch = 'gfx90a:sramecc+:xnack-' } }, MI210).reason)
    local v = one({ { backend = 'hip', arch = 'gfx90a:xnack+', warp_size = 64 } }, MI210)
    assert.are.equal('FeatureMismatch', v.reason)
    assert.truthy(v.message:find('xnack+', 1, true) and v.message:find('xnack-', 1, true), v.message)
    assert.are.equal('FeatureMismatch', one({ { backend = 'hip', arch = 'gfx942:sramecc-' } }, MI300X).reason)
  end)

  it('takes the features the inventory reports over the defaults', function()
    local xnack_on = with(MI210, { features = 'xnack+' })
    assert.are.equal('Compatible', one({ { backend = 'hip', arch = 'gfx90a:xnack+' } }, xnack_on).reason)
    assert.are.equal('FeatureMismatch', one({ { backend = 'hip', arch = 'gfx90a:xnack-' } }, xnack_on).reason)
    assert.are.equal('Compatible', one({ { backend = 'hip', arch = 'gfx90a' } }, xnack_on).reason)
  end)

  it('runs generic targets on the processors they cover', function()
    local t = { { backend = 'hip', arch = 'gfx9-4-generic', warp_size = 64 } }
    assert.are.equal('Compatible', one(t, MI300X).reason)
    assert.are.equal('ArchitectureMismatch', one(t, MI210).reason)
  end)
end)

describe('compat policy: malformed metadata', function()
  local function unknown(cache, gpus)
    local r, status, msg = e:call('compat', { cache = cache, gpus = gpus or inventory('mixed') })
    assert(r, tostring(status) .. ': ' .. tostring(msg))
    for _, v in ipairs(r.gpus) do
      assert.is_false(v.compatible)
      assert.are.equal('UnknownTarget', v.reason, v.message)
      assert.is_true(#v.message <= 1024)
    end
    return r.gpus[1].message
  end

  it('never takes a cache without target metadata for compatible', function()
    assert.truthy(unknown(nil):find('carries no target metadata', 1, true))
    unknown({ targets = {} })
    unknown({ targets = 'sm_90' })
    unknown({ targets = { foo = 'bar' } })
  end)

  it('refuses targets with wrong types or missing fields', function()
    assert.truthy(unknown({ targets = { 'cuda' } }):find('not a table', 1, true))
    assert.truthy(unknown({ targets = { { arch = 90 } } }):find('no backend', 1, true))
    unknown({ targets = { { backend = 5, arch = 90 } } })
    unknown({ targets = { { backend = 'cuda', arch = { 9, 0 } } } })
    unknown({ targets = { { backend = 'cuda', arch = 'ampere' } } })
    unknown({ targets = { { backend = 'hip', arch = 90 } } })
    unknown({ targets = { { backend = 'hip', arch = 'gfx90a:xnack' } } })
    unknown({ targets = { { backend = 'cuda', arch = 90, warp_size = '32' } } })
    unknown({ targets = { { backend = 'cuda', arch = 90, warp_size = -32 } } })
    unknown({ targets = { { backend = 'cuda', arch = 90, ptx_version = true } } })
    unknown({ targets = { { backend = 'cuda', arch = 90, cuda_version = 'twelve' } } })
    -- one bad target spoils the metadata of the whole cache
    unknown({ targets = { { backend = 'cuda', arch = 90 }, { backend = 'cuda' } } })
  end)

  it('keeps messages short whatever the metadata holds', function()
    local msg = unknown({ name = string.rep('n', 5000),
      targets = { { backend = 'cuda', arch = string.rep('9', 100000) } } })
    assert.is_true(#msg < 300, #msg)
  end)

  it('refuses more targets than the policy reads', function()
    local many = {}
    for i = 1, 5000 do
      many[i] = { backend = 'cuda', arch = 90, warp_size = 32 }
    end
    assert.truthy(unknown({ targets = many }):find('5000 targets, more than the 4096', 1, true))
  end)

  it('fails cleanly on arrays too large to hand to the policy', function()
    local huge = {}
    for i = 1, 400000 do
      huge[i] = { backend = 'cuda', arch = 90, warp_size = 32 }
    end
    -- gkmspec converts the table to JSON as the daemons pass it, and that
    -- conversion refuses past a million values; either way, no crash
    local ok, r, status = pcall(e.call, e, 'compat', { cache = { targets = huge }, gpus = { H100 } })
    if not ok then
      assert.truthy(tostring(r):find('more than 1000000 values', 1, true), tostring(r))
    elseif r then
      assert.are.equal('UnknownTarget', r.gpus[1].reason)
    else
      assert.is_string(status)
    end
    -- the engine still answers afterwards
    assert.are.equal('Compatible', one({ { backend = 'cuda', arch = 90 } }, H100).reason)
  end)

  it('answers UnknownGPU for inventory entries it cannot read', function()
    local v = evaluate({ { backend = 'cuda', arch = 90 } },
      { 'junk', { backend = 'cuda' }, { backend = 'tpu', arch = 'v5' }, with(H100, { index = 7 }) })
    assert.are.same({ 'UnknownGPU', 'UnknownGPU', 'UnknownGPU', 'Compatible' },
      { v[1].reason, v[2].reason, v[3].reason, v[4].reason })
    -- entries without an index are known by their position
    assert.are.same({ 0, 1, 2, 7 }, { v[1].index, v[2].index, v[3].index, v[4].index })
  end)

  it('is a policy error, not a verdict, when the input has no GPU list', function()
    local r, status, msg = e:call('compat', { cache = { targets = {} } })
    assert.is_nil(r)
    assert.are.equal('error', status)
    assert.truthy(msg:find('input.gpus', 1, true), msg)
  end)

  it('answers an empty verdict list for a node without GPUs', function()
    local r = assert(e:call('compat', { cache = { targets = { { backend = 'cuda', arch = 90 } } }, gpus = {} }))
    assert.are.equal(0, #r.gpus)
  end)
end)

describe('compat hook validator', function()
  local function broken(body)
    return assert(gkmspec.engine{ files = { ['compat.lua'] =
      'return { evaluate = function(input) ' .. body .. ' end }' } })
  end
  local input = { cache = { targets = {} }, gpus = { H100 } }

  for name, body in pairs({
    ['no gpus list'] = 'return { verdicts = {} }',
    ['a boolean that is a string'] = 'return { gpus = { { index = 0, compatible = "yes" } } }',
    ['a refusal without reason'] = 'return { gpus = { { index = 0, compatible = false, message = "m" } } }',
    ['a reason that is not CamelCase'] =
      'return { gpus = { { index = 0, compatible = false, reason = "no such thing", message = "m" } } }',
    ['a negative index'] = 'return { gpus = { { index = -1, compatible = true } } }',
    ['an index twice'] = 'return { gpus = { { index = 0, compatible = true }, { index = 0, compatible = true } } }',
    ['a message too long'] =
      'return { gpus = { { index = 0, compatible = false, reason = "R", message = string.rep("x", 2000) } } }',
  }) do
    it('refuses ' .. name, function()
      local r, status, msg = broken(body):call('compat', input)
      assert.is_nil(r)
      assert.are.equal('bad return value', status, msg)
    end)
  end

  it('accepts a plain table of verdicts', function()
    local r = assert(broken('return { gpus = { { index = 3, compatible = true } } }'):call('compat', input))
    assert.are.equal(3, r.gpus[1].index)
  end)
end)
