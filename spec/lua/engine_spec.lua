-- Building, validating and swapping policy bundles (engine_slot), as daemons do.
local gkmspec = require 'gkmspec'

local root = os.getenv('GKM_ROOT') or '.'
local input = {
  image = { ref = 'quay.io/x/y:v1', registry = 'quay.io' },
  signatures = {},
  config = { verifyEnabled = true, allowUnsigned = false },
}
local allow_all = [[
local M = {}
function M.evaluate() return { allowed = true } end
return M
]]

local function refused(files, status_pattern)
  local s = gkmspec.slot()
  assert(s:load{ dir = root .. '/policies' })
  local before = s:digest()
  local ok, err = s:load{ files = files }
  assert.is_false(ok)
  assert.are.equal(1, s:generation())
  assert.are.equal(before, s:digest())
  -- the previous engine keeps answering
  local r = s:call('admission', input)
  assert.are.equal('Unsigned', r.reason)
  if status_pattern then
    assert.truthy(err:find(status_pattern), err)
  end
  return err
end

describe('policy bundles', function()
  it('builds from the policies directory', function()
    local e, err = gkmspec.engine{ dir = root .. '/policies' }
    assert.truthy(e, err)
    assert.truthy(e:digest():match('^sha256:%x+$'))
  end)

  it('refuses a syntax error and names file and line', function()
    local err = refused({ ['admission.lua'] = 'local M = {}\nfunction M.evaluate(\nreturn M\n' })
    assert.truthy(err:find('admission.lua:3:', 1, true), err)
  end)

  it('refuses a runtime error at load time', function()
    local err = refused({ ['admission.lua'] = 'local M = {}\nlocal x = nil + 1\nreturn M\n' })
    assert.truthy(err:find('admission.lua:2:', 1, true), err)
  end)

  it('refuses a bundle whose hook is missing', function()
    local err = refused({ ['admission.lua'] = 'return {}' })
    assert.truthy(err:find("hook function 'evaluate'", 1, true), err)
  end)

  it('refuses a hook of the wrong type', function()
    local err = refused({ ['admission.lua'] = 'return { evaluate = 42 }' })
    assert.truthy(err:find('must be a function, got number', 1, true), err)
  end)

  it('refuses a module that returns no table', function()
    refused({ ['admission.lua'] = 'return 7' })
  end)

  it('refuses a bundle that loops forever at load', function()
    local s = gkmspec.slot{ instructions = 1000000, timeout_ms = 1000 }
    assert(s:load{})
    local ok, err = s:load{ files = { ['admission.lua'] = 'while true do end' } }
    assert.is_false(ok)
    assert.truthy(err:find('budget', 1, true), err)
    assert.are.equal(1, s:generation())
  end)

  it('refuses a bad file name', function()
    local s = gkmspec.slot()
    local ok, err = s:load{ files = { ['../evil.lua'] = 'return {}' } }
    assert.is_false(ok)
    assert.truthy(err:find('not a valid policy file name', 1, true), err)
  end)

  it('switches generation on a valid reload and answers with the new policy', function()
    local s = gkmspec.slot()
    assert(s:load{ dir = root .. '/policies' })
    assert.are.equal(1, s:generation())
    local d1 = s:digest()
    assert.is_false(s:call('admission', input).allowed)
    assert(s:load{ files = { ['admission.lua'] = allow_all } })
    assert.are.equal(2, s:generation())
    assert.are_not.equal(d1, s:digest())
    assert.is_true(s:call('admission', input).allowed)
  end)

  it('does not bump the generation for an identical bundle', function()
    local s = gkmspec.slot()
    assert(s:load{ dir = root .. '/policies' })
    assert(s:load{ dir = root .. '/policies' })
    assert.are.equal(1, s:generation())
  end)

  it('refuses a hook result that fails validation', function()
    local e = assert(gkmspec.engine{ files = { ['admission.lua'] =
      'return { evaluate = function() return { allowed = false } end }' } })
    local r, status, msg = e:call('admission', input)
    assert.is_nil(r)
    assert.are.equal('bad return value', status)
    assert.truthy(msg:find("'reason'", 1, true), msg)
  end)
end)
