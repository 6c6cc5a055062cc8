-- gkm.kube outside a controller: every function refuses with a message that
-- says why (the writes it would queue have nowhere to go), and the engine
-- maps that to an ordinary policy error.
local H = require 'helper'

describe('gkm.kube', function()
  it('is a built-in module with the documented functions', function()
    local r, status, msg = H.run([[
      local kube = require 'gkm.kube'
      local names = {}
      for k, v in pairs(kube) do
        if type(v) == 'function' then names[#names + 1] = k end
      end
      table.sort(names)
      return { names = names }
    ]])
    assert.are.equal(nil, status, msg)
    assert.are.same({ 'apply', 'apply_status', 'delete', 'event', 'get', 'list' }, r.names)
  end)

  for _, call in ipairs({
    "get{ kind = 'GKMCache', name = 'x' }",
    "list{ kind = 'GKMCache' }",
    "apply({ apiVersion = 'v1', kind = 'ConfigMap', metadata = { name = 'x' } })",
    "apply_status({ apiVersion = 'v1', kind = 'ConfigMap', metadata = { name = 'x' } })",
    "delete{ apiVersion = 'v1', kind = 'ConfigMap', name = 'x' }",
    "event({ apiVersion = 'v1', kind = 'ConfigMap', metadata = { name = 'x' } }, 'Normal', 'Seen', 'hi')",
  }) do
    it('refuses ' .. call:match('^[%w_]+') .. ' outside a reconcile', function()
      local r, status, msg = H.run("return require('gkm.kube')." .. call)
      assert.is_nil(r)
      assert.are.equal('error', status)
      assert.truthy(msg:find("only available inside a controller's reconcile", 1, true), msg)
    end)
  end
end)
