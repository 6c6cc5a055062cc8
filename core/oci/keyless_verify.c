/* Keyless verification in order (keyless.h): the log entry, the entry's
 * body against this signature, the certificate at the entry's time, its
 * SCTs, the signature and payload, then the identity rules. And the one
 * call that verifies a candidate whichever way it was signed. */
#include "keyless_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "errbuf.h"

#define MAX_TLOG_ENTRIES 8

const char *keyless_cause_name(enum keyless_cause c)
{
	static const char *const names[] = {"ok",
	                                    "malformed",
	                                    "no-certificate",
	                                    "no-log-entry",
	                                    "log-untrusted",
	                                    "log-mismatch",
	                                    "untrusted-root",
	                                    "expired-at-integration",
	                                    "no-sct",
	                                    "bad-signature",
	                                    "payload",
	                                    "issuer",
	                                    "subject"};
	return (unsigned)c < sizeof(names) / sizeof(names[0]) ? names[c] : "?";
}

/* What the two forms hand to the common checks. */
struct keyless_input {
	X509 *leaf;
	STACK_OF(X509) * chain; /* untrusted intermediates, may be NULL */
	struct kl_signed s;
	const struct kl_entry *entries;
	size_t nentries;
	/* the signature and payload, checked with the certificate's key */
	bool bundle;
	const void *data;
	size_t len;
	const char *signature_b64;
};

/* The signature and payload, checked as with a trusted key: the
 * certificate's key in a set of one. */
static int signature_ok(const struct keyless_input *in, const char *digest,
                        struct keyless_result *res, char *why, size_t whylen)
{
	struct sig_keyset *ks = NULL;
	struct sig_key *k = NULL;
	char *pem = kl_cert_pubkey_pem(in->leaf), one[300] = "";
	int rc = pem ? sig_keyset_new(&ks) : -ENOMEM;
	if (rc == 0 && (rc = sig_key_load_public(pem, strlen(pem), &k, one, sizeof(one))) == 0 &&
	    (rc = sig_keyset_add(ks, k)) != 0)
		sig_key_free(k);
	if (rc == 0)
		rc = in->bundle
		         ? sig_verify_bundle(ks, digest, in->data, in->len, NULL, one, sizeof(one))
		         : sig_verify_simple(ks, digest, in->data, in->len, in->signature_b64, NULL,
		                             one, sizeof(one));
	sig_keyset_free(ks);
	free(pem);
	if (rc == -EKEYREJECTED) {
		res->cause = KEYLESS_BAD_SIGNATURE;
		errbuf_set(why, whylen, "the signature does not verify with the certificate's key");
		return -EKEYREJECTED;
	}
	if (rc) {
		res->cause = rc == -EBADMSG ? KEYLESS_WRONG_IMAGE : KEYLESS_MALFORMED;
		errbuf_set(why, whylen, "payload: %s", one);
	}
	return rc;
}

/* The first entry that verifies and is this signature's. */
static int log_ok(const struct sig_keyless *kl, const struct keyless_input *in,
                  struct keyless_result *res, char *why, size_t whylen)
{
	int rc = -EKEYREJECTED;
	if (in->nentries == 0) {
		res->cause = KEYLESS_NO_LOG_ENTRY;
		errbuf_set(why, whylen,
		           "no log entry: the signature carries no transparency log entry (it "
		           "was not recorded in Rekor)");
		return rc;
	}
	for (size_t i = 0; i < in->nentries; i++) {
		struct keyless_result r = *res;
		char one[400];
		if ((rc = kl_entry_verify(kl, &in->entries[i], &r, one, sizeof(one))) == 0 &&
		    (rc = kl_entry_match(&in->entries[i], &in->s, one, sizeof(one))) != 0)
			r.cause = KEYLESS_LOG_MISMATCH;
		if (rc == 0 || i == 0) {
			*res = r;
			errbuf_set(why, whylen, "%s", one);
		}
		if (rc == 0)
			return 0;
	}
	return rc;
}

