-- Shared helpers for specs that drive the real engine through gkmspec.
local gkmspec = require 'gkmspec'

local H = {}

H.gkmspec = gkmspec

-- An engine whose bundle is the built-in policies plus one module 'probe'
-- whose run(input) is body (Lua source of a function body taking `input`).
function H.probe(body, limits)
  local opts = limits or {}
  opts.files = { ['probe.lua'] = 'local M = {}\nfunction M.run(input)\n' .. body .. '\nend\nreturn M\n' }
  local e, err = gkmspec.engine(opts)
  assert(e, err)
  return e
end

-- Run body in a fresh probe engine: returns result, status, message.
function H.run(body, input, limits)
  local e = H.probe(body, limits)
  return e:call_fn('probe', 'run', input or {})
end

return H
