-- Compatibility policy: which GPUs of a node can run a kernel cache.
--
-- The agent calls evaluate(input) for every cache on every node, before it
-- pulls anything; only caches with at least one compatible GPU are pulled,
-- and the verdicts become the cache's compatibleGPUs / incompatibleGPUs in
-- node status. `gkm policy eval policies compat input.json` runs it by hand
-- (spec/fixtures/compat/ has inputs to start from).
--
-- Input (plain tables):
--   cache = {
--     name    = "default/llama-cache",          -- for messages only
--     targets = { TARGET, ... },                -- what the cache was built for:
--   }                                           -- the cache.triton.image/summary (or
--                                               -- cache.vllm.image/summary) label, else
--                                               -- the manifest or kernel JSON in the cache
--   TARGET = { backend = "cuda" | "hip",
--              arch = 75 | "75" | "sm_75" | "sm_90a" | "gfx90a" | "gfx90a:xnack-",
--              warp_size = 32 | 64,
--              ptx_version = 84,                -- optional: PTX ISA 8.4 (Triton's encoding)
--              cuda_version = "12.9" }          -- optional: CUDA the cache was built with
--   gpus = { GPU, ... }                         -- the "gpus" list of `gkm gpus -o json`
--   GPU = { index = 0, backend = "cuda" | "hip", arch = "sm_90" | "gfx942",
--           computeCapability = "9.0", warpSize = 32, features = "sramecc+:xnack-",
--           driverVersion = "550.54.15", cudaDriverVersion = "12.4", name = "..." }
--
-- Output: one verdict per input GPU, in input order:
--   { gpus = { { index = 0, compatible = true,  reason = "Compatible", message = "..." },
--              { index = 1, compatible = false, reason = "ArchitectureMismatch",
--                message = "..." } } }
-- reason is a CamelCase word (C checks: core/lua/hook_compat.c), message says why
-- for a human and does not depend on the GPU's index, so that identical GPUs
-- group into one id set. Reasons:
--   Compatible            at least one target of the cache runs on the GPU
--   UnknownTarget         the cache has no usable target metadata (none, wrong
--                         types, missing backend or arch, too many targets)
--   UnknownGPU            the inventory entry lacks backend or arch
--   BackendMismatch       cuda cache on an AMD GPU, or the other way round
--   ArchitectureMismatch  built for another SM / gfx target
--   FeatureMismatch       ROCm target feature (xnack, sramecc) set the other way
--   WarpSizeMismatch      built for another wavefront size (wave64 vs wave32)
--   PtxTooNew             the cache's PTX ISA needs a newer driver than the GPU has
--   DriverTooOld          the CUDA version the cache was built with needs a newer driver
--   UnknownDriver         the cache needs a driver check, and the GPU's driver
--                         version is missing or unreadable
-- When no target runs, the reason is that of the target that came closest
-- (matched backend, then arch, then warp size, then the driver).
--
-- Editing: the tables below are data; change them, run
-- `gkm policy check DIR` and `gkm policy eval DIR compat input.json`, then put
-- the file in the gkm-policies ConfigMap. See the README, "Compatibility policy".
local M = {}

-- How many targets of a cache must run on a GPU for it to count as compatible:
-- "any" (a Triton cache holds kernels for several GPUs; the runtime uses the
-- ones built for its GPU) or "all".
M.match = "any"

-- Backend names as caches and inventories spell them, mapped to the two backends.
M.backend_aliases = { cuda = "cuda", nvidia = "cuda", hip = "hip", rocm = "hip", amd = "hip" }

-- Warp (wavefront) size of GPUs whose inventory entry does not say.
M.default_warp_size = { cuda = 32, hip = 64 }

-- Caches with more targets than this get UnknownTarget instead of being read.
M.max_targets = 4096

M.cuda = {
  -- How a cache's SM target must relate to the GPU's compute capability:
  --   "exact"  the same capability (Triton looks kernels up by the GPU's own
  --            capability, so a sm_80 kernel is never used on an 8.6 GPU)
  --   "binary" CUDA binary compatibility: same major, GPU minor >= target minor
  -- Arch-specific targets (sm_90a) always need the exact capability; family
  -- targets (sm_100f) run on the same major with a minor >= theirs.
  arch_match = "exact",

  -- CUDA release that introduced each PTX ISA version (PTX ISA release notes).
  -- A cache whose PTX ISA is not listed here gets PtxTooNew: add the row.
  ptx_isa_cuda = {
    ["6.3"] = "10.0", ["6.4"] = "10.1", ["6.5"] = "10.2",
    ["7.0"] = "11.0", ["7.1"] = "11.1", ["7.2"] = "11.2", ["7.3"] = "11.3",
    ["7.4"] = "11.4", ["7.5"] = "11.5", ["7.6"] = "11.6", ["7.7"] = "11.7",
    ["7.8"] = "11.8",
    ["8.0"] = "12.0", ["8.1"] = "12.1", ["8.2"] = "12.2", ["8.3"] = "12.3",
    ["8.4"] = "12.4", ["8.5"] = "12.5", ["8.6"] = "12.7", ["8.7"] = "12.8",
    ["8.8"] = "12.9",
    ["9.0"] = "13.0",
  },

  -- Oldest Linux driver of each CUDA release (CUDA toolkit release notes,
  -- "toolkit driver version"). Used to say which driver a cache needs, and to
  -- tell the CUDA version of a GPU whose inventory lacks cudaDriverVersion.
  -- Keep it sorted by CUDA version.
  driver_min = {
    { cuda = "10.0", driver = "410.48" },
    { cuda = "10.1", driver = "418.39" },
    { cuda = "10.2", driver = "440.33" },
    { cuda = "11.0", driver = "450.51.05" },
    { cuda = "11.1", driver = "455.23" },
    { cuda = "11.2", driver = "460.27.03" },
    { cuda = "11.3", driver = "465.19.01" },
    { cuda = "11.4", driver = "470.42.01" },
    { cuda = "11.5", driver = "495.29.05" },
    { cuda = "11.6", driver = "510.39.01" },
    { cuda = "11.7", driver = "515.43.04" },
    { cuda = "11.8", driver = "520.61.05" },
    { cuda = "12.0", driver = "525.60.13" },
    { cuda = "12.1", driver = "530.30.02" },
    { cuda = "12.2", driver = "535.54.03" },
    { cuda = "12.3", driver = "545.23.06" },
    { cuda = "12.4", driver = "550.54.14" },
    { cuda = "12.5", driver = "555.42.02" },
    { cuda = "12.6", driver = "560.28.03" },
    { cuda = "12.8", driver = "570.26" },
    { cuda = "12.9", driver = "575.51.03" },
    { cuda = "13.0", driver = "580.65.06" },
  },

  -- CUDA minor version compatibility: when true, a cache built with CUDA
  -- 12.x runs on any driver of the same major release (the first row of that
  -- major above, e.g. 525.60.13 for 12.x), as CUDA applications do. PTX still
  -- needs the driver of its ISA: the driver JIT-compiles it.
  minor_version_compatibility = false,
}

M.rocm = {
  -- Target feature settings a GPU runs with when its inventory does not say
  -- (XNACK is off unless HSA_XNACK=1; MI200/MI300 run with ECC, sramecc+).
  -- A target feature the GPU's setting is unknown for is not held against it.
  default_features = {
    gfx908 = { xnack = "-" },
    gfx90a = { xnack = "-", sramecc = "+" },
    gfx940 = { xnack = "-", sramecc = "+" },
    gfx941 = { xnack = "-", sramecc = "+" },
    gfx942 = { xnack = "-", sramecc = "+" },
    gfx950 = { xnack = "-", sramecc = "+" },
  },

  -- Generic targets (LLVM code object v6) and the processors they run on.
  generic = {
    ["gfx9-generic"] = { "gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c" },
    ["gfx9-4-generic"] = { "gfx940", "gfx941", "gfx942", "gfx950" },
    ["gfx10-1-generic"] = { "gfx1010", "gfx1011", "gfx1012", "gfx1013" },
    ["gfx10-3-generic"] = { "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034",
                            "gfx1035", "gfx1036" },
    ["gfx11-generic"] = { "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150",
                          "gfx1151", "gfx1152", "gfx1153" },
    ["gfx12-generic"] = { "gfx1200", "gfx1201" },
  },
}

-- ---------------------------------------------------------------------------
-- Rules. Everything below reads the tables above.

-- How far a target got before it failed: the closest target's reason is the one reported.
-- Messages are written only for that target (the rules run for every pair).
local RANK = {
  UnknownTarget = 0, BackendMismatch = 1, ArchitectureMismatch = 2, FeatureMismatch = 3,
  WarpSizeMismatch = 4, UnknownDriver = 5, PtxTooNew = 5, DriverTooOld = 5,
}

-- Untrusted text in messages: short and printable.
local function show(v)
  local s = tostring(v)
  s = s:gsub("[^%w%.%-_:+/ ]", "?")
  if #s > 40 then
    s = s:sub(1, 37) .. "..."
  end
  return s
end

local function is_int(v)
  return math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v))
