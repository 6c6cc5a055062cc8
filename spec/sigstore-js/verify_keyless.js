// Verifies a keyless sigstore bundle with sigstore-js's own verifier,
// offline: the trust is a trusted_root.json (Fulcio CAs, Rekor logs, CT
// logs), as `cosign verify --trusted-root` takes it, with one identity
// (issuer and SAN, exact) as the policy; a signed entry timestamp from a
// trusted log is required, SCTs when --sct is given. Then checks that the
// DSSE statement names the image digest. Exit 0 and "verified" when it does.
//
//   node verify_keyless.js --root TRUSTED_ROOT.json --bundle BUNDLE.json
//        --digest sha256:HEX --issuer URL --subject SAN [--sct]
'use strict';
const fs = require('node:fs');
const { bundleFromJSON } = require('@sigstore/bundle');
const { TrustedRoot } = require('@sigstore/protobuf-specs');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

function args(argv) {
  const a = {};
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, '');
    a[k] = k === 'sct' ? true : argv[++i];
  }
  for (const need of ['root', 'bundle', 'digest', 'issuer', 'subject'])
    if (!a[need]) throw new Error(`--${need} is required`);
  return a;
}

try {
  const a = args(process.argv.slice(2));
  const root = TrustedRoot.fromJSON(JSON.parse(fs.readFileSync(a.root, 'utf8')));
  const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(a.bundle, 'utf8')));
  const verifier = new Verifier(toTrustMaterial(root), {
    tlogThreshold: 1,
    ctlogThreshold: a.sct ? 1 : 0,
    timestampThreshold: 1,
  });
  const signer = verifier.verify(toSignedEntity(bundle), {
    subjectAlternativeName: a.subject,
    extensions: { issuer: a.issuer },
  });
  const st = JSON.parse(bundle.content.dsseEnvelope.payload.toString());
  const want = a.digest.replace(/^sha256:/, '');
  if (!st.subject.some((s) => s.digest && s.digest.sha256 === want))
    throw new Error(`the statement does not name ${a.digest}`);
  process.stdout.write(
    `verified ${st.predicateType} for ${a.digest} signed by ${signer.identity.subjectAlternativeName}\n`);
} catch (e) {
  process.stderr.write(`verify_keyless.js: ${e.message}${e.cause ? `: ${e.cause.message}` : ''}\n`);
  process.exit(1);
}
