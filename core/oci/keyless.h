/* Keyless signatures (cosign with Fulcio certificates and Rekor entries):
 * trust by identity instead of by key, verified offline.
 *
 * What is trusted (a struct sig_keyless, immutable once built):
 *  - a trusted root: Fulcio CA certificates (roots and intermediates), the
 *    transparency logs' public keys (Rekor), optionally the CT logs' keys,
 *    each with the time range it is valid for; read from sigstore's
 *    trusted_root.json (application/vnd.dev.sigstore.trustedroot+json) or
 *    from plain PEM (CERTIFICATE blocks; PUBLIC KEY blocks);
 *  - identity rules: an OIDC issuer and a subject (the certificate's SAN:
 *    email, URI or username), each exact or a regular expression, as
 *    `cosign verify --certificate-identity(-regexp)
 *    --certificate-oidc-issuer(-regexp)` takes them. A signature is accepted
 *    when it satisfies one rule.
 *
 * What a keyless signature must prove (the rules cosign applies):
 *  1. a transparency log entry: a signed entry timestamp (SET) by a trusted
 *     log key over {body, integratedTime, logID, logIndex}; where the entry
 *     also carries an inclusion proof, the proof and its signed checkpoint
 *     verify too. The integrated time is trusted only when a SET signs it:
 *     an entry with an inclusion proof alone proves inclusion, not when;
 *  2. the entry's body (hashedrekord or dsse) is this signature, this
 *     certificate and this payload;
 *  3. the certificate chains to a trusted Fulcio CA and was valid at the
 *     integrated time (Fulcio certificates live 10 minutes: "now" is the
 *     wrong clock), with the code-signing extended key usage; with CT log
 *     keys in the root, an embedded SCT verifies with one of them;
 *  4. the signature verifies with the certificate's key, and the payload
 *     (simple signing, or the in-toto statement of a DSSE bundle) names the
 *     image digest;
 *  5. the issuer (OID 1.3.6.1.4.1.57264.1.8, else .1.1) and a SAN match a
 *     rule.
 * Nothing is fetched: all of it is in the signature and the trusted root. */
#ifndef GKM_KEYLESS_H
#define GKM_KEYLESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "signature.h"

#define KEYLESS_TRUSTED_ROOT_MEDIA_TYPE "application/vnd.dev.sigstore.trustedroot+json"
#define KEYLESS_ANN_CERTIFICATE "dev.sigstore.cosign/certificate"
#define KEYLESS_ANN_CHAIN "dev.sigstore.cosign/chain"
#define KEYLESS_ANN_BUNDLE "dev.sigstore.cosign/bundle"

/* Bounds on what a trusted root or a rule list may hold. */
#define KEYLESS_MAX_CAS 32
#define KEYLESS_MAX_LOGS 32
#define KEYLESS_MAX_RULES 64

struct sig_keyless;

/* Why a keyless signature was refused: what did not match. */
enum keyless_cause {
	KEYLESS_OK = 0,
	KEYLESS_MALFORMED,      /* unreadable certificate, entry or bundle */
	KEYLESS_NO_CERTIFICATE, /* nothing to take an identity from */
	KEYLESS_NO_LOG_ENTRY,   /* not logged (or no signed entry timestamp) */
	KEYLESS_LOG_UNTRUSTED,  /* the SET, proof or checkpoint does not verify */
	KEYLESS_LOG_MISMATCH,   /* the entry is for another signature/cert/payload */
	KEYLESS_UNTRUSTED_ROOT, /* the certificate does not chain to a trusted CA */
	KEYLESS_EXPIRED,        /* not valid at the entry's integrated time */
	KEYLESS_NO_SCT,         /* CT log keys are trusted, no SCT verifies */
	KEYLESS_BAD_SIGNATURE,  /* the signature does not verify with the cert */
	KEYLESS_WRONG_IMAGE,    /* the payload names another image */
	KEYLESS_ISSUER,         /* no rule accepts the OIDC issuer */
	KEYLESS_SUBJECT,        /* a rule accepts the issuer, none the subject */
};

/* A short name for the cause ("issuer", "subject", "untrusted-root",
 * "expired-at-integration", "no-log-entry", ...); static. */
const char *keyless_cause_name(enum keyless_cause c);

/* What a keyless verification found out (filled on success, and as far as
 * it got on failure). */
struct keyless_result {
	enum keyless_cause cause;
	char identity[256]; /* the SAN that matched (or the first one) */
	char issuer[256];
	char rule[96];                  /* the rule's name */
	char rule_id[SIGNATURE_FP_MAX]; /* sig_keyless_rule_id() of that rule */
	int64_t integrated_time;        /* seconds since the epoch; 0: unknown */
	int64_t log_index;
	bool inclusion_proof; /* the entry's inclusion proof verified too */
};

