/* cosign-compatible image signatures with OpenSSL 3 (EVP), by key; keyless
 * signatures (Fulcio certificates, Rekor entries) are keyless.h's, reached
 * through sig_verify_one() and sig_verify().
 *
 * Two signature forms, both checked against the image manifest digest:
 *  - simple signing: the payload is the JSON blob of a signature layer
 *    (media type application/vnd.dev.cosign.simplesigning.v1+json) and the
 *    signature is the base64 annotation dev.cosignproject.cosign/signature,
 *    over the exact payload bytes (read as cosign reads it: base64.h's
 *    BASE64_STD, line breaks anywhere allowed). The payload must say
 *    critical.type == "cosign container image signature" and
 *    critical.image.docker-manifest-digest == the image digest.
 *  - sigstore bundle v0.3 (application/vnd.dev.sigstore.bundle.v0.3+json):
 *    a DSSE envelope whose signature covers PAE(payloadType, payload) and
 *    whose payload is an in-toto statement with a subject whose
 *    digest.sha256 is the image digest's hex.
 * Algorithms (from the key): ECDSA P-256 / P-384 / P-521 with SHA-256 (the
 * cosign default; P-384 also accepts SHA-384 and P-521 SHA-512, tried after
 * SHA-256), signature ASN.1 DER; RSA PKCS#1 v1.5 with SHA-256; Ed25519 over
 * the raw message.
 *
 * The registry side (finding the `sha256-<hex>.sig` tag, referrers, the
 * fallback tag index, fetching blobs) is not here: it collects candidates
 * and hands them to signature_verify().
 *
 * Error reporting: functions that can fail for a reason a user must see take
 * (char *why, size_t whylen) and write a one-line reason there on failure
 * (why may be NULL). Nothing else is written on failure. */
#ifndef GKM_SIGNATURE_H
#define GKM_SIGNATURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIGNATURE_SIMPLE_MEDIA_TYPE "application/vnd.dev.cosign.simplesigning.v1+json"
#define SIGNATURE_ANNOTATION "dev.cosignproject.cosign/signature"
#define SIGNATURE_BUNDLE_MEDIA_TYPE "application/vnd.dev.sigstore.bundle.v0.3+json"
#define SIGNATURE_PAYLOAD_TYPE "cosign container image signature"
#define SIGNATURE_INTOTO_TYPE "application/vnd.in-toto+json"
#define SIGNATURE_FP_MAX 72 /* "sha256:" + 64 hex + NUL, rounded */

/* Bounds on outside input: larger payloads/bundles are refused (-EMSGSIZE). */
#define SIGNATURE_MAX_PAYLOAD (256u * 1024)
#define SIGNATURE_MAX_BUNDLE (1024u * 1024)

/* ---- keys ---- */

struct sig_key;

enum sig_key_alg {
	SIG_ALG_ECDSA_P256 = 1,
	SIG_ALG_ECDSA_P384,
	SIG_ALG_ECDSA_P521,
	SIG_ALG_RSA,
	SIG_ALG_ED25519
};

/* Public key from PEM: "PUBLIC KEY" (SPKI) or "RSA PUBLIC KEY" (PKCS#1).
 * Only the first PEM block is read. A private key PEM is also accepted (its
 * public half is used). Caller frees with sig_key_free(). -EINVAL (with why)
 * for unparsable input or an unsupported algorithm/curve. */
__attribute__((warn_unused_result)) int
sig_key_load_public(const char *pem, size_t len, struct sig_key **out, char *why, size_t whylen);

/* Private key from PEM (PKCS#8 "PRIVATE KEY", "ENCRYPTED PRIVATE KEY" with
 * passphrase, "EC PRIVATE KEY", "RSA PRIVATE KEY"). passphrase may be NULL.
 * cosign's own "ENCRYPTED SIGSTORE PRIVATE KEY" format is not supported
 * (convert it to PKCS#8). Caller frees with sig_key_free(). */
__attribute__((warn_unused_result)) int sig_key_load_private(const char *pem, size_t len,
                                                             const char *passphrase,
                                                             struct sig_key **out, char *why,
                                                             size_t whylen);

/* Read a whole (small, <= 64 KiB) key file and call one of the above. */
__attribute__((warn_unused_result)) int
sig_key_load_public_file(const char *path, struct sig_key **out, char *why, size_t whylen);
__attribute__((warn_unused_result)) int sig_key_load_private_file(const char *path,
                                                                  const char *passphrase,
                                                                  struct sig_key **out, char *why,
                                                                  size_t whylen);

void sig_key_free(struct sig_key *k);
enum sig_key_alg sig_key_alg(const struct sig_key *k);
const char *sig_key_alg_name(
    const struct sig_key *k); /* "ecdsa-p256", "rsa-2048", "ed25519"; static or borrowed */
