/* A sigstore of the tests' own, made with OpenSSL: a Fulcio-like CA that
 * issues 10-minute certificates carrying the OIDC extensions, a Rekor-like
 * log that signs entry timestamps and checkpoints and keeps a Merkle tree,
 * and a CT-like log that signs SCTs. It writes what cosign writes: the
 * simple-signing payload, signature and its certificate, chain and bundle
 * annotations, sigstore bundles (v0.1 to v0.3) with DSSE envelopes, and a
 * trusted_root.json naming it all.
 *
 * Header-only (static functions) for the unit tests and the fixture tool
 * spec/lib/fake_sigstore.c. Failures abort: a fixture that cannot be made
 * is a broken test, not a result. */
#ifndef GKM_FAKE_SIGSTORE_H
#define GKM_FAKE_SIGSTORE_H

#include <openssl/ct.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base64.h"

#define FS_GITHUB "https://token.actions.githubusercontent.com"

static void fs_die(const char *what)
{
	fprintf(stderr, "fake sigstore: %s\n", what);
	ERR_print_errors_fp(stderr);
	abort();
}

static void *fs_check(void *p, const char *what)
{
	if (!p)
		fs_die(what);
	return p;
}

static char *fs_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fs_printf(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		fs_die("vasprintf");
	va_end(ap);
	return s;
}

static char *fs_b64(const void *p, size_t n)
{
	char *s = NULL;
	if (base64_encode(p, n, &s))
		fs_die("base64");
	return s;
}

static void fs_sha256(const void *p, size_t n, unsigned char out[32])
{
	unsigned int l = 32;
	EVP_Digest(p, n, out, &l, EVP_sha256(), NULL);
}

static void fs_hex(const unsigned char *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

static EVP_PKEY *fs_p256(void)
{
	return fs_check(EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256"), "keygen");
}

/* ECDSA P-256 / SHA-256, DER. Caller frees *sig. */
static size_t fs_sign(EVP_PKEY *k, const void *msg, size_t len, unsigned char **sig)
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	size_t n = 0;
	if (!c || EVP_DigestSignInit(c, NULL, EVP_sha256(), NULL, k) != 1 ||
	    EVP_DigestSign(c, NULL, &n, msg, len) != 1 || !(*sig = malloc(n)) ||
	    EVP_DigestSign(c, *sig, &n, msg, len) != 1)
		fs_die("sign");
	EVP_MD_CTX_free(c);
	return n;
}

static char *fs_sign_b64(EVP_PKEY *k, const void *msg, size_t len)
{
	unsigned char *sig = NULL;
	size_t n = fs_sign(k, msg, len, &sig);
	char *s = fs_b64(sig, n);
	free(sig);
	return s;
}

static size_t fs_der_pubkey(EVP_PKEY *k, unsigned char **der)
{
	*der = NULL;
	int n = i2d_PUBKEY(k, der);
	if (n <= 0)
		fs_die("i2d_PUBKEY");
	return (size_t)n;
}

/* What was written into a memory BIO, as a string; frees b. */
static char *fs_bio_text(BIO *b, int written, const char *what)
{
	char *p;
	if (!b || !written)
		fs_die(what);
	long n = BIO_get_mem_data(b, &p);
	char *s = strndup(p, (size_t)n);
	BIO_free(b);
	return s;
}

static char *fs_pem_cert(X509 *x)
{
	BIO *b = BIO_new(BIO_s_mem());
	return fs_bio_text(b, b && PEM_write_bio_X509(b, x), "PEM cert");
}

static char *fs_pem_pubkey(EVP_PKEY *k)
{
	BIO *b = BIO_new(BIO_s_mem());
	return fs_bio_text(b, b && PEM_write_bio_PUBKEY(b, k), "PEM key");
}

static char *fs_der_b64_cert(X509 *x)
{
	unsigned char *der = NULL;
	int n = i2d_X509(x, &der);
	if (n <= 0)
		fs_die("i2d_X509");
	char *s = fs_b64(der, (size_t)n);
	OPENSSL_free(der);
	return s;
}

/* ---- the CA ---- */

struct fs_ca {
	EVP_PKEY *key;
	X509 *cert;
};

static void fs_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
	X509_EXTENSION *e = fs_check(X509V3_EXT_conf_nid(NULL, &ctx, nid, value), value);
	X509_add_ext(x, e, -1);
	X509_EXTENSION_free(e);
}

