/* Keyless trust: the trusted root (sigstore trusted_root.json or plain PEM),
 * the rules' container, fingerprints, and the helpers the keyless parts
 * share (see keyless.h, keyless_impl.h).
 *
 * trusted_root.json (protobuf-specs TrustedRoot, JSON mapping): mediaType
 * application/vnd.dev.sigstore.trustedroot+json;version=0.1 (or 0.2);
 * tlogs[] and ctlogs[]: {baseUrl, hashAlgorithm, publicKey: {rawBytes (DER
 * SPKI, base64), keyDetails, validFor: {start, end}}, logId: {keyId}};
 * certificateAuthorities[]: {subject, uri, certChain: {certificates:
 * [{rawBytes (DER)}]}, validFor}; timestampAuthorities[] are not used (gkm
 * takes the time from the log). */
#include "keyless_impl.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base64.h"
#include "errbuf.h"
#include "textfmt.h"

/* ---- helpers ---- */

const char *kl_jstr(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

int kl_jint(const cJSON *o, const char *key, int64_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (cJSON_IsNumber(v)) {
		double d = v->valuedouble;
		if (d < -9007199254740992.0 || d > 9007199254740992.0 || d != (double)(int64_t)d)
			return -EINVAL;
		*out = (int64_t)d;
		return 0;
	}
	if (!cJSON_IsString(v) || !v->valuestring[0])
		return -EINVAL;
	char *end = NULL;
	errno = 0;
	long long n = strtoll(v->valuestring, &end, 10);
	if (errno || *end ||
	    (v->valuestring[0] != '-' && (v->valuestring[0] < '0' || v->valuestring[0] > '9')))
		return -EINVAL;
	*out = n;
	return 0;
}

int kl_b64(const char *text, unsigned char **out, size_t *len)
{
	if (!text)
		return -EBADMSG;
	int rc = base64_decode(text, strlen(text), BASE64_PROTOJSON, out, len, NULL);
	return rc == -ENOMEM ? rc : rc ? -EBADMSG : 0;
}

void kl_time_text(int64_t t, char *buf, size_t cap)
{
	if (t != KL_FOREVER)
		rfc3339_format(t, buf, cap);
	if (t == KL_FOREVER || !buf[0])
		snprintf(buf, cap, "%s", t == KL_FOREVER ? "(no end)" : "?");
}

void kl_sha256(const void *p, size_t n, unsigned char out[32])
{
	unsigned int ml = 32;
	EVP_Digest(p, n, out, &ml, EVP_sha256(), NULL);
}

bool kl_verify_sig(EVP_PKEY *key, const void *msg, size_t len, const unsigned char *sig,
                   size_t siglen)
{
	/* Ed25519 hashes nothing; P-384 logs sign with SHA-384, all else SHA-256 */
	int id = EVP_PKEY_get_base_id(key);
	const EVP_MD *mds[2] = {id == EVP_PKEY_ED25519 ? NULL : EVP_sha256(), NULL};
	if (id == EVP_PKEY_EC && EVP_PKEY_get_bits(key) == 384)
		mds[1] = EVP_sha384();
	bool ok = false;
	for (size_t i = 0; i < 2 && !ok && (i == 0 || mds[i]); i++) {
		EVP_MD_CTX *ctx = EVP_MD_CTX_new();
		ok = ctx && EVP_DigestVerifyInit(ctx, NULL, mds[i], NULL, key) == 1 &&
		     EVP_DigestVerify(ctx, sig, siglen, msg, len) == 1;
		EVP_MD_CTX_free(ctx);
	}
	ERR_clear_error();
	return ok;
}

/* ---- the container ---- */

static void refresh(struct sig_keyless *kl);

int sig_keyless_new(struct sig_keyless **out)
{
	struct sig_keyless *kl = calloc(1, sizeof(*kl));
	if (!kl || !(kl->material = EVP_MD_CTX_new()) ||
	    !EVP_DigestInit_ex(kl->material, EVP_sha256(), NULL)) {
		sig_keyless_free(kl);
		return -ENOMEM;
	}
	refresh(kl);
	*out = kl;
	return 0;
}

void sig_keyless_free(struct sig_keyless *kl)
{
	if (!kl)
		return;
	for (size_t i = 0; i < kl->ncas; i++) {
		X509_STORE_free(kl->cas[i].store);
		kl_certs_free(kl->cas[i].certs);
	}
	for (size_t i = 0; i < kl->ntlogs; i++)
		EVP_PKEY_free(kl->tlogs[i].key);
	for (size_t i = 0; i < kl->nctlogs; i++)
		EVP_PKEY_free(kl->ctlogs[i].key);
	for (size_t i = 0; i < kl->nrules; i++)
		kl_rule_clear(&kl->rules[i]);
	EVP_MD_CTX_free(kl->material);
	free(kl);
}

static void fp_of(EVP_MD_CTX *md, char out[SIGNATURE_FP_MAX])
{
	unsigned char d[32];
	EVP_DigestFinal_ex(md, d, NULL);
	memcpy(out, "sha256:", 7);
	hex_encode(d, 32, out + 7);
}

/* The fingerprint and the rules' ids follow every change (kl is built
 * once, then only read, by several threads). */
static void refresh(struct sig_keyless *kl)
{
	char material[SIGNATURE_FP_MAX];
	EVP_MD_CTX *copy = EVP_MD_CTX_new(), *all = EVP_MD_CTX_new();
	if (!copy || !all || !EVP_MD_CTX_copy_ex(copy, kl->material) ||
	    !EVP_DigestInit_ex(all, EVP_sha256(), NULL)) {
		snprintf(kl->fp, sizeof(kl->fp), "sha256:unavailable");
		goto out;
	}
	fp_of(copy, material);
	EVP_DigestUpdate(all, material, strlen(material));
	for (size_t i = 0; i < kl->nrules; i++) {
		struct kl_rule *r = &kl->rules[i];
		EVP_MD_CTX *one = EVP_MD_CTX_new();
		if (one && EVP_DigestInit_ex(one, EVP_sha256(), NULL)) {
			EVP_DigestUpdate(one, material, strlen(material));
			EVP_DigestUpdate(one, "\n", 1);
			EVP_DigestUpdate(one, r->desc, strlen(r->desc));
			fp_of(one, r->id);
		}
		EVP_MD_CTX_free(one);
		EVP_DigestUpdate(all, "\n", 1);
		EVP_DigestUpdate(all, r->name, strlen(r->name));
		EVP_DigestUpdate(all, "\t", 1);
		EVP_DigestUpdate(all, r->desc, strlen(r->desc));
	}
	fp_of(all, kl->fp);
out:
	EVP_MD_CTX_free(copy);
	EVP_MD_CTX_free(all);
}

static void material(struct sig_keyless *kl, const char *tag, const void *p, size_t n)
{
	EVP_DigestUpdate(kl->material, tag, strlen(tag) + 1);
	EVP_DigestUpdate(kl->material, p, n);
}

/* ---- trusted material ---- */

static int add_ca(struct sig_keyless *kl, STACK_OF(X509) * certs, int64_t start, int64_t end,
                  char *why, size_t whylen)
{
	if (kl->ncas >= KEYLESS_MAX_CAS) {
		errbuf_set(why, whylen, "more than %d certificate authorities", KEYLESS_MAX_CAS);
		return -E2BIG;
	}
	X509_STORE *st = X509_STORE_new();
	if (!st)
		return -ENOMEM;
	for (int i = 0; i < sk_X509_num(certs); i++) {
		X509 *c = sk_X509_value(certs, i);
		unsigned char *der = NULL;
		int n = i2d_X509(c, &der);
		if (n > 0)
			material(kl, "ca", der, (size_t)n);
		OPENSSL_free(der);
		if (!X509_STORE_add_cert(st, c)) {
			ERR_clear_error();
			X509_STORE_free(st);
			errbuf_set(why, whylen, "certificate %d cannot be trusted", i + 1);
			return -EINVAL;
		}
	}
	/* a trusted intermediate is an anchor too (the root file vouches for it) */
	X509_STORE_set_flags(st, X509_V_FLAG_PARTIAL_CHAIN);
	material(kl, "ca-valid", &start, sizeof(start));
	material(kl, "ca-valid", &end, sizeof(end));
	kl->cas[kl->ncas++] =
	    (struct kl_ca){.store = st, .certs = certs, .start = start, .end = end};
	refresh(kl);
	return 0;
}

static int add_log(struct sig_keyless *kl, EVP_PKEY *key, bool ctlog, int64_t start, int64_t end,
                   char *why, size_t whylen)
{
	size_t *n = ctlog ? &kl->nctlogs : &kl->ntlogs;
	struct kl_log *logs = ctlog ? kl->ctlogs : kl->tlogs;
	unsigned char *der = NULL;
	int dl = i2d_PUBKEY(key, &der);
	if (*n >= KEYLESS_MAX_LOGS || dl <= 0) {
		OPENSSL_free(der);
		EVP_PKEY_free(key);
		errbuf_set(why, whylen,
		           dl <= 0 ? "cannot encode the log key" : "more than %d log keys",
		           KEYLESS_MAX_LOGS);
		return -EINVAL;
	}
	struct kl_log *l = &logs[(*n)++];
	l->key = key;
	l->start = start;
	l->end = end;
	kl_sha256(der, (size_t)dl, l->id);
	material(kl, ctlog ? "ctlog" : "tlog", der, (size_t)dl);
	material(kl, "log-valid", &start, sizeof(start));
	material(kl, "log-valid", &end, sizeof(end));
	OPENSSL_free(der);
	refresh(kl);
	return 0;
}

static int valid_for(const cJSON *o, int64_t *start, int64_t *end, char *why, size_t whylen)
{
	const cJSON *vf = cJSON_GetObjectItemCaseSensitive(o, "validFor");
	const char *s = kl_jstr(vf, "start"), *e = kl_jstr(vf, "end");
	*start = 0;
	*end = KL_FOREVER;
	if ((s && rfc3339_parse(s, start)) || (e && rfc3339_parse(e, end))) {
		errbuf_set(why, whylen, "validFor: not an RFC 3339 time");
		return -EINVAL;
	}
	return 0;
}

static int root_ca(struct sig_keyless *kl, const cJSON *ca, char *why, size_t whylen)
{
	const cJSON *certs = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(ca, "certChain"), "certificates");
	int64_t start, end;
	int rc = valid_for(ca, &start, &end, why, whylen);
	if (rc)
		return rc;
	if (!cJSON_IsArray(certs) || cJSON_GetArraySize(certs) == 0) {
		errbuf_set(why, whylen, "certChain.certificates: no certificates");
		return -EINVAL;
	}
	STACK_OF(X509) *sk = sk_X509_new_null();
	if (!sk)
		return -ENOMEM;
	const cJSON *c;
	int i = 0;
	cJSON_ArrayForEach(c, certs)
	{
		unsigned char *der = NULL;
		size_t n = 0;
		X509 *x = NULL;
		i++;
		if (kl_b64(kl_jstr(c, "rawBytes"), &der, &n) == 0)
			x = kl_cert_from_der(der, n);
		free(der);
		if (!x || !sk_X509_push(sk, x)) {
			X509_free(x);
			kl_certs_free(sk);
			errbuf_set(why, whylen, "certificate %d: not a DER certificate", i);
			return -EINVAL;
		}
	}
	if ((rc = add_ca(kl, sk, start, end, why, whylen)))
		kl_certs_free(sk);
	return rc;
}

