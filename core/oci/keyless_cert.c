/* Fulcio certificates: the chain to a trusted CA at the log's time, the
 * embedded SCTs (RFC 6962), and the OIDC identity (see keyless.h).
 *
 * Fulcio's extensions: 1.3.6.1.4.1.57264.1.8 holds the issuer as a DER
 * UTF8String; the older 1.3.6.1.4.1.57264.1.1 holds it as raw bytes. The
 * subject is the SAN: an email, a URI (CI workflows) or an otherName of
 * type 1.3.6.1.4.1.57264.1.7 (a username, UTF8String). */
#include "keyless_impl.h"

#include <errno.h>
#include <openssl/ct.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "textfmt.h"

#define OID_ISSUER_V1 "1.3.6.1.4.1.57264.1.1"
#define OID_ISSUER_V2 "1.3.6.1.4.1.57264.1.8"
#define OID_USERNAME "1.3.6.1.4.1.57264.1.7"
#define MAX_CHAIN 8
#define MAX_SANS 16

int kl_pem_next(BIO *b, char **name, unsigned char **data, long *len)
{
	char *header = NULL;
	ERR_clear_error();
	if (!PEM_read_bio(b, name, &header, data, len)) {
		unsigned long e = ERR_peek_last_error();
		ERR_clear_error();
		return ERR_GET_REASON(e) == PEM_R_NO_START_LINE ? 0 : -EBADMSG;
	}
	OPENSSL_free(header);
	return 1;
}

int kl_certs_from_pem(const char *pem, size_t len, STACK_OF(X509) * *out, char *why, size_t whylen)
{
	BIO *b = len <= INT32_MAX ? BIO_new_mem_buf(pem, (int)len) : NULL;
	STACK_OF(X509) *sk = sk_X509_new_null();
	char *name = NULL;
	unsigned char *data = NULL;
	long n = 0;
	int rc = b && sk ? 0 : -ENOMEM, more;
	while (rc == 0 && (more = kl_pem_next(b, &name, &data, &n)) > 0) {
		X509 *x =
		    strcmp(name, "CERTIFICATE") == 0 ? kl_cert_from_der(data, (size_t)n) : NULL;
		int at = sk_X509_num(sk) + 1;
		if (!x)
			errbuf_set(why, whylen, "PEM block %d is not a certificate", at);
		else if (at > KEYLESS_MAX_CAS)
			errbuf_set(why, whylen, "more than %d certificates", KEYLESS_MAX_CAS);
		if (!x || at > KEYLESS_MAX_CAS || !sk_X509_push(sk, x)) {
			X509_free(x);
			rc = -EBADMSG;
		}
		OPENSSL_free(name);
		OPENSSL_free(data);
	}
	if (rc == 0 && (more < 0 || sk_X509_num(sk) == 0)) {
		errbuf_set(why, whylen, "%s",
		           more < 0 ? "malformed PEM" : "no PEM certificate (BEGIN CERTIFICATE)");
		rc = -EBADMSG;
	}
	BIO_free(b);
	if (rc) {
		kl_certs_free(sk);
		return rc;
	}
	*out = sk;
	return 0;
}

X509 *kl_cert_from_der(const unsigned char *der, size_t len)
{
	const unsigned char *p = der;
	X509 *x = len <= INT32_MAX ? d2i_X509(NULL, &p, (long)len) : NULL;
	if (x && p != der + len) { /* trailing bytes: not one certificate */
		X509_free(x);
		x = NULL;
	}
	ERR_clear_error();
	return x;
}

