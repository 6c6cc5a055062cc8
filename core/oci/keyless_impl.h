/* What the keyless verifier's parts share (keyless_root.c: trusted material
 * and rules; keyless_tlog.c: transparency log entries; keyless_cert.c:
 * certificates; keyless_verify.c: the checks in order). Not for other
 * files: they use keyless.h. */
#ifndef GKM_KEYLESS_IMPL_H
#define GKM_KEYLESS_IMPL_H

#include <cjson/cJSON.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <regex.h>

#include "keyless.h"

#define KL_FOREVER INT64_MAX
#define kl_certs_free(sk) sk_X509_pop_free((sk), X509_free)

/* A CA of the trusted root: its certificates (roots and intermediates),
 * valid for [start, end]. */
struct kl_ca {
	X509_STORE *store;
	STACK_OF(X509) * certs;
	int64_t start, end;
};

/* A log's key (Rekor or CT), with its id: sha256 of the DER public key. */
struct kl_log {
	EVP_PKEY *key;
	unsigned char id[32];
	int64_t start, end;
};

struct kl_match {
	char *text; /* exact */
	regex_t re; /* or compiled */
	bool is_re;
};

struct kl_rule {
	char name[96];
	char desc[600]; /* for messages: "issuer X, subject ~ Y" */
	struct kl_match issuer, subject;
	char id[SIGNATURE_FP_MAX];
};

struct sig_keyless {
	struct kl_ca cas[KEYLESS_MAX_CAS];
	size_t ncas;
	struct kl_log tlogs[KEYLESS_MAX_LOGS], ctlogs[KEYLESS_MAX_LOGS];
	size_t ntlogs, nctlogs;
	struct kl_rule rules[KEYLESS_MAX_RULES];
	size_t nrules;
	char fp[SIGNATURE_FP_MAX];
	EVP_MD_CTX *material; /* running hash of the trusted material added */
};

/* ---- helpers (keyless_root.c) ---- */

const char *kl_jstr(const cJSON *o, const char *key);
/* An int64 field written as a JSON number or a decimal string (protobuf's
 * JSON mapping). -EINVAL when missing or not an integer. */
int kl_jint(const cJSON *o, const char *key, int64_t *out);
/* Decode base64 (standard or URL-safe, as protobuf's JSON mapping reads
 * bytes); caller frees. -EBADMSG. */
int kl_b64(const char *text, unsigned char **out, size_t *len);
/* RFC 3339 ("2021-03-07T03:20:29.000Z", offsets allowed) to epoch seconds. */
void kl_time_text(int64_t t, char *buf, size_t cap);
void kl_sha256(const void *p, size_t n, unsigned char out[32]);
/* Verify sig over msg with key: SHA-256 for ECDSA P-256 and RSA, SHA-384
 * for P-384 (then SHA-256), none for Ed25519. */
bool kl_verify_sig(EVP_PKEY *key, const void *msg, size_t len, const unsigned char *sig,
                   size_t siglen);

/* ---- rules (keyless_rules.c) ---- */

int kl_rule_compile(const struct keyless_rule_spec *s, size_t index, struct kl_rule *out, char *why,
                    size_t whylen);
void kl_rule_clear(struct kl_rule *r);
/* The first rule matching issuer and one of the SANs: 0 and res->rule,
 * rule_id and identity; else KEYLESS_ISSUER or KEYLESS_SUBJECT in res->cause
 * and why. */
int kl_rules_match(const struct sig_keyless *kl, const char *issuer, char *const *sans,
                   size_t nsans, struct keyless_result *res, char *why, size_t whylen);

/* ---- transparency log entries (keyless_tlog.c) ---- */

struct kl_entry {
	unsigned char *body; /* canonicalized body */
	size_t body_len;
	int64_t integrated_time, log_index;
	unsigned char log_id[32];
	bool has_log_id;
	unsigned char *set; /* signed entry timestamp; NULL: none */
	size_t set_len;
	char kind[32], version[16]; /* kindVersion (bundles) */
	/* inclusion proof */
	bool has_proof;
	int64_t proof_index, tree_size;
	unsigned char root_hash[32];
	unsigned char (*hashes)[32];
	size_t nhashes;
	char *checkpoint;
};

void kl_entry_clear(struct kl_entry *e);
/* cosign's dev.sigstore.cosign/bundle annotation ({SignedEntryTimestamp,
 * Payload: {body, integratedTime, logIndex, logID}}). */
int kl_entry_from_annotation(const char *json, struct kl_entry *e, char *why, size_t whylen);
/* One element of a bundle's verificationMaterial.tlogEntries. */
int kl_entry_from_bundle(const cJSON *j, struct kl_entry *e, char *why, size_t whylen);
/* SET and inclusion proof against the trusted logs; res->integrated_time
 * set when a SET verifies. KEYLESS_NO_LOG_ENTRY or KEYLESS_LOG_UNTRUSTED. */
int kl_entry_verify(const struct sig_keyless *kl, const struct kl_entry *e,
                    struct keyless_result *res, char *why, size_t whylen);

/* What the entry's body must name. */
struct kl_signed {
	const unsigned char *sig; /* the signature bytes */
	size_t sig_len;
	unsigned char payload_sha256[32]; /* of the payload (simple) or DSSE payload */
	X509 *cert;                       /* the leaf */
	bool dsse;
};
int kl_entry_match(const struct kl_entry *e, const struct kl_signed *s, char *why, size_t whylen);

/* ---- certificates (keyless_cert.c) ---- */

/* The next PEM block of b: 1 (caller frees name and data with
 * OPENSSL_free), 0 at the end, -EBADMSG for a malformed one. */
int kl_pem_next(BIO *b, char **name, unsigned char **data, long *len);
/* Every CERTIFICATE block of pem (up to max). -EBADMSG. */
int kl_certs_from_pem(const char *pem, size_t len, STACK_OF(X509) * *out, char *why, size_t whylen);
X509 *kl_cert_from_der(const unsigned char *der, size_t len);
/* Chain leaf (with untrusted intermediates) to a CA of kl, and check it was
 * valid at time t and may sign code. KEYLESS_UNTRUSTED_ROOT or
 * KEYLESS_EXPIRED; on success *issuer (the leaf's issuer, caller frees). */
int kl_cert_verify(const struct sig_keyless *kl, X509 *leaf, STACK_OF(X509) * chain, int64_t t,
                   X509 **issuer, struct keyless_result *res, char *why, size_t whylen);
/* With CT log keys trusted: one embedded SCT verifies. KEYLESS_NO_SCT. */
int kl_cert_sct(const struct sig_keyless *kl, X509 *leaf, X509 *issuer, struct keyless_result *res,
                char *why, size_t whylen);
/* The OIDC issuer and SANs of a Fulcio certificate (caller frees sans with
 * kl_sans_free). */
int kl_cert_identity(X509 *leaf, char *issuer, size_t cap, char ***sans, size_t *nsans);
void kl_sans_free(char **sans, size_t n);
/* The leaf's public key as PEM (for a one-key sig_keyset); caller frees. */
char *kl_cert_pubkey_pem(X509 *leaf);

#endif