static int root_log(struct sig_keyless *kl, const cJSON *log, bool ctlog, char *why, size_t whylen)
{
	const cJSON *pk = cJSON_GetObjectItemCaseSensitive(log, "publicKey");
	unsigned char *der = NULL;
	size_t n = 0;
	int64_t start, end;
	int rc = valid_for(pk, &start, &end, why, whylen);
	if (rc)
		return rc;
	if (kl_b64(kl_jstr(pk, "rawBytes"), &der, &n)) {
		errbuf_set(why, whylen, "publicKey.rawBytes: missing or not base64");
		return -EINVAL;
	}
	const unsigned char *p = der;
	EVP_PKEY *key = d2i_PUBKEY(NULL, &p, (long)n);
	const char *details = kl_jstr(pk, "keyDetails");
	if (!key && details && strstr(details, "PKCS1")) {
		p = der;
		key = d2i_PublicKey(EVP_PKEY_RSA, NULL, &p, (long)n);
	}
	free(der);
	ERR_clear_error();
	if (!key) {
		errbuf_set(why, whylen, "publicKey.rawBytes: not a DER public key");
		return -EINVAL;
	}
	return add_log(kl, key, ctlog, start, end, why, whylen);
}

static int root_list(struct sig_keyless *kl, const cJSON *root, const char *name,
                     int (*one)(struct sig_keyless *, const cJSON *, bool, char *, size_t),
                     bool ctlog, char *why, size_t whylen)
{
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, name), *it;
	int i = 0;
	if (arr && !cJSON_IsArray(arr)) {
		errbuf_set(why, whylen, "%s is not a list", name);
		return -EINVAL;
	}
	cJSON_ArrayForEach(it, arr)
	{
		char one_why[256] = "";
		int rc = one(kl, it, ctlog, one_why, sizeof(one_why));
		if (rc) {
			errbuf_set(why, whylen, "%s[%d]: %s", name, i, one_why);
			return rc;
		}
		i++;
	}
	return 0;
}

