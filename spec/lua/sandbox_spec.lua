-- The sandbox, driven through the real engine (gkmspec).
local H = require 'helper'

local small = { memory = 8 * 1024 * 1024, instructions = 5000000, timeout_ms = 2000 }

describe('sandbox blocks dangerous functions with a clear message', function()
  local cases = {
    { 'os.execute', 'return { r = os.execute("true") }' },
    { 'io.open', 'return { r = io.open("/etc/passwd") }' },
    { 'io.popen', 'local f = io.popen("id") return {}' },
    { 'os.getenv', 'return { r = os.getenv("HOME") }' },
    { 'os.remove', 'os.remove("/tmp/x") return {}' },
    { 'string.dump', 'return { r = string.dump(function() end) }' },
    { 'string.dump', 'return { r = ("x").dump(function() end) }' },
    { 'debug.getinfo', 'return { r = debug.getinfo(1) }' },
    { 'debug.sethook', 'debug.sethook() return {}' },
    { 'dofile', 'dofile("/etc/passwd") return {}' },
    { 'loadfile', 'loadfile("/etc/passwd") return {}' },
    { "collectgarbage('stop')", 'collectgarbage("stop") return {}' },
    { "collectgarbage('collect')", 'collectgarbage() return {}' },
    { 'package.loadlib', 'package.loadlib("libc.so.6", "system") return {}' },
  }
  for _, c in ipairs(cases) do
    it('blocks ' .. c[1], function()
      local r, status, msg = H.run(c[2])
      assert.is_nil(r)
      assert.are.equal('blocked function', status)
      assert.truthy(msg:find(c[1], 1, true), msg)
    end)
  end

  it('blocks a blocked call even when the script catches the error', function()
    local r, status, msg = H.run('local ok = pcall(os.execute, "true") return { ok = ok }')
    assert.is_nil(r)
    assert.are.equal('blocked function', status)
    assert.truthy(msg:find('os.execute', 1, true))
  end)

  it('refuses to load bytecode', function()
    local code = string.dump(function() return 1 end)
    local r, status, msg = H.run('local f = load(input.code) return { r = f and f() }', { code = code })
    assert.is_nil(r)
    assert.are.equal('blocked function', status)
    assert.truthy(msg:find('binary chunk', 1, true), msg)
  end)

  it('loads text chunks inside the sandbox only', function()
    local r = H.run('local f = load("return os.execute") return { t = type(f()) }')
    assert.are.equal('function', r.t) -- the stub, not the real os.execute
    local r2, status = H.run('local f = load("return os.execute(\'true\')") return { r = f() }')
    assert.is_nil(r2)
    assert.are.equal('blocked function', status)
  end)

  it('keeps the allowed libraries working', function()
    local r = H.run([[
      return { s = string.format("%03d", 7), u = ("abc"):upper(), m = math.max(1, 5),
               t = table.concat({ "a", "b" }, ","), l = utf8.len("héllo"), n = tonumber("42"),
               c = collectgarbage("count") > 0, time = type(os.time()) }
    ]])
    assert.are.same({ s = '007', u = 'ABC', m = 5, t = 'a,b', l = 5, n = 42, c = true, time = 'number' }, r)
  end)
end)