/* X509_verify_cert against one CA: 0, or the verification error. */
static int verify_at(const struct kl_ca *ca, X509 *leaf, STACK_OF(X509) * chain, int64_t t,
                     bool check_time, X509 **issuer)
{
	X509_STORE_CTX *ctx = X509_STORE_CTX_new();
	int err = X509_V_ERR_OUT_OF_MEM;
	if (ctx && X509_STORE_CTX_init(ctx, ca->store, leaf, chain)) {
		X509_VERIFY_PARAM *p = X509_STORE_CTX_get0_param(ctx);
		if (check_time)
			X509_VERIFY_PARAM_set_time(p, (time_t)t);
		else
			X509_VERIFY_PARAM_set_flags(p, X509_V_FLAG_NO_CHECK_TIME);
		if (X509_verify_cert(ctx) == 1) {
			err = 0;
			STACK_OF(X509) *built = X509_STORE_CTX_get0_chain(ctx);
			X509 *up = sk_X509_num(built) > 1 ? sk_X509_value(built, 1) : NULL;
			if (issuer && up && X509_up_ref(up))
				*issuer = up;
		} else {
			err = X509_STORE_CTX_get_error(ctx);
		}
	}
	X509_STORE_CTX_free(ctx);
	ERR_clear_error();
	return err;
}

static void validity(X509 *x, char *buf, size_t cap)
{
	char nb[RFC3339_MAX] = "?", na[RFC3339_MAX] = "?";
	struct tm tm;
	if (ASN1_TIME_to_tm(X509_get0_notBefore(x), &tm))
		rfc3339_format((int64_t)timegm(&tm), nb, sizeof(nb));
	if (ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm))
		rfc3339_format((int64_t)timegm(&tm), na, sizeof(na));
	snprintf(buf, cap, "%s to %s", nb, na);
}

int kl_cert_verify(const struct sig_keyless *kl, X509 *leaf, STACK_OF(X509) * chain, int64_t t,
                   X509 **issuer, struct keyless_result *res, char *why, size_t whylen)
{
	int err = X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY, terr = 0;
	bool trusted = false;
	char at[32], valid[80];
	if (chain && sk_X509_num(chain) > MAX_CHAIN) {
		res->cause = KEYLESS_MALFORMED;
		errbuf_set(why, whylen, "certificate chain of more than %d certificates",
		           MAX_CHAIN);
		return -EBADMSG;
	}
	/* the chain at time t, by a CA trusted then; when none takes it, the
	 * same without the time tells an untrusted root from an expired one */
	for (size_t i = 0; i < kl->ncas && !trusted; i++)
		if (t >= kl->cas[i].start && t <= kl->cas[i].end)
			trusted = verify_at(&kl->cas[i], leaf, chain, t, true, issuer) == 0;
	for (size_t i = 0; i < kl->ncas && !trusted; i++) {
		int e = verify_at(&kl->cas[i], leaf, chain, t, false, NULL);
		if (e) {
			err = e;
			continue;
		}
		trusted = true;
		/* the CA itself was not trusted then, or what the chain says at t */
		terr = t < kl->cas[i].start || t > kl->cas[i].end
		           ? -1
		           : verify_at(&kl->cas[i], leaf, chain, t, true, NULL);
		if (terr == 0)
			terr = X509_V_ERR_CERT_HAS_EXPIRED; /* not reached: it failed above */
	}
	kl_time_text(t, at, sizeof(at));
	validity(leaf, valid, sizeof(valid));
	if (!trusted) {
		res->cause = KEYLESS_UNTRUSTED_ROOT;
		errbuf_set(why, whylen,
		           "untrusted root: the certificate does not chain to a trusted Fulcio CA "
		           "(%s)",
		           X509_verify_cert_error_string(err));
		return -EKEYREJECTED;
	}
	if (terr) {
		res->cause = KEYLESS_EXPIRED;
		errbuf_set(why, whylen,
		           "expired at integration: the log entry was integrated at %s, when %s "
		           "(the certificate is valid from %s)",
		           at,
		           terr == -1 ? "no trusted CA it chains to was valid"
		                      : X509_verify_cert_error_string(terr),
		           valid);
		return -EKEYREJECTED;
	}
	if (!(X509_get_extension_flags(leaf) & EXFLAG_XKUSAGE) ||
	    !(X509_get_extended_key_usage(leaf) & XKU_CODE_SIGN)) {
		X509_free(*issuer);
		*issuer = NULL;
		res->cause = KEYLESS_UNTRUSTED_ROOT;
		errbuf_set(why, whylen,
		           "the certificate is not for code signing (extended key "
		           "usage codeSigning missing)");
		return -EKEYREJECTED;
	}
	return 0;
}