static int root_ca_list(struct sig_keyless *kl, const cJSON *ca, bool unused, char *why,
                        size_t whylen)
{
	(void)unused;
	return root_ca(kl, ca, why, whylen);
}

int sig_keyless_add_trusted_root(struct sig_keyless *kl, const char *json, size_t len, char *why,
                                 size_t whylen)
{
	cJSON *j = cJSON_ParseWithLength(json, len);
	const char *mt = kl_jstr(j, "mediaType");
	int rc = -EINVAL;
	if (!cJSON_IsObject(j)) {
		errbuf_set(why, whylen, "not a JSON object");
		goto out;
	}
	if (!mt || strncmp(mt, KEYLESS_TRUSTED_ROOT_MEDIA_TYPE,
	                   strlen(KEYLESS_TRUSTED_ROOT_MEDIA_TYPE)) != 0) {
		errbuf_set(why, whylen, "mediaType is '%.80s', not %s;version=0.1",
		           mt ? mt : "(missing)", KEYLESS_TRUSTED_ROOT_MEDIA_TYPE);
		goto out;
	}
	if ((rc = root_list(kl, j, "certificateAuthorities", root_ca_list, false, why, whylen)) ||
	    (rc = root_list(kl, j, "tlogs", root_log, false, why, whylen)) ||
	    (rc = root_list(kl, j, "ctlogs", root_log, true, why, whylen)))
		goto out;
out:
	cJSON_Delete(j);
	return rc;
}

