// Signs an image the way a sigstore-js user would, offline: a DSSE bundle
// over an in-toto statement naming the image (predicate type
// https://sigstore.dev/cosign/sign/v1, what cosign v3 writes for an image
// signature), made by @sigstore/sign's DSSEBundleBuilder with a signer that
// holds a local private key and no witnesses (no Fulcio, no Rekor: nothing
// on the network), serialized by @sigstore/bundle, and with --attach stored
// by @sigstore/oci as an OCI 1.1 referrer of the image (or under the
// sha256-<hex> fallback tag where the registry has no referrers API).
//
//   node sign.js --key KEY.pem --image REGISTRY/REPO --digest sha256:HEX
//                [--out BUNDLE.json] [--attach] [--statement-digest sha256:HEX]
//
// --statement-digest names another image in the statement than the one the
// bundle is attached to (a signature copied to the wrong image).
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const { DSSEBundleBuilder } = require('@sigstore/sign');
const { bundleToJSON } = require('@sigstore/bundle');
const { attachArtifactToImage } = require('@sigstore/oci');

const BUNDLE_MEDIA_TYPE = 'application/vnd.dev.sigstore.bundle.v0.3+json';

function args(argv) {
  const a = {};
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, '');
    a[k] = k === 'attach' ? true : argv[++i];
  }
  for (const need of ['key', 'image', 'digest'])
    if (!a[need]) throw new Error(`--${need} is required`);
  return a;
}

async function main() {
  const a = args(process.argv.slice(2));
  const priv = crypto.createPrivateKey(fs.readFileSync(a.key));
  const pub = crypto.createPublicKey(priv);
  const der = pub.export({ type: 'spki', format: 'der' });
  const signer = {
    // ECDSA signatures come out DER-encoded, as sigstore wants them
    sign: async (data) => ({
      signature: crypto.sign(pub.asymmetricKeyType === 'ed25519' ? null : 'sha256', data, priv),
      key: {
        $case: 'publicKey',
        publicKey: pub.export({ type: 'spki', format: 'pem' }).toString(),
        hint: crypto.createHash('sha256').update(der).digest('hex'),
      },
    }),
  };
  const statement = {
    _type: 'https://in-toto.io/Statement/v1',
    subject: [
      { name: a.image, digest: { sha256: (a['statement-digest'] || a.digest).replace(/^sha256:/, '') } },
    ],
    predicateType: 'https://sigstore.dev/cosign/sign/v1',
    predicate: {},
  };
  const builder = new DSSEBundleBuilder({ signer, witnesses: [] });
  const bundle = await builder.create({
    data: Buffer.from(JSON.stringify(statement)),
    type: 'application/vnd.in-toto+json',
  });
  const text = JSON.stringify(bundleToJSON(bundle));
  if (a.out) fs.writeFileSync(a.out, text);
  if (a.attach) {
    const d = await attachArtifactToImage({
      imageName: a.image,
      imageDigest: a.digest,
      artifact: Buffer.from(text),
      mediaType: BUNDLE_MEDIA_TYPE,
      credentials: undefined,
    });
    process.stdout.write(`attached ${d.digest}\n`);
  }
}

main().catch((e) => {
  process.stderr.write(`sign.js: ${e.message}${e.cause ? `: ${e.cause.message}` : ''}\n`);
  process.exit(1);
});