bool sig_key_is_private(const struct sig_key *k);

/* "sha256:<hex>" of the DER SubjectPublicKeyInfo; borrowed until sig_key_free(). */
const char *sig_key_fingerprint(const struct sig_key *k);

/* New ECDSA P-256 key pair as PEM (PKCS#8 private, optionally encrypted with
 * AES-256-CBC under passphrase when it is non-NULL and non-empty; SPKI
 * public). Both strings NUL-terminated, caller frees with free(). */
__attribute__((warn_unused_result)) int sig_keygen_p256(const char *passphrase, char **priv_pem,
                                                        char **pub_pem);

/* Public key PEM (SPKI) of any key. Caller frees with free(). */
__attribute__((warn_unused_result)) int sig_key_public_pem(const struct sig_key *k, char **out);

/* ---- trusted key sets ---- */

struct sig_keyset;

__attribute__((warn_unused_result)) int sig_keyset_new(struct sig_keyset **out);
void sig_keyset_free(struct sig_keyset *ks);

/* Add a key; the set takes ownership of k on success only. A key already in
 * the set (same fingerprint) is freed and 0 returned. */
__attribute__((warn_unused_result)) int sig_keyset_add(struct sig_keyset *ks, struct sig_key *k);

/* Add every PEM public key block found in pem (a ConfigMap value may hold
 * several). -EINVAL with why if any block fails or none is found; the set is
 * unchanged on failure. */
__attribute__((warn_unused_result)) int sig_keyset_add_pem(struct sig_keyset *ks, const char *pem,
                                                           size_t len, char *why, size_t whylen);

/* Keys, plus keyless identity rules when keyless trust is set. */
size_t sig_keyset_count(const struct sig_keyset *ks);
/* Whether the set holds the key of this fingerprint ("sha256:<hex>"), or a
 * keyless rule of this id. */
bool sig_keyset_has(const struct sig_keyset *ks, const char *fingerprint);

/* Keyless trust (keyless.h) beside the keys: ks takes kl and frees it with
 * itself (NULL drops what was set). The set's fingerprint covers it. */
struct sig_keyless;
void sig_keyset_set_keyless(struct sig_keyset *ks, struct sig_keyless *kl);
const struct sig_keyless *sig_keyset_keyless(const struct sig_keyset *ks);
/* The keys alone. */
size_t sig_keyset_nkeys(const struct sig_keyset *ks);

/* "sha256:<hex>" over the sorted key fingerprints: equal sets give equal
 * fingerprints whatever the order they were added in. Borrowed until the
 * set changes or is freed. */
const char *sig_keyset_fingerprint(const struct sig_keyset *ks);

/* ---- verification ---- */

enum sig_kind { SIG_KIND_SIMPLE = 1, SIG_KIND_BUNDLE };

/* One signature found for an image. All pointers borrowed for the call. */
struct sig_candidate {
	enum sig_kind kind;
	const void *data; /* simple: the payload layer blob; bundle: the bundle JSON */
	size_t len;
	const char *signature_b64; /* simple: the annotation value; bundle: NULL */
	const char *source;        /* for messages, e.g. "sha256-<hex>.sig layer 0" (may be NULL) */
	/* simple signed keyless (keyless.h): the certificate, chain and Rekor
	 * bundle annotations; NULL when absent */
	const char *certificate_pem, *chain_pem, *rekor_bundle;
};

struct sig_verdict {
	bool accepted;
	enum sig_kind kind;                     /* of the accepting signature */
	char key_fingerprint[SIGNATURE_FP_MAX]; /* of the accepting key */
	char reason[512]; /* accepted: which key/signature; rejected: why each failed (abridged) */
	/* accepted keyless: the certificate's identity and issuer, the rule
	 * that accepted them (key_fingerprint is then the rule's id) and when
	 * the log integrated the signature; empty/0 for a key */
	char identity[256], issuer[256], rule[96];
	int64_t integrated_time;
};

/* Verify one simple-signing signature against the set. 0 if a key in ks
 * verifies it and the payload names image_digest; otherwise -EKEYREJECTED
 * (no key verifies), -EBADMSG (payload or base64 malformed, wrong type,
 * another image), -EMSGSIZE, -EINVAL (image_digest not "sha256:<64 hex>"),
 * or -ENOKEY (empty set) with why. The signature is checked before the
 * payload, so a tampered payload reads as -EKEYREJECTED. On success *fp_out (may be
 * NULL) gets the verifying key's fingerprint (SIGNATURE_FP_MAX bytes). */