describe('sandbox budgets', function()
  it('stops an infinite loop', function()
    local r, status, msg = H.run('while true do end', nil, small)
    assert.is_nil(r)
    assert.are.equal('timeout', status)
    assert.truthy(msg:find('budget', 1, true), msg)
  end)

  it('stops an infinite loop wrapped in pcall', function()
    local r, status = H.run([[
      while true do pcall(function() while true do end end) end
    ]], nil, small)
    assert.is_nil(r)
    assert.are.equal('timeout', status)
  end)

  it('stops a loop that swallows errors with xpcall and an error handler', function()
    local r, status = H.run([[
      local n = 0
      while true do xpcall(function() while true do n = n + 1 end end, function(e) return e end) end
    ]], nil, small)
    assert.is_nil(r)
    assert.are.equal('timeout', status)
  end)

  it('stops a script by wall clock when the instruction budget is large', function()
    local r, status, msg = H.run('while true do end', nil,
      { memory = 8 << 20, instructions = 1e15, timeout_ms = 200 })
    assert.is_nil(r)
    assert.are.equal('timeout', status)
    assert.truthy(msg:find('time budget', 1, true), msg)
  end)

  it('stops a memory bomb without killing the process', function()
    local r, status, msg = H.run([[
      local t = {}
      for i = 1, 1e9 do t[i] = string.rep("x", 1024) .. i end
    ]], nil, small)
    assert.is_nil(r)
    assert.are.equal('out of memory', status)
    assert.truthy(msg:find('memory limit', 1, true), msg)
  end)

  it('stops a memory bomb that catches its own memory errors', function()
    local r, status = H.run([[
      local keep = {}
      for i = 1, 1e9 do pcall(function() keep[#keep + 1] = string.rep("y", 65536) end) end
    ]], nil, small)
    assert.is_nil(r)
    assert.is_true(status == 'out of memory' or status == 'timeout', status)
  end)

  it('answers normally after a run was stopped', function()
    local e = H.probe('if input.loop then while true do end end return { ok = true }', small)
    local _, status = e:call_fn('probe', 'run', { loop = true })
    assert.are.equal('timeout', status)
    assert.are.same({ ok = true }, e:call_fn('probe', 'run', { loop = false }))
  end)
end)

describe('routes around the budget', function()
  it('refuses a __gc finalizer (finalizers run with hooks off, after the budget)', function()
    local r, status, msg = H.run([[
      setmetatable({}, { __gc = function() while true do end end })
      return {}
    ]], nil, small)
    assert.is_nil(r)
    assert.are.equal('blocked function', status)
    assert.truthy(msg:find('__gc', 1, true), msg)
  end)

  it('refuses __gc added to a metatable before it is set, even when caught', function()
    local r, status = H.run([[
      local mt = {}
      mt.__gc = function() while true do end end
      pcall(setmetatable, {}, mt)
      return {}
    ]], nil, small)
    assert.is_nil(r)
    assert.are.equal('blocked function', status)
  end)

  it('keeps other metatables working (__index, __close-free tables)', function()
    local r = H.run([[
      local t = setmetatable({}, { __index = function(_, k) return k .. "!" end })
      return { v = t.x }
    ]])
    assert.are.same({ v = 'x!' }, r)
  end)

  it('answers the next call after a refused finalizer, within the budget', function()
    local e = H.probe([[
      if input.gc then setmetatable({}, { __gc = function() while true do end end }) end
      return { ok = true }
    ]], small)
    local _, status = e:call_fn('probe', 'run', { gc = true })
    assert.are.equal('blocked function', status)
    assert.are.same({ ok = true }, e:call_fn('probe', 'run', { gc = false }))
  end)

  it('refuses a backtracking pattern over a long user-written string before it runs', function()
    local long = string.rep('a', 100000)
    for _, call in ipairs({ 'input.s:find("a.-.-b")', 'string.match(input.s, "(.-)x(.-)y")',
                            'input.s:gsub("a*a*b", "")', 'for _ in input.s:gmatch("a.-b") do end' }) do
      local r, status, msg = H.run(call .. ' return {}', { s = long })
      assert.is_nil(r, call)
      assert.are.equal('error', status, call)
      assert.truthy(msg:find('matching steps on a subject of 100000 bytes', 1, true), msg)
    end
  end)

  it('lets the same patterns run on short strings, and linear ones on long strings', function()
    local long = string.rep('a', 100000) .. 'b'
    local r = H.run([[
      local a, b = ("xxaxyb"):match("(.-)x(.-)y")
      return { a = a, b = b, f = input.s:find("b", 1, true), g = select(2, input.s:gsub("a+", "")),
               m = input.s:match("^(a+)b$") and true, h = input.s:find("ab$") }
    ]], { s = long })
    assert.are.same({ a = '', b = 'xax', f = 100001, g = 1, m = true, h = 100000 }, r)
  end)

  it('charges pattern work to the budget, so a loop of costly matches stops', function()
    local r, status = H.run([[
      local s = string.rep("a", 2000)
      while true do s:find("a.-b") end
    ]], { }, { memory = 8 << 20, instructions = 5e8, timeout_ms = 60000 })
    assert.is_nil(r)
    assert.are.equal('timeout', status)
  end)
end)

describe('frozen globals', function()
  it('refuses to create a global', function()
    local r, status, msg = H.run('x = 1 return {}')
    assert.is_nil(r)
    assert.are.equal('error', status)
    assert.truthy(msg:find("assignment to global 'x'", 1, true), msg)
  end)

  it('refuses to replace a built-in', function()
    local _, status, msg = H.run('string.format = nil return {}')
    assert.are.equal('error', status)
    assert.truthy(msg:find('read-only', 1, true), msg)
    local _, status2 = H.run('_G.print = nil return {}')
    assert.are.equal('error', status2)
    local _, status3 = H.run('rawset(_G, "x", 1) return {}')
    assert.are.equal('error', status3)
    local _, status4 = H.run('setmetatable(_G, nil) return {}')
    assert.are.equal('error', status4)
    local _, status5 = H.run('getmetatable("").__index.upper = nil return {}')
    assert.are.equal('error', status5)
  end)

  it('reports an undefined global with its name', function()
    local _, status, msg = H.run('return { r = undefined_thing }')
    assert.are.equal('error', status)
    assert.truthy(msg:find("undefined global 'undefined_thing'", 1, true), msg)
  end)
end)

describe('return values', function()
  it('refuses functions in the result', function()
    local r, status, msg = H.run('return { f = function() end }')
    assert.is_nil(r)
    assert.are.equal('bad return value', status)
    assert.truthy(msg:find('.f', 1, true), msg)
  end)

  it('refuses cycles', function()
    local _, status = H.run('local t = {} t.t = t return t')
    assert.are.equal('bad return value', status)
  end)

  it('refuses mixed tables', function()
    local _, status = H.run('return { 1, 2, x = 3 }')
    assert.are.equal('bad return value', status)
  end)
end)

describe('require', function()
  it('resolves the bundle own modules and refuses anything else', function()
    local gkmspec = H.gkmspec
    local e = assert(gkmspec.engine{ files = {
      ['util.lua'] = 'return { twice = function(x) return 2 * x end }',
      ['probe.lua'] = 'local u = require "util" return { run = function(i) return { v = u.twice(i.x) } end }',
    } })
    assert.are.same({ v = 42 }, e:call_fn('probe', 'run', { x = 21 }))
    local _, status, msg = H.run('require "os" return {}')
    assert.are.equal('error', status)
    assert.truthy(msg:find("module 'os' not found", 1, true), msg)
    local _, status2 = H.run('require "../etc/passwd" return {}')
    assert.are.equal('error', status2)
  end)
end)