static int verify_common(const struct sig_keyless *kl, const char *digest,
                         const struct keyless_input *in, struct keyless_result *res, char *why,
                         size_t whylen)
{
	X509 *issuer = NULL;
	char iss[256], **sans = NULL;
	size_t nsans = 0;
	int rc;
	if ((rc = log_ok(kl, in, res, why, whylen)) ||
	    (rc = kl_cert_verify(kl, in->leaf, in->chain, res->integrated_time, &issuer, res, why,
	                         whylen)) ||
	    (rc = kl_cert_sct(kl, in->leaf, issuer, res, why, whylen)) ||
	    (rc = signature_ok(in, digest, res, why, whylen)))
		goto out;
	if ((rc = kl_cert_identity(in->leaf, iss, sizeof(iss), &sans, &nsans)))
		goto out;
	rc = kl_rules_match(kl, iss, sans, nsans, res, why, whylen);
out:
	if (rc == 0)
		res->cause = KEYLESS_OK;
	kl_sans_free(sans, nsans);
	X509_free(issuer);
	return rc;
}

static int refuse(struct keyless_result *res, enum keyless_cause c, int rc, char *why,
                  size_t whylen, const char *msg)
{
	res->cause = c;
	errbuf_set(why, whylen, "%s", msg);
	return rc;
}

static bool ready(const struct sig_keyless *kl, const char *digest, struct keyless_result *res,
                  char *why, size_t whylen)
{
	memset(res, 0, sizeof(*res));
	if (kl && sig_keyless_complete(kl, why, whylen) == 0)
		return digest != NULL;
	if (!kl)
		errbuf_set(why, whylen, "no keyless trust configured");
	res->cause = KEYLESS_UNTRUSTED_ROOT;
	return false;
}

int sig_keyless_verify_simple(const struct sig_keyless *kl, const char *image_digest,
                              const void *payload, size_t len, const char *signature_b64,
                              const char *cert_pem, const char *chain_pem, const char *rekor_bundle,
                              struct keyless_result *res, char *why, size_t whylen)
{
	struct keyless_input in;
	struct kl_entry entry;
	STACK_OF(X509) *certs = NULL;
	unsigned char *sig = NULL;
	int rc;
	memset(&in, 0, sizeof(in));
	memset(&entry, 0, sizeof(entry));
	if (!ready(kl, image_digest, res, why, whylen))
		return -ENOKEY;
	if (len > SIGNATURE_MAX_PAYLOAD)
		return refuse(res, KEYLESS_MALFORMED, -EMSGSIZE, why, whylen, "payload too large");
	if (!cert_pem)
		return refuse(res, KEYLESS_NO_CERTIFICATE, -EKEYREJECTED, why, whylen,
		              "no certificate (dev.sigstore.cosign/certificate) to take an "
		              "identity from");
	if ((rc = kl_certs_from_pem(cert_pem, strlen(cert_pem), &certs, why, whylen)) ||
	    (chain_pem &&
	     (rc = kl_certs_from_pem(chain_pem, strlen(chain_pem), &in.chain, why, whylen)))) {
		res->cause = KEYLESS_MALFORMED;
		goto out;
	}
	in.leaf = sk_X509_value(certs, 0);
	if (!signature_b64 || base64_decode(signature_b64, strlen(signature_b64), BASE64_STD, &sig,
	                                    &in.s.sig_len, NULL)) {
		rc = refuse(res, KEYLESS_MALFORMED, -EBADMSG, why, whylen,
		            "the signature annotation is not base64");
		goto out;
	}
	in.s.sig = sig;
	in.s.cert = in.leaf;
	kl_sha256(payload, len, in.s.payload_sha256);
	if (rekor_bundle) {
		if ((rc = kl_entry_from_annotation(rekor_bundle, &entry, why, whylen))) {
			res->cause = KEYLESS_MALFORMED;
			goto out;
		}
		in.entries = &entry;
		in.nentries = 1;
	}
	in.data = payload;
	in.len = len;
	in.signature_b64 = signature_b64;
	rc = verify_common(kl, image_digest, &in, res, why, whylen);
out:
	kl_entry_clear(&entry);
	free(sig);
	kl_certs_free(certs);
	kl_certs_free(in.chain);
	return rc;
}

