-- lua/gkm/rollout.lua (the operator's pull slots) through the real engine.
local gkmspec = require 'gkmspec'

local e = assert(gkmspec.engine{})
local D = 'sha256:' .. string.rep('d', 64)
local D0 = 'sha256:' .. string.rep('0', 64)

local function node(name, state, extra)
  local entry = { digest = D, state = state }
  for k, v in pairs(extra or {}) do entry[k] = v end
  return { name = name, entry = entry }
end

local function plan(rollout, nodes, prev)
  local r, status, msg = e:call_fn('gkm.rollout', 'plan', {
    cache = { rollout = rollout, status = { rollout = prev } }, digest = D, nodes = nodes })
  assert(r, tostring(status) .. ': ' .. tostring(msg))
  return r.rollout
end

describe('rollout plan', function()
  it('reads maxPulling as a count or a share of the nodes', function()
    local function limit(max, n)
      return (e:call_fn('gkm.rollout', 'plan', { cache = { rollout = { maxPulling = max } }, digest = D,
        nodes = (function() local t = {} for i = 1, n do t[i] = node('n' .. i, 'Waiting') end return t end)() }))
        .rollout.maxPulling
    end
    assert.are.equal(3, limit(3, 10))
    assert.are.equal(3, limit('25%', 10))
    assert.are.equal(1, limit('1%', 10))
    assert.is_nil(limit('100%', 10))
  end)

  it('grants the first in line up to the limit, the rest wait in order', function()
    local nodes = {
      node('c', 'Waiting', { waitingSince = '2026-11-21T10:00:02Z' }),
      node('a', 'Waiting', { waitingSince = '2026-11-21T10:00:01Z' }),
      node('b', 'Waiting', { waitingSince = '2026-11-21T10:00:01Z' }),
      node('x', 'Incompatible'),
    }
    local r = plan({ maxPulling = 2 }, nodes)
    assert.are.same({ 'a', 'b' }, r.pulling)
    assert.are.same({ 'c' }, r.waiting)
    assert.are.equal(D, r.digest)
  end)

  it('keeps grants while nodes pull and hands on the slots of Ready and Failed ones', function()
    local prev = { digest = D, pulling = { 'a', 'b' }, waiting = { 'c', 'd' } }
    local r = plan({ maxPulling = 2 }, {
      node('a', 'Pulling'), node('b', 'Ready'),
      node('c', 'Waiting', { waitingSince = '1' }), node('d', 'Waiting', { waitingSince = '2' }) }, prev)
    assert.are.same({ 'a', 'c' }, r.pulling)
    assert.are.same({ 'd' }, r.waiting)
    r = plan({ maxPulling = 2 }, {
      node('a', 'Failed'), node('b', 'Ready'), node('c', 'Pulling'),
      node('d', 'Waiting', { waitingSince = '2' }) }, r)
    assert.are.same({ 'c', 'd' }, r.pulling)
    -- a grant for another digest is no grant: a new digest starts over
    local old = { digest = D0, pulling = { 'a', 'b' } }
    r = plan({ maxPulling = 1 }, { node('a', 'Waiting', { waitingSince = '2' }),
      node('b', 'Waiting', { waitingSince = '1' }) }, old)
    assert.are.same({ 'b' }, r.pulling)
  end)

  it('sends one node first through a cold mirror, then the rest', function()
    local nodes = {}
    for i = 1, 5 do
      nodes[i] = node('n' .. i, 'Waiting', { waitingSince = tostring(i), throughMirror = true })
    end
    local r = plan(nil, nodes)
    assert.are.same({ 'n1' }, r.pulling)
    assert.are.equal(1, r.maxPulling)
    nodes[1] = node('n1', 'Ready')
    r = plan(nil, nodes, r)
    assert.are.same({ 'n2' }, r.pulling)
    -- then no more pull than are Ready: the waves double
    nodes[2] = node('n2', 'Ready')
    r = plan(nil, nodes, r)
    assert.are.same({ 'n3', 'n4' }, r.pulling)
    assert.are.equal(2, r.maxPulling)
    nodes[3], nodes[4] = node('n3', 'Ready'), node('n4', 'Ready')
    r = plan({ maxPulling = 2 }, nodes, r)
    assert.are.same({ 'n5' }, r.pulling)
    assert.are.equal(2, r.maxPulling)
  end)

  it('says nothing for a cache without a rollout', function()
    local r = e:call_fn('gkm.rollout', 'plan', { cache = {}, digest = D, nodes = { node('a', 'Ready') } })
    assert.is_nil(r.rollout)
  end)
end)