int sig_keyless_add_ca_pem(struct sig_keyless *kl, const char *pem, size_t len, char *why,
                           size_t whylen)
{
	STACK_OF(X509) *all = NULL;
	int rc = kl_certs_from_pem(pem, len, &all, why, whylen);
	if (rc)
		return rc == -ENOMEM ? rc : -EINVAL;
	/* each certificate its own CA: a root, or an intermediate trusted as one */
	while (rc == 0 && sk_X509_num(all) > 0) {
		STACK_OF(X509) *one = sk_X509_new_null();
		X509 *x = sk_X509_shift(all);
		if (!one || !sk_X509_push(one, x)) {
			X509_free(x);
			sk_X509_free(one);
			rc = -ENOMEM;
		} else if ((rc = add_ca(kl, one, 0, KL_FOREVER, why, whylen))) {
			kl_certs_free(one);
		}
	}
	kl_certs_free(all);
	return rc;
}

int sig_keyless_add_log_pem(struct sig_keyless *kl, const char *pem, size_t len, bool ctlog,
                            char *why, size_t whylen)
{
	BIO *b = len <= INT32_MAX ? BIO_new_mem_buf(pem, (int)len) : NULL;
	char *name = NULL;
	unsigned char *data = NULL;
	long n = 0;
	int rc = b ? 0 : -ENOMEM, more, count = 0;
	while (rc == 0 && (more = kl_pem_next(b, &name, &data, &n)) > 0) {
		const unsigned char *p = data;
		EVP_PKEY *k = strcmp(name, "PUBLIC KEY") == 0 ? d2i_PUBKEY(NULL, &p, n) : NULL;
		count++;
		if (!k) {
			errbuf_set(why, whylen,
			           "PEM block %d is not a public key (BEGIN PUBLIC KEY)", count);
			rc = -EINVAL;
		} else {
			rc = add_log(kl, k, ctlog, 0, KL_FOREVER, why, whylen);
		}
		OPENSSL_free(name);
		OPENSSL_free(data);
	}
	if (rc == 0 && (more < 0 || count == 0)) {
		errbuf_set(why, whylen, "%s",
		           more < 0 ? "malformed PEM" : "no PEM public key (BEGIN PUBLIC KEY)");
		rc = -EINVAL;
	}
	ERR_clear_error();
	BIO_free(b);
	return rc;
}

