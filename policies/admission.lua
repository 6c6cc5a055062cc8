-- Admission policy: decides whether a GKMCache / ClusterGKMCache may be
-- admitted, given what the webhook found out about its image.
--
-- Input (a plain table, built by the webhook):
--   image      = { ref = "quay.io/org/cache:v1", registry = "quay.io",
--                  repository = "org/cache", tag = "v1", digest = "sha256:..." }
--   signatures = { { kind = "simple" | "bundle", key = "sha256:<key fingerprint>",
--                    verified = true|false, reason = "why not" }, ... }
--                (a keyless signature, verified: also identity = the certificate's
--                 SAN, issuer = its OIDC issuer, rule = the identity rule's name;
--                 key is then the rule's id)
--   config     = { verifyEnabled = true, allowUnsigned = false }
--   object     = { kind = "GKMCache", namespace = "ns", name = "n",
--                  operation = "CREATE" | "UPDATE", annotations = {...} }
--
-- image.tag is absent for references by digest only; image.digest is what
-- the webhook resolved (or the reference's own digest). signatures is empty
-- when the image has none, and when config.verifyEnabled is false (then
-- nothing was checked). object.annotations never holds
-- kyverno.io/verify-images: anyone can write it, so it proves nothing.
--
-- Output: { allowed = true } or
--         { allowed = false, reason = "CamelCaseReason", message = "for the user" }
local M = {}

-- Registries caches may come from. An empty list allows every registry.
-- Example: M.allowed_registries = { "quay.io", "registry.example.com:5000" }
M.allowed_registries = {}

-- Signature kinds that count as proof when verified by a trusted key.
M.accepted_kinds = { simple = true, bundle = true }

local function registry_allowed(registry)
  if #M.allowed_registries == 0 then
    return true
  end
  for _, r in ipairs(M.allowed_registries) do
    if r == registry then
      return true
    end
  end
  return false
end

local function deny(reason, message)
  return { allowed = false, reason = reason, message = message }
end

function M.evaluate(input)
  local image = type(input.image) == "table" and input.image or {}
  local config = type(input.config) == "table" and input.config or {}
  if not registry_allowed(image.registry) then
    return deny("RegistryNotAllowed",
      string.format("registry %q is not in the allowed list of the admission policy",
        tostring(image.registry)))
  end
  if config.verifyEnabled == false then
    return { allowed = true }
  end
  local reasons = {}
  local signatures = type(input.signatures) == "table" and input.signatures or {}
  for _, sig in ipairs(signatures) do
    if type(sig) ~= "table" then
      sig = { kind = "malformed", reason = "signature entry is not a table" }
    end
    if sig.verified and M.accepted_kinds[sig.kind] then
      return { allowed = true }
    end
    reasons[#reasons + 1] = string.format("%s signature: %s", tostring(sig.kind),
      sig.reason or (sig.verified and "kind not accepted by policy" or "not verified"))
  end
  if #reasons == 0 then
    if config.allowUnsigned then
      return { allowed = true }
    end
    return deny("Unsigned", string.format(
      "image %s has no signature and unsigned images are not allowed", tostring(image.ref)))
  end
  return deny("SignatureNotTrusted", string.format(
    "no signature of image %s verifies with a trusted key (%s)", tostring(image.ref),
    table.concat(reasons, "; ")))
end

return M