/* The leaf and the untrusted rest of a bundle's verification material. */
static int bundle_certs(const cJSON *vm, X509 **leaf, STACK_OF(X509) * *chain, char *why,
                        size_t whylen)
{
	const cJSON *one = cJSON_GetObjectItemCaseSensitive(vm, "certificate");
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(vm, "x509CertificateChain"), "certificates");
	const cJSON *c;
	int i = 0;
	if (one) {
		unsigned char *der = NULL;
		size_t n = 0;
		if (kl_b64(kl_jstr(one, "rawBytes"), &der, &n) == 0)
			*leaf = kl_cert_from_der(der, n);
		free(der);
		return *leaf ? 0 : -EBADMSG;
	}
	if (!cJSON_IsArray(list) || !cJSON_GetArraySize(list) || cJSON_GetArraySize(list) > 8 ||
	    !(*chain = sk_X509_new_null()))
		return -EBADMSG;
	cJSON_ArrayForEach(c, list)
	{
		unsigned char *der = NULL;
		size_t n = 0;
		X509 *x =
		    kl_b64(kl_jstr(c, "rawBytes"), &der, &n) == 0 ? kl_cert_from_der(der, n) : NULL;
		free(der);
		if (!x) {
			errbuf_set(why, whylen, "x509CertificateChain: certificate %d is not DER",
			           i + 1);
			return -EBADMSG;
		}
		if (i++ == 0)
			*leaf = x;
		else if (!sk_X509_push(*chain, x)) {
			X509_free(x);
			return -ENOMEM;
		}
	}
	return 0;
}

/* The DSSE envelope's one signature and the payload's hash. */
static int bundle_dsse(const cJSON *env, unsigned char **sig, struct kl_signed *s)
{
	const cJSON *sigs = cJSON_GetObjectItemCaseSensitive(env, "signatures");
	unsigned char *payload = NULL;
	size_t plen = 0;
	if (cJSON_GetArraySize(sigs) != 1 || kl_b64(kl_jstr(env, "payload"), &payload, &plen))
		return -EBADMSG;
	kl_sha256(payload, plen, s->payload_sha256);
	free(payload);
	if (kl_b64(kl_jstr(cJSON_GetArrayItem(sigs, 0), "sig"), sig, &s->sig_len))
		return -EBADMSG;
	s->sig = *sig;
	s->dsse = true;
	return 0;
}