__attribute__((warn_unused_result)) int
sig_verify_simple(const struct sig_keyset *ks, const char *image_digest, const void *payload,
                  size_t len, const char *signature_b64, char *fp_out, char *why, size_t whylen);

/* Verify one sigstore bundle v0.3 (DSSE, in-toto subject). Same returns;
 * -EPROTONOSUPPORT for a bundle without a dsseEnvelope (messageSignature
 * bundles sign the manifest bytes, which are not checked here). The
 * statement must have predicateType https://sigstore.dev/cosign/sign/v1 (what
 * cosign v3 writes for an image signature): other attestations by a trusted
 * key (SBOM, provenance) are not signatures of the image. */
__attribute__((warn_unused_result)) int sig_verify_bundle(const struct sig_keyset *ks,
                                                          const char *image_digest,
                                                          const void *bundle, size_t len,
                                                          char *fp_out, char *why, size_t whylen);

/* Verify one candidate whichever way it was signed: with a key of ks, or
 * keyless with the trust sig_keyset_set_keyless() gave ks (a candidate
 * carrying a certificate). Always fills *out (reason: why, on failure).
 * 0, -EKEYREJECTED, -EBADMSG, -EMSGSIZE, -EINVAL or -ENOKEY as above. */
__attribute__((warn_unused_result)) int sig_verify_one(const struct sig_keyset *ks,
                                                       const char *image_digest,
                                                       const struct sig_candidate *c,
                                                       struct sig_verdict *out);

/* Accept the image when at least one candidate verifies with a key of ks.
 * Always fills *out. Returns 0 when accepted, -ENODATA when there are no
 * candidates ("image is not signed"), -ENOKEY for an empty key set, or
 * -EKEYREJECTED when none verified (out->reason lists why, per candidate). */
__attribute__((warn_unused_result)) int sig_verify(const struct sig_keyset *ks,
                                                   const char *image_digest,
                                                   const struct sig_candidate *c, size_t n,
                                                   struct sig_verdict *out);

/* ---- signing ---- */

/* The simple-signing payload for image_digest (docker_reference is the
 * repository, e.g. "registry.example:5000/team/cache", written into
 * critical.identity.docker-reference) and its base64 signature. Both
 * NUL-terminated strings (payload_len excludes the NUL), caller frees both
 * with free(). priv must be a private key. */
__attribute__((warn_unused_result)) int sig_sign_simple(const struct sig_key *priv,
                                                        const char *docker_reference,
                                                        const char *image_digest, char **payload,
                                                        size_t *payload_len, char **signature_b64);

/* A sigstore bundle v0.3 JSON (DSSE envelope over an in-toto statement with
 * one subject {name: subject_name, digest: {sha256: hex}}, predicate type
 * https://sigstore.dev/cosign/sign/v1, verificationMaterial.publicKey.hint =
 * the key fingerprint hex, no tlog entries). Caller frees *bundle. */
__attribute__((warn_unused_result)) int sig_sign_bundle(const struct sig_key *priv,
                                                        const char *subject_name,
                                                        const char *image_digest, char **bundle,
                                                        size_t *bundle_len);

/* ---- helpers exposed for tests and fuzzing ---- */

/* DSSE pre-authentication encoding: "DSSEv1 <len(type)> <type> <len(body)> <body>"
 * (decimal lengths in bytes). Caller frees *out. */
__attribute__((warn_unused_result)) int sig_dsse_pae(const char *type, const void *body,
                                                     size_t body_len, unsigned char **out,
                                                     size_t *out_len);

/* Check a simple-signing payload (no crypto): 0 if it is well-formed and
 * names image_digest, else -EBADMSG / -EMSGSIZE with why. */
__attribute__((warn_unused_result)) int sig_check_simple_payload(const void *payload, size_t len,
                                                                 const char *image_digest,
                                                                 char *why, size_t whylen);

/* ---- verification result cache ---- */

/* Thread-safe cache of verdicts keyed by (image digest, key-set fingerprint).
 * Accepted verdicts live ttl_ok seconds, rejected ones ttl_rejected (a new
 * signature may be pushed). At most max_entries; the oldest is evicted. */
struct sig_cache;

__attribute__((warn_unused_result)) int sig_cache_new(size_t max_entries, int64_t ttl_ok,
                                                      int64_t ttl_rejected, struct sig_cache **out);
void sig_cache_free(struct sig_cache *c);

/* 0 and *out on a live hit; -ENOENT on a miss or an expired entry. */
__attribute__((warn_unused_result)) int sig_cache_get(struct sig_cache *c, const char *image_digest,
                                                      const char *keyset_fp,
                                                      struct sig_verdict *out);
void sig_cache_put(struct sig_cache *c, const char *image_digest, const char *keyset_fp,
                   const struct sig_verdict *v);

#endif