static X509 *fs_cert_base(const char *cn, EVP_PKEY *key, int64_t nb, int64_t na, long serial)
{
	X509 *x = fs_check(X509_new(), "X509_new");
	X509_set_version(x, 2);
	ASN1_INTEGER_set(X509_get_serialNumber(x), serial);
	X509_time_adj_ex(X509_getm_notBefore(x), 0, (long)nb, NULL);
	X509_time_adj_ex(X509_getm_notAfter(x), 0, (long)na, NULL);
	X509_set_pubkey(x, key);
	if (cn)
		X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
		                           (const unsigned char *)cn, -1, -1, 0);
	return x;
}

/* A CA certificate for key: self-signed (parent NULL) or issued by parent. */
static struct fs_ca fs_ca_new(const char *cn, const struct fs_ca *parent, int64_t nb, int64_t na)
{
	static long serial = 1;
	struct fs_ca ca = {.key = fs_p256()};
	ca.cert = fs_cert_base(cn, ca.key, nb, na, serial++);
	X509 *issuer = parent ? parent->cert : ca.cert;
	X509_set_issuer_name(ca.cert, X509_get_subject_name(issuer));
	fs_ext(ca.cert, issuer, NID_basic_constraints, "critical,CA:TRUE");
	fs_ext(ca.cert, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
	fs_ext(ca.cert, issuer, NID_subject_key_identifier, "hash");
	if (!X509_sign(ca.cert, parent ? parent->key : ca.key, EVP_sha256()))
		fs_die("sign CA");
	return ca;
}

static void fs_ca_free(struct fs_ca *ca)
{
	EVP_PKEY_free(ca->key);
	X509_free(ca->cert);
	memset(ca, 0, sizeof(*ca));
}

/* ---- logs ---- */

struct fs_log {
	EVP_PKEY *key;
	unsigned char id[32];
	char origin[64];
};

/* A log of key (taken), its id the hash of its public key. */
static struct fs_log fs_log_of(EVP_PKEY *key, const char *origin)
{
	struct fs_log l = {.key = key};
	unsigned char *der = NULL;
	size_t n = fs_der_pubkey(l.key, &der);
	fs_sha256(der, n, l.id);
	OPENSSL_free(der);
	snprintf(l.origin, sizeof(l.origin), "%s", origin);
	return l;
}

static struct fs_log fs_log_new(const char *origin)
{
	return fs_log_of(fs_p256(), origin);
}

static void fs_log_free(struct fs_log *l)
{
	EVP_PKEY_free(l->key);
	memset(l, 0, sizeof(*l));
}

/* ---- the leaf ---- */

struct fs_leaf_opts {
	const char *issuer;    /* OID .1.8 (UTF8String) */
	const char *issuer_v1; /* OID .1.1 (raw), instead */
	const char *email, *uri;
	int64_t not_before; /* seconds from now */
	int64_t lifetime;   /* 0: 600 (Fulcio's 10 minutes) */
	bool no_code_signing;
	const struct fs_log *ctlog; /* embed an SCT it signs */
};

static void fs_raw_ext(X509 *x, const char *oid, const unsigned char *v, int n)
{
	ASN1_OBJECT *o = fs_check(OBJ_txt2obj(oid, 1), oid);
	ASN1_OCTET_STRING *s = ASN1_OCTET_STRING_new();
	ASN1_OCTET_STRING_set(s, v, n);
	X509_EXTENSION *e = fs_check(X509_EXTENSION_create_by_OBJ(NULL, o, 0, s), "ext");
	X509_add_ext(x, e, -1);
	X509_EXTENSION_free(e);
	ASN1_OCTET_STRING_free(s);
	ASN1_OBJECT_free(o);
}

static void fs_issuer_ext(X509 *x, const struct fs_leaf_opts *o)
{
	if (o->issuer_v1)
		fs_raw_ext(x, "1.3.6.1.4.1.57264.1.1", (const unsigned char *)o->issuer_v1,
		           (int)strlen(o->issuer_v1));
	if (!o->issuer)
		return;
	ASN1_UTF8STRING *u = ASN1_UTF8STRING_new();
	unsigned char *der = NULL;
	ASN1_STRING_set(u, o->issuer, -1);
	int n = i2d_ASN1_UTF8STRING(u, &der);
	fs_raw_ext(x, "1.3.6.1.4.1.57264.1.8", der, n);
	OPENSSL_free(der);
	ASN1_UTF8STRING_free(u);
}

static void fs_put_be(unsigned char *p, uint64_t v, int n)
{
	for (int i = n - 1; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)(v & 0xff);
}

/* An SCT by log over the precertificate x (signed, without SCTs yet). */
static void fs_add_sct(X509 *x, X509 *issuer, const struct fs_log *log)
{
	unsigned char *tbs = NULL, *spki = NULL, ikh[32], *sig = NULL;
	int tl = i2d_re_X509_tbs(x, &tbs);
	int sl = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(issuer), &spki);
	uint64_t ts = (uint64_t)time(NULL) * 1000;
	fs_sha256(spki, (size_t)sl, ikh);
	size_t n = 12 + 32 + 3 + (size_t)tl + 2;
	unsigned char *m = calloc(1, n), *p = m;
	p += 2; /* v1, certificate_timestamp */
	fs_put_be(p, ts, 8);
	p += 8;
	fs_put_be(p, 1, 2);
	p += 2;
	memcpy(p, ikh, 32);
	p += 32;
	fs_put_be(p, (uint64_t)tl, 3);
	memcpy(p + 3, tbs, (size_t)tl);
	size_t siglen = fs_sign(log->key, m, n, &sig);
	SCT *sct = SCT_new();
	SCT_set_version(sct, SCT_VERSION_V1);
	SCT_set_log_entry_type(sct, CT_LOG_ENTRY_TYPE_PRECERT);
	SCT_set1_log_id(sct, log->id, 32);
	SCT_set_timestamp(sct, ts);
	SCT_set_signature_nid(sct, NID_ecdsa_with_SHA256);
	SCT_set1_signature(sct, sig, siglen);
	STACK_OF(SCT) *list = sk_SCT_new_null();
	sk_SCT_push(list, sct);
	if (!X509_add1_ext_i2d(x, NID_ct_precert_scts, list, 0, 0))
		fs_die("SCT extension");
	SCT_LIST_free(list);
	free(sig);
	free(m);
	OPENSSL_free(tbs);
	OPENSSL_free(spki);
}