int sig_keyless_verify_bundle(const struct sig_keyless *kl, const char *image_digest,
                              const void *bundle, size_t len, struct keyless_result *res, char *why,
                              size_t whylen)
{
	struct keyless_input in;
	struct kl_entry entries[MAX_TLOG_ENTRIES];
	size_t n = 0;
	unsigned char *sig = NULL;
	cJSON *j = NULL;
	int rc = -EBADMSG;
	memset(&in, 0, sizeof(in));
	if (!ready(kl, image_digest, res, why, whylen))
		return -ENOKEY;
	if (len > SIGNATURE_MAX_BUNDLE)
		return refuse(res, KEYLESS_MALFORMED, -EMSGSIZE, why, whylen, "bundle too large");
	j = cJSON_ParseWithLength(bundle, len);
	const cJSON *vm = cJSON_GetObjectItemCaseSensitive(j, "verificationMaterial");
	const cJSON *tl = cJSON_GetObjectItemCaseSensitive(vm, "tlogEntries"), *e;
	tl = cJSON_IsArray(tl) ? tl : NULL;
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(j, "dsseEnvelope");
	res->cause = KEYLESS_MALFORMED;
	if (!cJSON_IsObject(vm)) {
		errbuf_set(why, whylen, "the bundle has no verificationMaterial");
		goto out;
	}
	if (!cJSON_GetObjectItemCaseSensitive(vm, "x509CertificateChain") &&
	    !cJSON_GetObjectItemCaseSensitive(vm, "certificate")) {
		rc = refuse(res, KEYLESS_NO_CERTIFICATE, -EKEYREJECTED, why, whylen,
		            "the bundle has no certificate to take an identity from");
		goto out;
	}
	errbuf_set(why, whylen, "the bundle's certificate is not DER");
	if ((rc = bundle_certs(vm, &in.leaf, &in.chain, why, whylen)))
		goto out;
	if (!cJSON_IsObject(env) || (rc = bundle_dsse(env, &sig, &in.s))) {
		rc = refuse(res, KEYLESS_MALFORMED, -EBADMSG, why, whylen,
		            "the bundle has no DSSE envelope with one signature");
		goto out;
	}
	in.s.cert = in.leaf;
	cJSON_ArrayForEach(e, tl)
	{
		if (n == MAX_TLOG_ENTRIES)
			break;
		if ((rc = kl_entry_from_bundle(e, &entries[n], why, whylen)))
			goto out;
		n++;
	}
	/* from v0.2 on, a bundle's entries carry inclusion proofs (the bundle
	 * format says so; sigstore-js and sigstore-go refuse one without) */
	const char *mt = kl_jstr(j, "mediaType");
	bool v01 = mt && strstr(mt, "version=0.1");
	for (size_t i = 0; i < n && !v01; i++) {
		if (!entries[i].has_proof) {
			rc =
			    refuse(res, KEYLESS_NO_LOG_ENTRY, -EKEYREJECTED, why, whylen,
			           "no log entry with an inclusion proof, which a bundle from v0.2 "
			           "on must carry");
			goto out;
		}
	}
	in.entries = entries;
	in.nentries = n;
	in.bundle = true;
	in.data = bundle;
	in.len = len;
	rc = verify_common(kl, image_digest, &in, res, why, whylen);
out:
	for (size_t i = 0; i < n; i++)
		kl_entry_clear(&entries[i]);
	free(sig);
	X509_free(in.leaf);
	kl_certs_free(in.chain);
	cJSON_Delete(j);
	return rc;
}

int sig_keyless_claims(const struct sig_candidate *c, char *identity, size_t idcap, char *issuer,
                       size_t isscap)
{
	X509 *leaf = NULL;
	STACK_OF(X509) *certs = NULL, *chain = NULL;
	char **sans = NULL, why[128];
	size_t nsans = 0;
	int rc = -ENOENT;
	if (c->kind == SIG_KIND_SIMPLE && c->certificate_pem &&
	    kl_certs_from_pem(c->certificate_pem, strlen(c->certificate_pem), &certs, why,
	                      sizeof(why)) == 0)
		leaf = X509_dup(sk_X509_value(certs, 0));
	if (c->kind == SIG_KIND_BUNDLE && c->len <= SIGNATURE_MAX_BUNDLE) {
		cJSON *j = cJSON_ParseWithLength(c->data, c->len);
		if (bundle_certs(cJSON_GetObjectItemCaseSensitive(j, "verificationMaterial"), &leaf,
		                 &chain, why, sizeof(why)) != 0) {
			X509_free(leaf);
			leaf = NULL;
		}
		cJSON_Delete(j);
	}
	if (leaf && kl_cert_identity(leaf, issuer, isscap, &sans, &nsans) == 0) {
		snprintf(identity, idcap, "%s", nsans ? sans[0] : "");
		rc = 0;
	}
	kl_sans_free(sans, nsans);
	X509_free(leaf);
	kl_certs_free(certs);
	kl_certs_free(chain);
	return rc;
}

bool sig_keyless_candidate(const struct sig_candidate *c)
{
	if (c->kind == SIG_KIND_SIMPLE)
		return c->certificate_pem != NULL;
	if (c->kind != SIG_KIND_BUNDLE || c->len > SIGNATURE_MAX_BUNDLE)
		return false;
	cJSON *j = cJSON_ParseWithLength(c->data, c->len);
	const cJSON *vm = cJSON_GetObjectItemCaseSensitive(j, "verificationMaterial");
	bool yes = cJSON_GetObjectItemCaseSensitive(vm, "certificate") ||
	           cJSON_GetObjectItemCaseSensitive(vm, "x509CertificateChain");
	cJSON_Delete(j);
	return yes;
}