/* ---- SCTs ---- */

/* The TBS certificate an SCT signs: the leaf without its SCT list. */
static int precert_tbs(X509 *leaf, unsigned char **der, int *len)
{
	X509 *dup = X509_dup(leaf);
	int idx = dup ? X509_get_ext_by_NID(dup, NID_ct_precert_scts, -1) : -1;
	X509_EXTENSION *ext = idx >= 0 ? X509_delete_ext(dup, idx) : NULL;
	X509_EXTENSION_free(ext);
	*len = ext ? i2d_re_X509_tbs(dup, der) : -1;
	X509_free(dup);
	return *len > 0 ? 0 : -EBADMSG;
}

static void put_be(unsigned char *p, uint64_t v, int n)
{
	for (int i = n - 1; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)(v & 0xff);
}

/* Whether sct verifies with a trusted CT log key over the precertificate. */
static bool sct_ok(const struct sig_keyless *kl, const SCT *sct, const unsigned char ikh[32],
                   const unsigned char *tbs, size_t tbs_len)
{
	unsigned char *id = NULL, *ext = NULL, *sig = NULL;
	size_t idl = SCT_get0_log_id(sct, &id), extl = SCT_get0_extensions(sct, &ext);
	size_t sigl = SCT_get0_signature(sct, &sig);
	uint64_t ts = SCT_get_timestamp(sct);
	if (SCT_get_version(sct) != SCT_VERSION_V1 || idl != 32 || extl > 0xffff ||
	    tbs_len > 0xffffff)
		return false;
	size_t n = 1 + 1 + 8 + 2 + 32 + 3 + tbs_len + 2 + extl;
	unsigned char *m = malloc(n), *p = m;
	bool ok = false;
	if (!m)
		return false;
	*p++ = 0; /* v1 */
	*p++ = 0; /* certificate_timestamp */
	put_be(p, ts, 8);
	p += 8;
	put_be(p, 1, 2); /* precert_entry */
	p += 2;
	memcpy(p, ikh, 32);
	p += 32;
	put_be(p, tbs_len, 3);
	p += 3;
	memcpy(p, tbs, tbs_len);
	p += tbs_len;
	put_be(p, extl, 2);
	p += 2;
	if (extl)
		memcpy(p, ext, extl);
	for (size_t i = 0; i < kl->nctlogs && !ok; i++) {
		const struct kl_log *l = &kl->ctlogs[i];
		int64_t when = (int64_t)(ts / 1000);
		if (memcmp(l->id, id, 32) == 0 && when >= l->start && when <= l->end)
			ok = kl_verify_sig(l->key, m, n, sig, sigl);
	}
	free(m);
	return ok;
}

int kl_cert_sct(const struct sig_keyless *kl, X509 *leaf, X509 *issuer, struct keyless_result *res,
                char *why, size_t whylen)
{
	if (kl->nctlogs == 0)
		return 0;
	STACK_OF(SCT) *scts = X509_get_ext_d2i(leaf, NID_ct_precert_scts, NULL, NULL);
	unsigned char *tbs = NULL, *spki = NULL, ikh[32];
	int tbs_len = 0,
	    spki_len = issuer ? i2d_X509_PUBKEY(X509_get_X509_PUBKEY(issuer), &spki) : -1;
	bool ok = false;
	if (scts && spki_len > 0 && precert_tbs(leaf, &tbs, &tbs_len) == 0) {
		kl_sha256(spki, (size_t)spki_len, ikh);
		for (int i = 0; i < sk_SCT_num(scts) && !ok; i++)
			ok = sct_ok(kl, sk_SCT_value(scts, i), ikh, tbs, (size_t)tbs_len);
	}
	int n = scts ? sk_SCT_num(scts) : 0;
	SCT_LIST_free(scts);
	OPENSSL_free(tbs);
	OPENSSL_free(spki);
	ERR_clear_error();
	if (ok)
		return 0;
	res->cause = KEYLESS_NO_SCT;
	errbuf_set(why, whylen,
	           n ? "no SCT of the certificate verifies with a trusted CT log key"
	             : "the certificate has no SCT, and CT log keys are trusted");
	return -EKEYREJECTED;
}