end

-- "550.54.15" -> { 550, 54, 15 }; nil if it is not dotted numbers.
local function version(s)
  if type(s) == "number" then
    s = tostring(s)
  end
  if type(s) ~= "string" or #s > 32 or not s:match("^%d+[%.%d]*$") then
    return nil
  end
  local parts = {}
  for n in s:gmatch("%d+") do
    parts[#parts + 1] = tonumber(n)
  end
  return parts
end

local function version_cmp(a, b)
  for i = 1, math.max(#a, #b) do
    local x, y = a[i] or 0, b[i] or 0
    if x ~= y then
      return x < y and -1 or 1
    end
  end
  return 0
end

-- M.cuda.driver_min with its versions parsed, rebuilt when the table changes.
local parsed_rows, parsed_from
local function driver_rows()
  if parsed_from ~= M.cuda.driver_min then
    parsed_rows = {}
    for _, row in ipairs(M.cuda.driver_min) do
      local c, d = version(row.cuda), version(row.driver)
      if c and d then
        parsed_rows[#parsed_rows + 1] = { cuda = c, driver = d, text = row.driver }
      end
    end
    parsed_from = M.cuda.driver_min
  end
  return parsed_rows
end

-- Oldest driver of the first CUDA release at or after cuda (nil if none listed).
local function driver_for(cuda)
  for _, row in ipairs(driver_rows()) do
    if version_cmp(row.cuda, cuda) >= 0 then
      return row.text
    end
  end
  return nil
end

-- Newest CUDA release whose oldest driver is at or below driver.
local function cuda_of_driver(driver)
  local best
  for _, row in ipairs(driver_rows()) do
    if version_cmp(row.driver, driver) <= 0 then
      best = row.cuda
    end
  end
  return best
end

local function vstr(v)
  return table.concat(v, ".")
end

-- A CUDA SM target: 75 | "75" | "sm_75" | "compute_75" | "sm_90a" | "sm_100f"
-- -> { cc = 75, suffix = "" | "a" | "f" }.
local function cuda_arch(a)
  if is_int(a) then
    a = string.format("%d", a)
  end
  if type(a) ~= "string" or #a > 16 then
    return nil
  end
  local digits, suffix = a:gsub("^sm_?", ""):gsub("^compute_", ""):match("^(%d%d%d?)([af]?)$")
  if not digits then
    return nil
  end
  return { cc = tonumber(digits), suffix = suffix }
end

-- A ROCm target ID "gfx90a:sramecc+:xnack-" -> { base = "gfx90a", features = { ... } }.
local function parse_features(s, into)
  if s == nil or s == "" then
    return into
  end
  if type(s) ~= "string" or #s > 64 then
    return nil
  end
  for tok in s:gmatch("[^:]+") do
    local name, setting = tok:match("^([%w]+)([%+%-])$")
    if not name then
      return nil
    end
    into[name] = setting
  end
  return into
end

local function gfx_arch(a)
  if type(a) ~= "string" or #a > 64 then
    return nil
  end
  local base, rest = a:match("^(gfx[%w%-]+)(.*)$")
  if not base then
    return nil
  end
  local features = parse_features((rest:gsub("^:", "")), {})
  if not features then
    return nil
  end
  return { base = base, features = features }
end

local function ptx_isa(v)
  if is_int(v) and v >= 10 and v < 1000 then
    return string.format("%d.%d", v // 10, v % 10)
  end
  if type(v) == "string" and v:match("^%d+%.%d$") then
    return v
  end
  if type(v) == "string" and v:match("^%d%d%d?$") then
    local n = tonumber(v)
    return string.format("%d.%d", n // 10, n % 10)
  end
  return nil
end

-- A cache target, checked and normalised once; nil, why if it is unusable.
local function normalise_target(t)
  if type(t) ~= "table" then
    return nil, "a target is not a table"
  end
  if type(t.backend) ~= "string" then
    return nil, "a target has no backend"
  end
  local backend = M.backend_aliases[t.backend:lower()]
  local n = { backend = backend, raw_backend = t.backend }
  if t.arch == nil then
    return nil, string.format("a %s target has no arch", show(t.backend))
  end
  if backend == "cuda" then
    n.sm = cuda_arch(t.arch)
    if not n.sm then
      return nil, string.format("cuda target arch %s is not an SM version", show(t.arch))
    end
    n.label = string.format("sm_%d%s", n.sm.cc, n.sm.suffix)
  elseif backend == "hip" then
    n.gfx = gfx_arch(t.arch)
    if not n.gfx then
      return nil, string.format("hip target arch %s is not a gfx target", show(t.arch))
    end
    n.label = show(t.arch)
  else
    n.label = show(t.arch)
  end
  if t.warp_size ~= nil then
    if not is_int(t.warp_size) or t.warp_size <= 0 or t.warp_size > 1024 then
      return nil, string.format("target warp_size %s is not a positive integer",
        show(t.warp_size))
    end
    n.warp = math.tointeger(t.warp_size)
  end
  if t.ptx_version ~= nil then
    n.ptx = ptx_isa(t.ptx_version)
    if not n.ptx then
      return nil, string.format("target ptx_version %s is not a PTX ISA version",
        show(t.ptx_version))
    end
  end
  if t.cuda_version ~= nil then
    n.cuda = version(t.cuda_version)
    if not n.cuda then
      return nil, string.format("target cuda_version %s is not a version", show(t.cuda_version))
    end
  end
  return n
end

-- A GPU inventory entry, normalised once; nil, why if it is unusable.
local function normalise_gpu(g)
  if type(g) ~= "table" or type(g.backend) ~= "string" or type(g.arch) ~= "string" then
    return nil, "the GPU inventory entry lacks backend or arch"
  end
  local backend = M.backend_aliases[g.backend:lower()]
  local n = { backend = backend, name = show(g.name or g.arch), arch = show(g.arch) }
  if backend == "cuda" then
    local maj, min
    if type(g.computeCapability) == "string" then
      maj, min = g.computeCapability:match("^(%d+)%.(%d)$")
    end
    local sm = cuda_arch(g.arch)
    n.cc = maj and tonumber(maj) * 10 + tonumber(min) or (sm and sm.cc)
    if not n.cc then
      return nil, string.format("GPU arch %s is not an SM version", n.arch)
    end
    n.driver = version(g.driverVersion)
    n.cuda = version(g.cudaDriverVersion) or (n.driver and cuda_of_driver(n.driver))
  elseif backend == "hip" then
    local gfx = gfx_arch(g.arch)
    if not gfx then
      return nil, string.format("GPU arch %s is not a gfx target", n.arch)
    end
    n.gfx = gfx.base
    local defaults = M.rocm.default_features[gfx.base] or {}
    local features = {}
    for k, v in pairs(defaults) do
      features[k] = v
    end
    for k, v in pairs(gfx.features) do
      features[k] = v
    end
    n.features = parse_features(g.features, features) or features
  else
    return nil, string.format("GPU backend %s is not cuda or hip", show(g.backend))
  end
  n.warp = is_int(g.warpSize) and math.tointeger(g.warpSize) or M.default_warp_size[backend]
  return n
end

local function cuda_arch_ok(sm, gpu_cc)
  if sm.suffix == "a" then
    return sm.cc == gpu_cc
  end
  local same_major = sm.cc // 10 == gpu_cc // 10
  if sm.suffix == "f" or M.cuda.arch_match == "binary" then
    return same_major and gpu_cc % 10 >= sm.cc % 10
  end
  return sm.cc == gpu_cc
end

local function gfx_arch_ok(gfx, gpu_base)
  if gfx.base == gpu_base then
    return true
  end
  for _, p in ipairs(M.rocm.generic[gfx.base] or {}) do
    if p == gpu_base then
      return true
    end
  end
  return false
end

-- The CUDA version target t needs: version, why ("PTX ISA 8.4"), and the
-- reason to give when the driver is older; nil when it needs none. A PTX ISA
-- missing from the table needs an unknown, newer CUDA: need is false.
local function cuda_needed(t)
  local need, why, reason
  if t.ptx then
    local c = M.cuda.ptx_isa_cuda[t.ptx]
    need, why, reason = c and version(c) or false, "PTX ISA " .. t.ptx, "PtxTooNew"
    if not need then
      return false, why, reason
    end
  end
  if t.cuda then
    local c = t.cuda
    if M.cuda.minor_version_compatibility then
      c = { c[1], 0 }
    end
    if not need or version_cmp(c, need) > 0 then
      need, why, reason = c, "CUDA " .. vstr(t.cuda), "DriverTooOld"
    end
  end
  return need, why, reason
end

local function check_driver(t, g)
  local need, _, reason = cuda_needed(t)
  if need == nil then
    return nil
  end
  if need == false then
    return reason
  end
  if not g.cuda then
    return "UnknownDriver"
  end
  if version_cmp(g.cuda, need) >= 0 then
    return nil
  end
  return reason
end

-- nil if target t runs on GPU g, else the reason (cheap: no strings built).
local function check(t, g)
  if t.backend ~= g.backend then
    return "BackendMismatch"
  end
  if t.backend == "cuda" then
    if not cuda_arch_ok(t.sm, g.cc) then
      return "ArchitectureMismatch"
    end
  else
    if not gfx_arch_ok(t.gfx, g.gfx) then
      return "ArchitectureMismatch"
    end
    for name, setting in pairs(t.gfx.features) do
      local have = g.features[name]
      if have and have ~= setting then
        return "FeatureMismatch"
      end
    end
  end
  if t.warp and g.warp and t.warp ~= g.warp then
    return "WarpSizeMismatch"
  end
  if t.backend == "cuda" then
    return check_driver(t, g)
  end
  return nil
end

-- The message for the reason check() gave target t on GPU g.
local function explain(t, g, reason)
  if reason == "BackendMismatch" then
    return string.format("the cache targets %s; the GPU runs %s", show(t.raw_backend), g.backend)
  elseif reason == "ArchitectureMismatch" then
    return string.format("the cache targets %s; the GPU is %s (%s)", t.label,
      t.backend == "cuda" and string.format("sm_%d", g.cc) or g.gfx, g.name)
  elseif reason == "FeatureMismatch" then
    for name, setting in pairs(t.gfx.features) do
      local have = g.features[name]
      if have and have ~= setting then
        return string.format("the cache targets %s (%s%s); the GPU runs with %s%s", t.label, name,
          setting, name, have)
      end
    end
  elseif reason == "WarpSizeMismatch" then
    return string.format("the cache targets warp size %d; the GPU (%s %s) runs warp size %d",
      t.warp, g.name, g.arch, g.warp)
  end
  local need, why = cuda_needed(t)
  if need == false then
    return string.format("the cache holds %s, which the policy's ptx_isa_cuda table does not list",
      why)
  end
  if reason == "UnknownDriver" then
    return string.format("the cache needs CUDA %s (%s) and the GPU's driver version is unknown",
      vstr(need), why)
  end
  local min = driver_for(need)
  return string.format("the cache needs CUDA %s (%s, driver %s); the GPU's driver %s runs CUDA %s",
    vstr(need), why, min and (">= " .. min) or "newer than the policy lists",
    g.driver and vstr(g.driver) or "?", vstr(g.cuda))
end

local function verdict(index, ok, reason, message)
  if #message > 1000 then
    message = message:sub(1, 997) .. "..."
  end
  return { index = index, compatible = ok, reason = reason, message = message }
end

-- Normalised GPUs by what the rules read of them: a node asks about the same
-- GPUs for every cache. Bounded; starts over when full.
local gpu_memo, gpu_memo_size = {}, 0
local function memo_gpu(gpu)
  if type(gpu) ~= "table" then
    return normalise_gpu(gpu)
  end
  local parts = { gpu.backend, gpu.arch, gpu.computeCapability, gpu.warpSize, gpu.features,
    gpu.driverVersion, gpu.cudaDriverVersion, gpu.name }
  for i = 1, 8 do
    local v = parts[i]
    local tv = type(v)
    if tv == "nil" then
      parts[i] = ""
    elseif tv ~= "string" and tv ~= "number" then
      return normalise_gpu(gpu)
    end
  end
  local key = table.concat(parts, "\0")
  local hit = gpu_memo[key]
  if hit then
    return hit[1], hit[2]
  end
  local g, why = normalise_gpu(gpu)
  if gpu_memo_size >= 256 then
    gpu_memo, gpu_memo_size = {}, 0
  end
  gpu_memo[key], gpu_memo_size = { g, why }, gpu_memo_size + 1
  return g, why
end

local function evaluate_gpu(index, gpu, targets)
  local g, why = memo_gpu(gpu)
  if not g then
    return verdict(index, false, "UnknownGPU", why)
  end
  local matched, best, best_t, first_bad, first_t = 0, nil, nil, nil, nil
  for _, t in ipairs(targets) do
    local reason = check(t, g)
    if reason == nil then
      matched = matched + 1
      if M.match ~= "all" then
        break
      end
    else
      if not first_bad then
        first_bad, first_t = reason, t
      end
      if not best or (RANK[reason] or 0) > (RANK[best] or 0) then
        best, best_t = reason, t
      end
    end
  end
  if M.match == "all" and first_bad then
    return verdict(index, false, first_bad, explain(first_t, g, first_bad))
  end
  if matched > 0 then
    return verdict(index, true, "Compatible", string.format(
      "the cache has kernels for this GPU (%s %s)", g.name, g.arch))
  end
  return verdict(index, false, best, explain(best_t, g, best))
end

function M.evaluate(input)
  if type(input) ~= "table" or type(input.gpus) ~= "table" then
    error("compat: input.gpus must be the GPU list of the node inventory")
  end
  local cache = type(input.cache) == "table" and input.cache or {}
  local name = cache.name and show(cache.name) or "the cache"

  -- The cache's targets, once; any unusable one makes the metadata unusable.
  local targets, problem = {}, nil
  local raw = cache.targets
  if type(raw) ~= "table" or #raw == 0 then
    problem = string.format("%s carries no target metadata (no summary label, manifest or "
      .. "kernel JSON with a target)", name)
  elseif #raw > M.max_targets then
    problem = string.format("%s lists %d targets, more than the %d the policy reads", name,
      #raw, M.max_targets)
  else
    for i, t in ipairs(raw) do
      local n, why = normalise_target(t)
      if not n then
        problem = string.format("%s: target %d: %s", name, i, why)
        break
      end
      targets[#targets + 1] = n
    end
  end

  local out = {}
  for i, gpu in ipairs(input.gpus) do
    local index = type(gpu) == "table" and is_int(gpu.index) and gpu.index >= 0
      and math.tointeger(gpu.index) or i - 1
    if problem then
      out[#out + 1] = verdict(index, false, "UnknownTarget", problem)
    else
      out[#out + 1] = evaluate_gpu(index, gpu, targets)
    end
  end
  return { gpus = out }
end

return M