int sig_keyless_add_rule(struct sig_keyless *kl, const struct keyless_rule_spec *r, char *why,
                         size_t whylen)
{
	if (kl->nrules >= KEYLESS_MAX_RULES) {
		errbuf_set(why, whylen, "more than %d identity rules", KEYLESS_MAX_RULES);
		return -E2BIG;
	}
	int rc = kl_rule_compile(r, kl->nrules, &kl->rules[kl->nrules], why, whylen);
	if (rc)
		return rc;
	kl->nrules++;
	refresh(kl);
	return 0;
}

int sig_keyless_complete(const struct sig_keyless *kl, char *why, size_t whylen)
{
	const char *missing = !kl->ncas     ? "no Fulcio CA certificate"
	                      : !kl->ntlogs ? "no transparency log (Rekor) key"
	                      : !kl->nrules ? "no identity rule"
	                                    : NULL;
	if (!missing)
		return 0;
	errbuf_set(why, whylen, "keyless trust is incomplete: %s", missing);
	return -EINVAL;
}

size_t sig_keyless_nrules(const struct sig_keyless *kl)
{
	return kl ? kl->nrules : 0;
}

size_t sig_keyless_ncas(const struct sig_keyless *kl)
{
	return kl ? kl->ncas : 0;
}

size_t sig_keyless_nlogs(const struct sig_keyless *kl, bool ctlog)
{
	return !kl ? 0 : ctlog ? kl->nctlogs : kl->ntlogs;
}

const char *sig_keyless_fingerprint(const struct sig_keyless *kl)
{
	return kl->fp;
}

const char *sig_keyless_rule_id(const struct sig_keyless *kl, size_t i)
{
	return kl && i < kl->nrules ? kl->rules[i].id : NULL;
}

const char *sig_keyless_rule_name(const struct sig_keyless *kl, size_t i)
{
	return kl && i < kl->nrules ? kl->rules[i].name : NULL;
}

bool sig_keyless_has(const struct sig_keyless *kl, const char *rule_id)
{
	for (size_t i = 0; kl && rule_id && i < kl->nrules; i++)
		if (strcmp(kl->rules[i].id, rule_id) == 0)
			return true;
	return false;
}