/* One identity rule. Exactly one of issuer/issuer_regexp and one of
 * subject/subject_regexp. Regular expressions are POSIX extended, with
 * \d \w \s (and \D \W \S) outside brackets as in Go; like cosign's they
 * match anywhere in the value unless anchored with ^ and $. */
struct keyless_rule_spec {
	const char *name; /* NULL: "rule N" */
	const char *issuer, *issuer_regexp;
	const char *subject, *subject_regexp;
};

__attribute__((warn_unused_result)) int sig_keyless_new(struct sig_keyless **out);
void sig_keyless_free(struct sig_keyless *kl);

/* Trusted material. Each returns 0, or -EINVAL with why naming what is
 * wrong ("certificateAuthorities[1]: certificate 2: not DER"). */
__attribute__((warn_unused_result)) int sig_keyless_add_trusted_root(struct sig_keyless *kl,
                                                                     const char *json, size_t len,
                                                                     char *why, size_t whylen);
/* Every CERTIFICATE block of pem, each its own CA (valid at any time). */
__attribute__((warn_unused_result)) int sig_keyless_add_ca_pem(struct sig_keyless *kl,
                                                               const char *pem, size_t len,
                                                               char *why, size_t whylen);
/* Every PUBLIC KEY block of pem, as a transparency log (Rekor) key, or a
 * CT log key when ctlog. */
__attribute__((warn_unused_result)) int sig_keyless_add_log_pem(struct sig_keyless *kl,
                                                                const char *pem, size_t len,
                                                                bool ctlog, char *why,
                                                                size_t whylen);

/* Rules. */
__attribute__((warn_unused_result)) int sig_keyless_add_rule(struct sig_keyless *kl,
                                                             const struct keyless_rule_spec *r,
                                                             char *why, size_t whylen);
/* A YAML or JSON list of {name, issuer | issuerRegExp, subject |
 * subjectRegExp} (a mapping with "identities:" holding the list also). */
__attribute__((warn_unused_result)) int sig_keyless_add_rules_text(struct sig_keyless *kl,
                                                                   const char *text, size_t len,
                                                                   char *why, size_t whylen);

/* 0 when kl can verify anything: at least one CA, one log key and one
 * rule; else -EINVAL with why saying what is missing. */
__attribute__((warn_unused_result)) int sig_keyless_complete(const struct sig_keyless *kl,
                                                             char *why, size_t whylen);

size_t sig_keyless_nrules(const struct sig_keyless *kl);
size_t sig_keyless_ncas(const struct sig_keyless *kl);
size_t sig_keyless_nlogs(const struct sig_keyless *kl, bool ctlog);

/* "sha256:<hex>" over the trusted material and the rules (equal content,
 * equal fingerprint). Borrowed until kl changes or is freed. */
const char *sig_keyless_fingerprint(const struct sig_keyless *kl);
/* The id of rule i, "sha256:<hex>" of the trusted root and the rule: what a
 * verdict names as its "key" fingerprint, so a node can tell whether what
 * verified a cache is still trusted. NULL past the end. */
const char *sig_keyless_rule_id(const struct sig_keyless *kl, size_t i);
const char *sig_keyless_rule_name(const struct sig_keyless *kl, size_t i);
bool sig_keyless_has(const struct sig_keyless *kl, const char *rule_id);

/* Verify a simple-signing signature as cosign writes it keyless: the
 * payload blob, its base64 signature annotation, and the certificate, chain
 * and bundle annotations (chain and bundle may be NULL). 0 when accepted;
 * else -EKEYREJECTED (a trust check failed), -EBADMSG (malformed) or
 * -EMSGSIZE, with res->cause and why. */
__attribute__((warn_unused_result)) int
sig_keyless_verify_simple(const struct sig_keyless *kl, const char *image_digest,
                          const void *payload, size_t len, const char *signature_b64,
                          const char *cert_pem, const char *chain_pem, const char *rekor_bundle,
                          struct keyless_result *res, char *why, size_t whylen);

/* Verify a sigstore bundle (v0.1, v0.2, v0.3) with a certificate (or chain)
 * and a transparency log entry, over a DSSE envelope. Same returns. */
__attribute__((warn_unused_result)) int sig_keyless_verify_bundle(const struct sig_keyless *kl,
                                                                  const char *image_digest,
                                                                  const void *bundle, size_t len,
                                                                  struct keyless_result *res,
                                                                  char *why, size_t whylen);

/* The identity and issuer a keyless candidate's certificate claims,
 * unverified (what `gkm cache inspect` shows before any trust is given).
 * 0, or -ENOENT when it carries no readable certificate. */
__attribute__((warn_unused_result)) int sig_keyless_claims(const struct sig_candidate *c,
                                                           char *identity, size_t idcap,
                                                           char *issuer, size_t isscap);

/* Whether a candidate is signed keyless: a simple signature with a
 * certificate annotation, or a bundle whose verification material is a
 * certificate rather than a public key. */
bool sig_keyless_candidate(const struct sig_candidate *c);

#endif