/* ---- identity ---- */

/* A printable copy of an identity value (control characters refused). */
static char *text_of(const unsigned char *p, int n)
{
	if (n <= 0 || n > 4096)
		return NULL;
	for (int i = 0; i < n; i++)
		if (p[i] < 0x20 || p[i] == 0x7f)
			return NULL;
	return strndup((const char *)p, (size_t)n);
}

static ASN1_OCTET_STRING *ext_data(X509 *x, const char *oid)
{
	ASN1_OBJECT *o = OBJ_txt2obj(oid, 1);
	int idx = o ? X509_get_ext_by_OBJ(x, o, -1) : -1;
	ASN1_OBJECT_free(o);
	return idx >= 0 ? X509_EXTENSION_get_data(X509_get_ext(x, idx)) : NULL;
}

static void issuer_of(X509 *leaf, char *out, size_t cap)
{
	ASN1_OCTET_STRING *v2 = ext_data(leaf, OID_ISSUER_V2), *v1 = ext_data(leaf, OID_ISSUER_V1);
	char *s = NULL;
	out[0] = '\0';
	if (v2) {
		const unsigned char *p = ASN1_STRING_get0_data(v2);
		ASN1_UTF8STRING *u = d2i_ASN1_UTF8STRING(NULL, &p, ASN1_STRING_length(v2));
		if (u)
			s = text_of(ASN1_STRING_get0_data(u), ASN1_STRING_length(u));
		ASN1_UTF8STRING_free(u);
	} else if (v1) {
		s = text_of(ASN1_STRING_get0_data(v1), ASN1_STRING_length(v1));
	}
	if (s)
		snprintf(out, cap, "%s", s);
	free(s);
	ERR_clear_error();
}

static char *san_of(const GENERAL_NAME *g)
{
	if (g->type == GEN_EMAIL || g->type == GEN_URI)
		return text_of(ASN1_STRING_get0_data(g->d.ia5), ASN1_STRING_length(g->d.ia5));
	if (g->type != GEN_OTHERNAME)
		return NULL;
	ASN1_OBJECT *user = OBJ_txt2obj(OID_USERNAME, 1);
	const ASN1_TYPE *v = g->d.otherName->value;
	char *s = NULL;
	if (user && OBJ_cmp(g->d.otherName->type_id, user) == 0 && v &&
	    v->type == V_ASN1_UTF8STRING)
		s = text_of(ASN1_STRING_get0_data(v->value.utf8string),
		            ASN1_STRING_length(v->value.utf8string));
	ASN1_OBJECT_free(user);
	return s;
}

int kl_cert_identity(X509 *leaf, char *issuer, size_t cap, char ***sans, size_t *nsans)
{
	GENERAL_NAMES *gens = X509_get_ext_d2i(leaf, NID_subject_alt_name, NULL, NULL);
	char **out = calloc(MAX_SANS, sizeof(*out));
	size_t n = 0;
	if (!out) {
		GENERAL_NAMES_free(gens);
		return -ENOMEM;
	}
	issuer_of(leaf, issuer, cap);
	for (int i = 0; gens && i < sk_GENERAL_NAME_num(gens) && n < MAX_SANS; i++) {
		char *s = san_of(sk_GENERAL_NAME_value(gens, i));
		if (s)
			out[n++] = s;
	}
	GENERAL_NAMES_free(gens);
	ERR_clear_error();
	*sans = out;
	*nsans = n;
	return 0;
}

void kl_sans_free(char **sans, size_t n)
{
	for (size_t i = 0; sans && i < n; i++)
		free(sans[i]);
	free(sans);
}

char *kl_cert_pubkey_pem(X509 *leaf)
{
	BIO *b = BIO_new(BIO_s_mem());
	char *p = NULL, *out = NULL;
	long n;
	if (b && PEM_write_bio_PUBKEY(b, X509_get0_pubkey(leaf)) &&
	    (n = BIO_get_mem_data(b, &p)) > 0)
		out = strndup(p, (size_t)n);
	BIO_free(b);
	return out;
}