/* ---- one candidate, whichever way it was signed ---- */

static int by_key(const struct sig_keyset *ks, const char *digest, const struct sig_candidate *c,
                  struct sig_verdict *v, char *why, size_t whylen)
{
	if (c->kind == SIG_KIND_SIMPLE)
		return sig_verify_simple(ks, digest, c->data, c->len, c->signature_b64,
		                         v->key_fingerprint, why, whylen);
	if (c->kind == SIG_KIND_BUNDLE)
		return sig_verify_bundle(ks, digest, c->data, c->len, v->key_fingerprint, why,
		                         whylen);
	errbuf_set(why, whylen, "unknown signature kind");
	return -EINVAL;
}

static int by_identity(const struct sig_keyless *kl, const char *digest,
                       const struct sig_candidate *c, struct sig_verdict *v, char *why,
                       size_t whylen)
{
	struct keyless_result r;
	int rc = c->kind == SIG_KIND_SIMPLE
	             ? sig_keyless_verify_simple(kl, digest, c->data, c->len, c->signature_b64,
	                                         c->certificate_pem, c->chain_pem, c->rekor_bundle,
	                                         &r, why, whylen)
	             : sig_keyless_verify_bundle(kl, digest, c->data, c->len, &r, why, whylen);
	if (rc)
		return rc;
	snprintf(v->key_fingerprint, sizeof(v->key_fingerprint), "%s", r.rule_id);
	snprintf(v->identity, sizeof(v->identity), "%s", r.identity);
	snprintf(v->issuer, sizeof(v->issuer), "%s", r.issuer);
	snprintf(v->rule, sizeof(v->rule), "%s", r.rule);
	v->integrated_time = r.integrated_time;
	return 0;
}

int sig_verify_one(const struct sig_keyset *ks, const char *image_digest,
                   const struct sig_candidate *c, struct sig_verdict *out)
{
	struct sig_verdict v;
	const struct sig_keyless *kl = sig_keyset_keyless(ks);
	bool keyless = sig_keyless_candidate(c);
	char why[400] = "";
	int rc = -ENOKEY;
	memset(&v, 0, sizeof(v));
	v.kind = c->kind;
	if (ks && sig_keyset_nkeys(ks) > 0)
		rc = by_key(ks, image_digest, c, &v, why, sizeof(why));
	/* a certificate's signature is judged by its identity, unless a
	 * trusted key verified it (cosign sign --key with a certificate) */
	if (rc && keyless && kl)
		rc = by_identity(kl, image_digest, c, &v, why, sizeof(why));
	else if (rc && keyless && !why[0])
		errbuf_set(why, sizeof(why),
		           "signed keyless (it carries a Fulcio certificate), and no keyless trust "
		           "(trusted root and identity rules) is configured");
	else if (rc && keyless)
		errbuf_set(why + strlen(why), sizeof(why) - strlen(why),
		           " (it carries a certificate; no keyless trust is configured)");
	else if (rc && !why[0])
		errbuf_set(why, sizeof(why), "signed with a key, and no trusted key is configured");
	const char *src = c->source ? c->source : "";
	const char *kind = c->kind == SIG_KIND_BUNDLE ? "bundle" : "simple-signing";
	if (rc) {
		errbuf_set(v.reason, sizeof(v.reason), "%s%s", keyless && kl ? "keyless: " : "",
		           why);
	} else if (v.rule[0]) {
		char at[32];
		kl_time_text(v.integrated_time, at, sizeof(at));
		errbuf_set(v.reason, sizeof(v.reason),
		           "%s signature%s%s verified keyless: identity %s, issuer %s, rule '%s', "
		           "logged at %s",
		           kind, src[0] ? " " : "", src, v.identity, v.issuer, v.rule, at);
	} else {
		errbuf_set(v.reason, sizeof(v.reason), "%s signature%s%s verified with key %s",
		           kind, src[0] ? " " : "", src, v.key_fingerprint);
	}
	v.accepted = rc == 0;
	*out = v;
	return rc;
}
