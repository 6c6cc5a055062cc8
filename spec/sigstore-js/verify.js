// Verifies a sigstore bundle (as gkm writes it) with sigstore-js's own
// verifier, offline: trust is one public key (no Fulcio root, no Rekor, no
// timestamps required), as `cosign verify --key` does. Then checks that the
// DSSE statement names the image digest. Exit 0 and "verified" when it does.
//
//   node verify.js --key KEY.pub --bundle BUNDLE.json --digest sha256:HEX
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const { bundleFromJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity } = require('@sigstore/verify');

function args(argv) {
  const a = {};
  for (let i = 0; i < argv.length; i += 2) a[argv[i].replace(/^--/, '')] = argv[i + 1];
  for (const need of ['key', 'bundle', 'digest'])
    if (!a[need]) throw new Error(`--${need} is required`);
  return a;
}

try {
  const a = args(process.argv.slice(2));
  const key = crypto.createPublicKey(fs.readFileSync(a.key));
  const trust = {
    certificateAuthorities: [],
    timestampAuthorities: [],
    tlogs: [],
    ctlogs: [],
    publicKey: () => ({ publicKey: key, validFor: () => true }),
  };
  const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(a.bundle, 'utf8')));
  const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
  verifier.verify(toSignedEntity(bundle));
  const env = bundle.content.dsseEnvelope;
  const st = JSON.parse(env.payload.toString());
  const want = a.digest.replace(/^sha256:/, '');
  if (!st.subject.some((s) => s.digest && s.digest.sha256 === want))
    throw new Error(`the statement does not name ${a.digest}`);
  process.stdout.write(`verified ${st.predicateType} for ${a.digest}\n`);
} catch (e) {
  process.stderr.write(`verify.js: ${e.message}\n`);
  process.exit(1);
}