/* A Fulcio-like certificate for key, issued by ca. */
static X509 *fs_leaf(const struct fs_ca *ca, EVP_PKEY *key, const struct fs_leaf_opts *o)
{
	static long serial = 1000;
	int64_t life = o->lifetime ? o->lifetime : 600;
	X509 *x = fs_cert_base(NULL, key, o->not_before, o->not_before + life, serial++);
	X509_set_issuer_name(x, X509_get_subject_name(ca->cert));
	fs_ext(x, ca->cert, NID_key_usage, "critical,digitalSignature");
	if (!o->no_code_signing)
		fs_ext(x, ca->cert, NID_ext_key_usage, "codeSigning");
	fs_ext(x, ca->cert, NID_authority_key_identifier, "keyid:always");
	char *san = o->email ? fs_printf("critical,email:%s", o->email)
	                     : fs_printf("critical,URI:%s", o->uri);
	fs_ext(x, ca->cert, NID_subject_alt_name, san);
	free(san);
	fs_issuer_ext(x, o);
	if (!X509_sign(x, ca->key, EVP_sha256()))
		fs_die("sign leaf");
	if (o->ctlog) {
		fs_add_sct(x, ca->cert, o->ctlog);
		if (!X509_sign(x, ca->key, EVP_sha256()))
			fs_die("sign leaf again");
	}
	return x;
}

