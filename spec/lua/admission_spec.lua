-- policies/admission.lua through the real engine.
local gkmspec = require 'gkmspec'

local root = os.getenv('GKM_ROOT') or '.'
local e = assert(gkmspec.engine{ dir = root .. '/policies' })

local function review(signatures, config, registry)
  return assert(e:call('admission', {
    image = { ref = 'quay.io/org/cache:v1', registry = registry or 'quay.io',
              digest = 'sha256:' .. string.rep('a', 64) },
    signatures = signatures,
    config = config or { verifyEnabled = true, allowUnsigned = false },
    object = { kind = 'GKMCache', namespace = 'default', name = 'c',
               annotations = { ['kyverno.io/verify-images'] = 'pass' } },
  }))
end

describe('admission policy', function()
  it('admits an image with a verified signature', function()
    assert.is_true(review({ { kind = 'simple', key = 'k', verified = true } }).allowed)
    assert.is_true(review({ { kind = 'bundle', key = 'k', verified = true } }).allowed)
  end)

  it('refuses an unsigned image, whatever a kyverno annotation says', function()
    local r = review({})
    assert.is_false(r.allowed)
    assert.are.equal('Unsigned', r.reason)
    assert.truthy(r.message:find('quay.io/org/cache:v1', 1, true))
  end)

  it('admits an unsigned image when allowed by configuration', function()
    assert.is_true(review({}, { verifyEnabled = true, allowUnsigned = true }).allowed)
  end)

  it('refuses a signature that did not verify, with the reason', function()
    local r = review({ { kind = 'simple', verified = false, reason = 'signed by an untrusted key' } })
    assert.is_false(r.allowed)
    assert.are.equal('SignatureNotTrusted', r.reason)
    assert.truthy(r.message:find('untrusted key', 1, true), r.message)
  end)

  it('skips verification when it is turned off', function()
    assert.is_true(review({}, { verifyEnabled = false }).allowed)
  end)

  it('handles malformed input without crashing', function()
    local r = assert(e:call('admission', {}))
    assert.is_false(r.allowed)
    local r2 = assert(e:call('admission', { signatures = { 'junk', 7 } }))
    assert.is_false(r2.allowed)
  end)
end)
