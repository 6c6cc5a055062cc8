// Signs an image keyless the way a sigstore-js user in CI would, offline:
// @sigstore/sign's DSSEBundleBuilder over an in-toto statement naming the
// image (predicate type https://sigstore.dev/cosign/sign/v1), with a signer
// holding a short-lived certificate (made by the test's Fulcio-like CA,
// spec/lib/fake_sigstore.c, instead of Fulcio) and a witness standing in
// for Rekor: it records the entry as Rekor does (a dsse 0.0.1 body), signs
// the entry timestamp with the test log's key, and proves inclusion in a
// one-entry tree with a signed checkpoint. The bundle (v0.3) is serialized
// by @sigstore/bundle.
//
//   node sign_keyless.js --cert LEAF.pem --key LEAF.key --log-key REKOR.key
//        --image REGISTRY/REPO --digest sha256:HEX --out BUNDLE.json
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const { DSSEBundleBuilder } = require('@sigstore/sign');
const { bundleToJSON } = require('@sigstore/bundle');

function args(argv) {
  const a = {};
  for (let i = 0; i < argv.length; i += 2) a[argv[i].replace(/^--/, '')] = argv[i + 1];
  for (const need of ['cert', 'key', 'log-key', 'image', 'digest', 'out'])
    if (!a[need]) throw new Error(`--${need} is required`);
  return a;
}

const sha256 = (...parts) => {
  const h = crypto.createHash('sha256');
  parts.forEach((p) => h.update(p));
  return h.digest();
};

// The test's Rekor: one entry, its SET and a checkpoint over a tree of one.
function logEntry(envelope, certPem, logKey) {
  const logKeyDer = crypto.createPublicKey(logKey).export({ type: 'spki', format: 'der' });
  const logId = sha256(logKeyDer);
  const sig = envelope.signatures[0].sig;
  const body = Buffer.from(JSON.stringify({
    apiVersion: '0.0.1',
    kind: 'dsse',
    spec: {
      envelopeHash: { algorithm: 'sha256', value: sha256(JSON.stringify(envelope)).toString('hex') },
      payloadHash: { algorithm: 'sha256', value: sha256(envelope.payload).toString('hex') },
      signatures: [{ signature: sig.toString('base64'), verifier: Buffer.from(certPem).toString('base64') }],
    },
  }));
  const integratedTime = Math.floor(Date.now() / 1000);
  // canonical JSON: keys sorted, no blanks
  const setPayload = `{"body":"${body.toString('base64')}","integratedTime":${integratedTime},` +
    `"logID":"${logId.toString('hex')}","logIndex":0}`;
  const set = crypto.sign('sha256', Buffer.from(setPayload), logKey);
  const root = sha256(Buffer.from([0]), body);
  const note = `rekor.test\n1\n${root.toString('base64')}\n`;
  const noteSig = Buffer.concat([logId.subarray(0, 4), crypto.sign('sha256', Buffer.from(note), logKey)]);
  return {
    logIndex: '0',
    logId: { keyId: logId },
    kindVersion: { kind: 'dsse', version: '0.0.1' },
    integratedTime: String(integratedTime),
    inclusionPromise: { signedEntryTimestamp: set },
    inclusionProof: {
      logIndex: '0',
      rootHash: root,
      treeSize: '1',
      hashes: [],
      checkpoint: { envelope: `${note}\n\u2014 rekor.test ${noteSig.toString('base64')}\n` },
    },
    canonicalizedBody: body,
  };
}

async function main() {
  const a = args(process.argv.slice(2));
  const certPem = fs.readFileSync(a.cert, 'utf8');
  const leafKey = crypto.createPrivateKey(fs.readFileSync(a.key));
  const logKey = crypto.createPrivateKey(fs.readFileSync(a['log-key']));
  const signer = {
    sign: async (data) => ({
      signature: crypto.sign('sha256', data, leafKey),
      key: { $case: 'x509Certificate', certificate: certPem },
    }),
  };
  const witness = {
    testify: async (content) => ({
      tlogEntries: [logEntry({
        payload: content.dsseEnvelope.payload,
        payloadType: content.dsseEnvelope.payloadType,
        signatures: content.dsseEnvelope.signatures.map((s) => ({ sig: s.sig, keyid: s.keyid })),
      }, certPem, logKey)],
    }),
  };
  const statement = {
    _type: 'https://in-toto.io/Statement/v1',
    subject: [{ name: a.image, digest: { sha256: a.digest.replace(/^sha256:/, '') } }],
    predicateType: 'https://sigstore.dev/cosign/sign/v1',
    predicate: {},
  };
  const builder = new DSSEBundleBuilder({ signer, witnesses: [witness] });
  const bundle = await builder.create({
    data: Buffer.from(JSON.stringify(statement)),
    type: 'application/vnd.in-toto+json',
  });
  fs.writeFileSync(a.out, JSON.stringify(bundleToJSON(bundle)));
}

main().catch((e) => {
  process.stderr.write(`sign_keyless.js: ${e.message}${e.cause ? `: ${e.cause.message}` : ''}\n`);
  process.exit(1);
});