/* ---- payloads and log entries ---- */

static char *fs_simple_payload(const char *ref, const char *digest)
{
	return fs_printf("{\"critical\":{\"identity\":{\"docker-reference\":\"%s\"},\"image\":{"
	                 "\"docker-manifest-digest\":\"%s\"},\"type\":\"cosign container image "
	                 "signature\"},\"optional\":null}",
	                 ref, digest);
}

static char *fs_statement(const char *name, const char *digest)
{
	return fs_printf("{\"_type\":\"https://in-toto.io/Statement/v1\",\"subject\":[{\"name\":"
	                 "\"%s\",\"digest\":{\"sha256\":\"%s\"}}],\"predicateType\":\"https://"
	                 "sigstore.dev/cosign/sign/v1\",\"predicate\":{}}",
	                 name, digest + 7);
}

/* A Rekor body of kind (hashedrekord or dsse, 0.0.1) for one signature
 * over payload by cert. */
static char *fs_rekor_body(const char *kind, const void *payload, size_t len, const char *sig_b64,
                           X509 *cert)
{
	unsigned char h[32];
	char hex[65];
	char *pem = fs_pem_cert(cert), *pem64 = fs_b64(pem, strlen(pem)), *s;
	fs_sha256(payload, len, h);
	fs_hex(h, 32, hex);
	if (strcmp(kind, "dsse") == 0)
		s = fs_printf("{\"apiVersion\":\"0.0.1\",\"kind\":\"dsse\",\"spec\":{"
		              "\"envelopeHash\":{\"algorithm\":\"sha256\",\"value\":\"%s\"},"
		              "\"payloadHash\":{\"algorithm\":\"sha256\",\"value\":\"%s\"},"
		              "\"signatures\":[{\"signature\":\"%s\",\"verifier\":\"%s\"}]}}",
		              hex, hex, sig_b64, pem64);
	else
		s = fs_printf("{\"apiVersion\":\"0.0.1\",\"kind\":\"hashedrekord\",\"spec\":{"
		              "\"data\":{\"hash\":{\"algorithm\":\"sha256\",\"value\":\"%s\"}},"
		              "\"signature\":{\"content\":\"%s\",\"publicKey\":{\"content\":"
		              "\"%s\"}}}}",
		              hex, sig_b64, pem64);
	free(pem);
	free(pem64);
	return s;
}

static char *fs_hashedrekord(const void *payload, size_t len, const char *sig_b64, X509 *cert)
{
	return fs_rekor_body("hashedrekord", payload, len, sig_b64, cert);
}

static char *fs_dsse_body(const void *payload, size_t len, const char *sig_b64, X509 *cert)
{
	return fs_rekor_body("dsse", payload, len, sig_b64, cert);
}

/* A log entry as the log records it. */
struct fs_entry {
	const struct fs_log *log;
	char *body; /* canonicalized body (JSON text) */
	int64_t integrated_time, log_index;
	char *set_b64; /* over the values above */
};

static char *fs_set(const struct fs_log *log, const char *body, int64_t t, int64_t index)
{
	char id[65];
	char *b64 = fs_b64(body, strlen(body));
	fs_hex(log->id, 32, id);
	char *msg = fs_printf("{\"body\":\"%s\",\"integratedTime\":%lld,\"logID\":\"%s\","
	                      "\"logIndex\":%lld}",
	                      b64, (long long)t, id, (long long)index);
	char *sig = fs_sign_b64(log->key, msg, strlen(msg));
	free(b64);
	free(msg);
	return sig;
}

static struct fs_entry fs_entry_new(const struct fs_log *log, char *body, int64_t t, int64_t index)
{
	struct fs_entry e = {.log = log, .body = body, .integrated_time = t, .log_index = index};
	e.set_b64 = fs_set(log, body, t, index);
	return e;
}

static void fs_entry_free(struct fs_entry *e)
{
	free(e->body);
	free(e->set_b64);
	memset(e, 0, sizeof(*e));
}

/* cosign's dev.sigstore.cosign/bundle annotation. */
static char *fs_rekor_annotation(const struct fs_entry *e)
{
	char id[65];
	char *b64 = fs_b64(e->body, strlen(e->body));
	fs_hex(e->log->id, 32, id);
	char *s =
	    fs_printf("{\"SignedEntryTimestamp\":\"%s\",\"Payload\":{\"body\":\"%s\","
	              "\"integratedTime\":%lld,\"logIndex\":%lld,\"logID\":\"%s\"}}",
	              e->set_b64, b64, (long long)e->integrated_time, (long long)e->log_index, id);
	free(b64);
	return s;
}

/* ---- Merkle trees (RFC 6962) ---- */

static void fs_node(const unsigned char *l, const unsigned char *r, unsigned char out[32])
{
	unsigned char b[65];
	b[0] = 1;
	memcpy(b + 1, l, 32);
	memcpy(b + 33, r, 32);
	fs_sha256(b, 65, out);
}

static size_t fs_split(size_t n)
{
	size_t k = 1;
	while (k * 2 < n)
		k *= 2;
	return k;
}

static void fs_mth(unsigned char (*leaves)[32], size_t n, unsigned char out[32])
{
	if (n == 1) {
		memcpy(out, leaves[0], 32);
		return;
	}
	unsigned char l[32], r[32];
	size_t k = fs_split(n);
	fs_mth(leaves, k, l);
	fs_mth(leaves + k, n - k, r);
	fs_node(l, r, out);
}

/* The audit path of leaf m, bottom up, appended to path. */
static void fs_path(unsigned char (*leaves)[32], size_t n, size_t m, unsigned char (*path)[32],
                    size_t *np)
{
	if (n == 1)
		return;
	size_t k = fs_split(n);
	if (m < k) {
		fs_path(leaves, k, m, path, np);
		fs_mth(leaves + k, n - k, path[(*np)++]);
	} else {
		fs_path(leaves + k, n - k, m - k, path, np);
		fs_mth(leaves, k, path[(*np)++]);
	}
}

/* An inclusion proof of e at index in a tree of size leaves (the others
 * made up), with its checkpoint signed by the log. JSON, caller frees. */
static char *fs_inclusion_proof(const struct fs_entry *e, size_t index, size_t size)
{
	unsigned char(*leaves)[32] = calloc(size, 32), path[64][32], root[32];
	size_t np = 0;
	for (size_t i = 0; i < size; i++) {
		char other[64];
		size_t n = (size_t)snprintf(other + 1, sizeof(other) - 1, "other entry %zu", i) + 1;
		other[0] = 0;
		if (i == index) {
			char *b = fs_printf("%c%s", 1, e->body);
			b[0] = 0;
			fs_sha256(b, strlen(e->body) + 1, leaves[i]);
			free(b);
		} else {
			fs_sha256(other, n, leaves[i]);
		}
	}
	fs_mth(leaves, size, root);
	fs_path(leaves, size, index, path, &np);
	char *root64 = fs_b64(root, 32);
	char *note = fs_printf("%s\n%zu\n%s\n", e->log->origin, size, root64);
	unsigned char *sig = NULL;
	size_t sl = fs_sign(e->log->key, note, strlen(note), &sig);
	unsigned char *hinted = malloc(sl + 4);
	memcpy(hinted, e->log->id, 4);
	memcpy(hinted + 4, sig, sl);
	char *sig64 = fs_b64(hinted, sl + 4);
	char *cp = fs_printf("%s\n\xe2\x80\x94 %s %s\n", note, e->log->origin, sig64);
	/* JSON-escape the checkpoint's newlines */
	size_t cl = strlen(cp);
	char *esc = calloc(1, 2 * cl + 1), *q = esc;
	for (size_t i = 0; i < cl; i++) {
		if (cp[i] == '\n') {
			*q++ = '\\';
			*q++ = 'n';
		} else {
			*q++ = cp[i];
		}
	}
	char *hashes = strdup("");
	for (size_t i = 0; i < np; i++) {
		char *h = fs_b64(path[i], 32);
		char *more = fs_printf("%s%s\"%s\"", hashes, i ? "," : "", h);
		free(hashes);
		free(h);
		hashes = more;
	}
	char *json = fs_printf("{\"logIndex\":\"%zu\",\"rootHash\":\"%s\",\"treeSize\":\"%zu\","
	                       "\"hashes\":[%s],\"checkpoint\":{\"envelope\":\"%s\"}}",
	                       index, root64, size, hashes, esc);
	free(leaves);
	free(root64);
	free(note);
	free(sig);
	free(hinted);
	free(sig64);
	free(cp);
	free(esc);
	free(hashes);
	return json;
}

/* ---- bundles ---- */

struct fs_bundle_opts {
	const char *version; /* "0.1", "0.2", "0.3" */
	bool no_set;         /* leave the inclusion promise out */
	bool no_entry;       /* no tlog entry at all */
	char *proof;         /* an inclusion proof (fs_inclusion_proof), or NULL */
	X509 *intermediate;  /* v0.1/v0.2: put in the chain after the leaf */
};

/* A sigstore bundle: DSSE envelope (payload, one signature), the leaf and
 * one tlog entry. */
static char *fs_bundle(const char *payload, const char *sig_b64, X509 *leaf,
                       const struct fs_entry *e, const struct fs_bundle_opts *o)
{
	char *leaf64 = fs_der_b64_cert(leaf), *material;
	bool v3 = strcmp(o->version, "0.3") == 0;
	if (v3) {
		material = fs_printf("\"certificate\":{\"rawBytes\":\"%s\"}", leaf64);
	} else {
		char *mid = o->intermediate ? fs_der_b64_cert(o->intermediate) : NULL;
		material = fs_printf("\"x509CertificateChain\":{\"certificates\":[{\"rawBytes\":"
		                     "\"%s\"}%s%s%s]}",
		                     leaf64, mid ? ",{\"rawBytes\":\"" : "", mid ? mid : "",
		                     mid ? "\"}" : "");
		free(mid);
	}
	char id[64];
	unsigned char raw[32];
	memcpy(raw, e->log->id, 32);
	char *id64 = fs_b64(raw, 32), *body64 = fs_b64(e->body, strlen(e->body));
	snprintf(id, sizeof(id), "%s", id64);
	char *promise = o->no_set ? strdup("")
	                          : fs_printf(",\"inclusionPromise\":{\"signedEntryTimestamp\":"
	                                      "\"%s\"}",
	                                      e->set_b64);
	char *payload64 = fs_b64(payload, strlen(payload));
	const char *kind = strstr(e->body, "\"kind\":\"dsse\"") ? "dsse" : "hashedrekord";
	char *entry =
	    o->no_entry
	        ? strdup("")
	        : fs_printf("{\"logIndex\":\"%lld\",\"logId\":{\"keyId\":\"%s\"},"
	                    "\"kindVersion\":{\"kind\":\"%s\",\"version\":\"0.0.1\"},"
	                    "\"integratedTime\":\"%lld\"%s%s%s,\"canonicalizedBody\":"
	                    "\"%s\"}",
	                    (long long)e->log_index, id, kind, (long long)e->integrated_time,
	                    promise, o->proof ? ",\"inclusionProof\":" : "",
	                    o->proof ? o->proof : "", body64);
	const char *mt = v3 ? "application/vnd.dev.sigstore.bundle.v0.3+json"
	                 : strcmp(o->version, "0.2") == 0
	                     ? "application/vnd.dev.sigstore.bundle+json;version=0.2"
	                     : "application/vnd.dev.sigstore.bundle+json;version=0.1";
	char *s = fs_printf("{\"mediaType\":\"%s\",\"verificationMaterial\":{%s,\"tlogEntries\":["
	                    "%s]},\"dsseEnvelope\":{\"payload\":\"%s\",\"payloadType\":"
	                    "\"application/vnd.in-toto+json\",\"signatures\":[{\"sig\":\"%s\","
	                    "\"keyid\":\"\"}]}}",
	                    mt, material, entry, payload64, sig_b64);
	free(entry);
	free(leaf64);
	free(material);
	free(id64);
	free(body64);
	free(promise);
	free(payload64);
	return s;
}

/* DSSE PAE over an in-toto payload, signed by key (base64). */
static char *fs_dsse_sign(EVP_PKEY *key, const char *payload)
{
	const char *type = "application/vnd.in-toto+json";
	char *pae = fs_printf("DSSEv1 %zu %s %zu %s", strlen(type), type, strlen(payload), payload);
	char *s = fs_sign_b64(key, pae, strlen(pae));
	free(pae);
	return s;
}

/* ---- trusted_root.json ---- */

static char *fs_time(int64_t t)
{
	time_t tt = (time_t)t;
	struct tm tm;
	char b[32];
	gmtime_r(&tt, &tm);
	strftime(b, sizeof(b), "%Y-%m-%dT%H:%M:%S.000Z", &tm);
	return strdup(b);
}

static char *fs_log_json(const struct fs_log *l, int64_t start)
{
	unsigned char *der = NULL;
	size_t n = fs_der_pubkey(l->key, &der);
	char *raw = fs_b64(der, n), *id = fs_b64(l->id, 32), *st = fs_time(start);
	char *s = fs_printf("{\"baseUrl\":\"https://%s\",\"hashAlgorithm\":\"SHA2_256\","
	                    "\"publicKey\":{\"rawBytes\":\"%s\",\"keyDetails\":"
	                    "\"PKIX_ECDSA_P256_SHA_256\",\"validFor\":{\"start\":\"%s\"}},"
	                    "\"logId\":{\"keyId\":\"%s\"}}",
	                    l->origin, raw, st, id);
	OPENSSL_free(der);
	free(raw);
	free(id);
	free(st);
	return s;
}

/* A trusted root of one CA (chain: intermediate then root, or the root
 * alone), one Rekor log and optionally a CT log, valid from start. */
static char *fs_trusted_root(const struct fs_ca *root, const struct fs_ca *intermediate,
                             const struct fs_log *rekor, const struct fs_log *ctlog, int64_t start)
{
	char *r = fs_der_b64_cert(root->cert);
	char *i = intermediate ? fs_der_b64_cert(intermediate->cert) : NULL;
	char *t = fs_log_json(rekor, start), *c = ctlog ? fs_log_json(ctlog, start) : NULL;
	char *st = fs_time(start);
	char *s = fs_printf(
	    "{\"mediaType\":\"application/vnd.dev.sigstore.trustedroot+json;version=0.1\","
	    "\"tlogs\":[%s],\"certificateAuthorities\":[{\"subject\":{\"organization\":\"test\","
	    "\"commonName\":\"fake fulcio\"},\"uri\":\"https://fulcio.test\",\"certChain\":{"
	    "\"certificates\":[%s%s%s{\"rawBytes\":\"%s\"}]},\"validFor\":{\"start\":\"%s\"}}],"
	    "\"ctlogs\":[%s],\"timestampAuthorities\":[]}",
	    t, i ? "{\"rawBytes\":\"" : "", i ? i : "", i ? "\"}," : "", r, st, c ? c : "");
	free(r);
	free(i);
	free(t);
	free(c);
	free(st);
	return s;
}

#endif
