/* cosign-compatible signatures with OpenSSL 3 (see signature.h).
 *
 * Formats followed:
 *  - simple signing payload: {"critical":{"identity":{"docker-reference":R},
 *    "image":{"docker-manifest-digest":D},"type":"cosign container image
 *    signature"},"optional":...}; the signature covers the payload bytes.
 *  - sigstore bundle v0.3: {"mediaType", "verificationMaterial":
 *    {"publicKey":{"hint"}|"certificate"|..., "tlogEntries":[...]},
 *    "dsseEnvelope":{"payload":b64, "payloadType", "signatures":[{"sig":b64,
 *    "keyid"}]}} (or "messageSignature" instead of the envelope). cosign v3
 *    signs images as an in-toto Statement with predicateType
 *    https://sigstore.dev/cosign/sign/v1 and an empty predicate.
 *  - DSSE PAE: "DSSEv1" SP len(type) SP type SP len(body) SP body.
 * Only keys are trusted: certificates and transparency-log entries in a
 * bundle are ignored, never taken as proof. */
#include "signature.h"

#include "base64.h"
#include "errbuf.h"
#include "fsutil.h"
#include "keyless.h"
#include "textfmt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define INTOTO_STATEMENT_V1 "https://in-toto.io/Statement/v1"
#define INTOTO_STATEMENT_V01 "https://in-toto.io/Statement/v0.1"
#define COSIGN_SIGN_PREDICATE "https://sigstore.dev/cosign/sign/v1"
#define MAX_KEY_FILE (64 * 1024)
#define MAX_DSSE_SIGS 16
#define MAX_SUBJECTS 1024

struct sig_key {
	EVP_PKEY *pkey;
	enum sig_key_alg alg;
	bool priv;
	char fp[SIGNATURE_FP_MAX];
	char name[24];
};

struct sig_keyset {
	struct sig_key **keys;
	size_t n, cap;
	char fp[SIGNATURE_FP_MAX];
	struct sig_keyless *keyless; /* owned; NULL: keys only */
};

/* ---- keys ---- */

static int classify(EVP_PKEY *pkey, enum sig_key_alg *alg, char *name, size_t nlen, char *why,
                    size_t whylen)
{
	switch (EVP_PKEY_get_base_id(pkey)) {
	case EVP_PKEY_EC: {
		char group[64] = "";
		size_t gl = 0;
		if (!EVP_PKEY_get_utf8_string_param(pkey, "group", group, sizeof(group), &gl)) {
			errbuf_set(why, whylen, "EC key without a named curve");
			return -EINVAL;
		}
		if (strcmp(group, "prime256v1") == 0 || strcmp(group, "P-256") == 0) {
			*alg = SIG_ALG_ECDSA_P256;
			snprintf(name, nlen, "ecdsa-p256");
		} else if (strcmp(group, "secp384r1") == 0 || strcmp(group, "P-384") == 0) {
			*alg = SIG_ALG_ECDSA_P384;
			snprintf(name, nlen, "ecdsa-p384");
		} else if (strcmp(group, "secp521r1") == 0 || strcmp(group, "P-521") == 0) {
			*alg = SIG_ALG_ECDSA_P521;
			snprintf(name, nlen, "ecdsa-p521");
		} else {
			errbuf_set(why, whylen, "unsupported EC curve %s (P-256, P-384 or P-521)",
			           group);
			return -EINVAL;
		}
		return 0;
	}
	case EVP_PKEY_RSA: {
		int bits = EVP_PKEY_get_bits(pkey);
		if (bits < 2048) {
			errbuf_set(why, whylen, "RSA key of %d bits is too small (at least 2048)",
			           bits);
			return -EINVAL;
		}
		*alg = SIG_ALG_RSA;
		snprintf(name, nlen, "rsa-%d", bits);
		return 0;
	}
	case EVP_PKEY_ED25519:
		*alg = SIG_ALG_ED25519;
		snprintf(name, nlen, "ed25519");
		return 0;
	default:
		errbuf_set(why, whylen, "unsupported key type (ECDSA, RSA or Ed25519)");
		return -EINVAL;
	}
}

static int key_wrap(EVP_PKEY *pkey, bool priv, struct sig_key **out, char *why, size_t whylen)
{
	struct sig_key *k = calloc(1, sizeof(*k));
	if (k == NULL) {
		EVP_PKEY_free(pkey);
		return -ENOMEM;
	}
	k->pkey = pkey;
	k->priv = priv;
	int rc = classify(pkey, &k->alg, k->name, sizeof(k->name), why, whylen);
	unsigned char *der = NULL;
	int dl = rc == 0 ? i2d_PUBKEY(pkey, &der) : -1;
	if (rc == 0 && dl <= 0) {
		errbuf_set(why, whylen, "cannot encode the public key");
		rc = -EINVAL;
	}
	if (rc == 0) {
		unsigned char md[32];
		unsigned int ml = 0;
		EVP_Digest(der, (size_t)dl, md, &ml, EVP_sha256(), NULL);
		memcpy(k->fp, "sha256:", 7);
		hex_encode(md, 32, k->fp + 7);
	}
	OPENSSL_free(der);
	if (rc < 0) {
		sig_key_free(k);
		return rc;
	}
	*out = k;
	return 0;
}

static bool is_cosign_encrypted(const char *pem, size_t len)
{
	static const char *marks[] = {"ENCRYPTED SIGSTORE PRIVATE KEY",
	                              "ENCRYPTED COSIGN PRIVATE KEY"};
	for (size_t i = 0; i < 2; i++)
		if (memmem(pem, len, marks[i], strlen(marks[i])) != NULL)
			return true;
	return false;
}

/* One PEM block from bio into *pkey: public key forms, or a private key
 * (then *priv). -ENOENT when no block is left. */
static int read_pem_key(BIO *bio, const char *pass, EVP_PKEY **pkey, bool *priv, char *why,
                        size_t whylen)
{
	char *name = NULL, *header = NULL;
	unsigned char *data = NULL;
	long len = 0;
	ERR_clear_error();
	if (!PEM_read_bio(bio, &name, &header, &data, &len)) {
		unsigned long e = ERR_peek_last_error();
		ERR_clear_error();
		if (ERR_GET_REASON(e) == PEM_R_NO_START_LINE)
			return -ENOENT;
		errbuf_set(why, whylen, "malformed PEM");
		return -EINVAL;
	}
	int rc = 0;
	const unsigned char *p = data;
	EVP_PKEY *k = NULL;
	*priv = false;
	if (strcmp(name, "PUBLIC KEY") == 0) {
		k = d2i_PUBKEY(NULL, &p, len);
	} else if (strcmp(name, "RSA PUBLIC KEY") == 0) {
		k = d2i_PublicKey(EVP_PKEY_RSA, NULL, &p, len);
	} else if (strstr(name, "PRIVATE KEY") != NULL && strstr(name, "SIGSTORE") == NULL &&
	           strstr(name, "COSIGN") == NULL) {
		/* Re-encode the block and let OpenSSL handle PKCS#8, SEC1, PKCS#1
		 * and encryption (legacy headers included). */
		BIO *b = BIO_new(BIO_s_mem());
		if (b && PEM_write_bio(b, name, header, data, len) > 0)
			k = PEM_read_bio_PrivateKey(b, NULL, NULL, (void *)(pass ? pass : ""));
		BIO_free(b);
		*priv = true;
		if (k == NULL) {
			errbuf_set(why, whylen, "cannot read the private key (%s)%s", name,
			           strstr(name, "ENCRYPTED") || strstr(header, "ENCRYPTED")
			               ? ": wrong passphrase?"
			               : "");
			rc = -EINVAL;
		}
	} else {
		errbuf_set(why, whylen, "PEM block '%s' is not a key this accepts", name);
		rc = -EINVAL;
	}
	if (rc == 0 && k == NULL) {
		errbuf_set(why, whylen, "cannot parse the %s", name);
		rc = -EINVAL;
	}
	OPENSSL_free(name);
	OPENSSL_free(header);
	OPENSSL_free(data);
	ERR_clear_error();
	if (rc == 0)
		*pkey = k;
	return rc;
}

static int load_key(const char *pem, size_t len, const char *pass, bool want_priv,
                    struct sig_key **out, char *why, size_t whylen)
{
	if (pem == NULL || len == 0 || len > MAX_KEY_FILE || len > INT32_MAX) {
		errbuf_set(why, whylen, "empty or oversized key");
		return -EINVAL;
	}
	if (is_cosign_encrypted(pem, len)) {
		errbuf_set(why, whylen,
		           "cosign-encrypted private keys are not supported: convert the key to "
		           "PKCS#8 PEM");
		return -EINVAL;
	}
	BIO *bio = BIO_new_mem_buf(pem, (int)len);
	if (bio == NULL)
		return -ENOMEM;
	EVP_PKEY *pkey = NULL;
	bool priv = false;
	int rc = read_pem_key(bio, pass, &pkey, &priv, why, whylen);
	BIO_free(bio);
	if (rc == -ENOENT) {
		errbuf_set(why, whylen, "no PEM key found");
		return -EINVAL;
	}
	if (rc < 0)
		return rc;
	if (want_priv && !priv) {
		EVP_PKEY_free(pkey);
		errbuf_set(why, whylen, "a public key was given where a private key is needed");
		return -EINVAL;
	}
	return key_wrap(pkey, priv, out, why, whylen);
}

int sig_key_load_public(const char *pem, size_t len, struct sig_key **out, char *why, size_t whylen)
{
	struct sig_key *k;
	int rc = load_key(pem, len, NULL, false, &k, why, whylen);
	if (rc < 0)
		return rc;
	k->priv = false; /* only the public half is used */
	*out = k;
	return 0;
}

int sig_key_load_private(const char *pem, size_t len, const char *passphrase, struct sig_key **out,
                         char *why, size_t whylen)
{
	return load_key(pem, len, passphrase, true, out, why, whylen);
}

static int slurp(const char *path, char **buf, size_t *len, char *why, size_t whylen)
{
	int rc = fsutil_read_file(path, MAX_KEY_FILE, buf, len);
	if (rc)
		errbuf_set(why, whylen, "%s: %s", path,
		           rc == -EFBIG ? "larger than 64 KiB" : strerror(-rc));
	return rc;
}

int sig_key_load_public_file(const char *path, struct sig_key **out, char *why, size_t whylen)
{
	char *b;
	size_t n;
	int rc = slurp(path, &b, &n, why, whylen);
	if (rc < 0)
		return rc;
	rc = sig_key_load_public(b, n, out, why, whylen);
	free(b);
	return rc;
}

int sig_key_load_private_file(const char *path, const char *passphrase, struct sig_key **out,
                              char *why, size_t whylen)
{
	char *b;
	size_t n;
	int rc = slurp(path, &b, &n, why, whylen);
	if (rc < 0)
		return rc;
	rc = sig_key_load_private(b, n, passphrase, out, why, whylen);
	OPENSSL_cleanse(b, n);
	free(b);
	return rc;
}

void sig_key_free(struct sig_key *k)
{
	if (k == NULL)
		return;
	EVP_PKEY_free(k->pkey);
	free(k);
}

enum sig_key_alg sig_key_alg(const struct sig_key *k)
{
	return k->alg;
}

const char *sig_key_alg_name(const struct sig_key *k)
{
	return k->name;
}

bool sig_key_is_private(const struct sig_key *k)
{
	return k->priv;
}

const char *sig_key_fingerprint(const struct sig_key *k)
{
	return k->fp;
}

static int bio_string(BIO *b, char **out)
{
	char *p;
	long n = BIO_get_mem_data(b, &p);
	if (n < 0)
		return -EIO;
	char *s = malloc((size_t)n + 1);
	if (s == NULL)
		return -ENOMEM;
	memcpy(s, p, (size_t)n);
	s[n] = '\0';
	*out = s;
	return 0;
}

int sig_key_public_pem(const struct sig_key *k, char **out)
{
	BIO *b = BIO_new(BIO_s_mem());
	if (b == NULL)
		return -ENOMEM;
	int rc = PEM_write_bio_PUBKEY(b, k->pkey) ? bio_string(b, out) : -EIO;
	BIO_free(b);
	return rc;
}

int sig_keygen_p256(const char *passphrase, char **priv_pem, char **pub_pem)
{
	EVP_PKEY *pkey = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
	if (pkey == NULL)
		return -EIO;
	int rc = -EIO;
	char *priv = NULL, *pub = NULL;
	BIO *b = BIO_new(BIO_s_mem());
	bool enc = passphrase && passphrase[0];
	if (b && PEM_write_bio_PKCS8PrivateKey(b, pkey, enc ? EVP_aes_256_cbc() : NULL, NULL, 0,
	                                       NULL, enc ? (void *)passphrase : NULL))
		rc = bio_string(b, &priv);
	BIO_free(b);
	b = BIO_new(BIO_s_mem());
	if (rc == 0)
		rc = b && PEM_write_bio_PUBKEY(b, pkey) ? bio_string(b, &pub) : -EIO;
	BIO_free(b);
	EVP_PKEY_free(pkey);
	if (rc < 0) {
		free(priv);
		free(pub);
		return rc;
	}
	*priv_pem = priv;
	*pub_pem = pub;
	return 0;
}

/* ---- key sets ---- */

int sig_keyset_new(struct sig_keyset **out)
{
	struct sig_keyset *ks = calloc(1, sizeof(*ks));
	if (ks == NULL)
		return -ENOMEM;
	*out = ks;
	return 0;
}

void sig_keyset_free(struct sig_keyset *ks)
{
	if (ks == NULL)
		return;
	for (size_t i = 0; i < ks->n; i++)
		sig_key_free(ks->keys[i]);
	free(ks->keys);
	sig_keyless_free(ks->keyless);
	free(ks);
}

int sig_keyset_add(struct sig_keyset *ks, struct sig_key *k)
{
	for (size_t i = 0; i < ks->n; i++) {
		if (strcmp(ks->keys[i]->fp, k->fp) == 0) {
			sig_key_free(k);
			return 0;
		}
	}
	if (ks->n == ks->cap) {
		size_t ncap = ks->cap ? ks->cap * 2 : 4;
		struct sig_key **nk = realloc(ks->keys, ncap * sizeof(*nk));
		if (nk == NULL)
			return -ENOMEM;
		ks->keys = nk;
		ks->cap = ncap;
	}
	ks->keys[ks->n++] = k;
	ks->fp[0] = '\0';
	return 0;
}

int sig_keyset_add_pem(struct sig_keyset *ks, const char *pem, size_t len, char *why, size_t whylen)
{
	if (pem == NULL || len == 0 || len > 16 * MAX_KEY_FILE) {
		errbuf_set(why, whylen, "empty or oversized key list");
		return -EINVAL;
	}
	BIO *bio = BIO_new_mem_buf(pem, (int)len);
	if (bio == NULL)
		return -ENOMEM;
	struct sig_key *found[64];
	size_t n = 0;
	int rc = 0;
	char one[200] = "";
	for (;;) {
		EVP_PKEY *pkey = NULL;
		bool priv;
		rc = read_pem_key(bio, NULL, &pkey, &priv, one, sizeof(one));
		if (rc == -ENOENT) {
			rc = n ? 0 : -EINVAL;
			if (rc)
				errbuf_set(why, whylen, "no PEM public key found");
			break;
		}
		if (rc == 0 && n == sizeof(found) / sizeof(found[0])) {
			EVP_PKEY_free(pkey);
			errbuf_set(why, whylen, "more than 64 keys");
			rc = -E2BIG;
		}
		if (rc == 0)
			rc = key_wrap(pkey, false, &found[n], one, sizeof(one));
		if (rc < 0) {
			if (rc != -E2BIG)
				errbuf_set(why, whylen, "key %zu: %s", n + 1, one);
			break;
		}
		n++;
	}
	BIO_free(bio);
	for (size_t i = 0; i < n; i++) {
		if (rc == 0 && (rc = sig_keyset_add(ks, found[i])) == 0)
			continue;
		sig_key_free(found[i]);
	}
	return rc;
}

size_t sig_keyset_count(const struct sig_keyset *ks)
{
	return ks->n + sig_keyless_nrules(ks->keyless);
}

size_t sig_keyset_nkeys(const struct sig_keyset *ks)
{
	return ks->n;
}

void sig_keyset_set_keyless(struct sig_keyset *ks, struct sig_keyless *kl)
{
	sig_keyless_free(ks->keyless);
	ks->keyless = kl;
	ks->fp[0] = '\0';
}

const struct sig_keyless *sig_keyset_keyless(const struct sig_keyset *ks)
{
	return ks ? ks->keyless : NULL;
}

bool sig_keyset_has(const struct sig_keyset *ks, const char *fingerprint)
{
	for (size_t i = 0; ks && fingerprint && i < ks->n; i++)
		if (strcmp(ks->keys[i]->fp, fingerprint) == 0)
			return true;
	return ks && sig_keyless_has(ks->keyless, fingerprint);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *sig_keyset_fingerprint(const struct sig_keyset *ks_const)
{
	struct sig_keyset *ks = (struct sig_keyset *)ks_const; /* lazily computed cache */
	if (ks->fp[0])
		return ks->fp;
	const char **fps = calloc(ks->n ? ks->n : 1, sizeof(*fps));
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned char out[32];
	if (fps == NULL || md == NULL || !EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
		free(fps);
		EVP_MD_CTX_free(md);
		return "sha256:unavailable";
	}
	for (size_t i = 0; i < ks->n; i++)
		fps[i] = ks->keys[i]->fp;
	qsort(fps, ks->n, sizeof(*fps), cmp_str);
	for (size_t i = 0; i < ks->n; i++) {
		EVP_DigestUpdate(md, fps[i], strlen(fps[i]));
		EVP_DigestUpdate(md, "\n", 1);
	}
	if (ks->keyless) /* keys alone keep the fingerprint they had */
		EVP_DigestUpdate(md, sig_keyless_fingerprint(ks->keyless),
		                 strlen(sig_keyless_fingerprint(ks->keyless)));
	EVP_DigestFinal_ex(md, out, NULL);
	EVP_MD_CTX_free(md);
	free(fps);
	memcpy(ks->fp, "sha256:", 7);
	hex_encode(out, 32, ks->fp + 7);
	return ks->fp;
}

/* ---- raw signatures ---- */

static bool verify_md(EVP_PKEY *pkey, const EVP_MD *md, const void *msg, size_t len,
                      const unsigned char *sig, size_t siglen)
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	bool ok = ctx && EVP_DigestVerifyInit(ctx, NULL, md, NULL, pkey) == 1 &&
	          EVP_DigestVerify(ctx, sig, siglen, msg, len) == 1;
	EVP_MD_CTX_free(ctx);
	ERR_clear_error();
	return ok;
}

/* Whether k verifies sig over msg with the algorithm its key implies. */
static bool key_verifies(const struct sig_key *k, const void *msg, size_t len,
                         const unsigned char *sig, size_t siglen)
{
	switch (k->alg) {
	case SIG_ALG_ED25519:
		return verify_md(k->pkey, NULL, msg, len, sig, siglen);
	case SIG_ALG_ECDSA_P384:
		return verify_md(k->pkey, EVP_sha256(), msg, len, sig, siglen) ||
		       verify_md(k->pkey, EVP_sha384(), msg, len, sig, siglen);
	case SIG_ALG_ECDSA_P521:
		return verify_md(k->pkey, EVP_sha256(), msg, len, sig, siglen) ||
		       verify_md(k->pkey, EVP_sha512(), msg, len, sig, siglen);
	default: /* P-256 and RSA PKCS#1 v1.5 (OpenSSL's default RSA padding) */
		return verify_md(k->pkey, EVP_sha256(), msg, len, sig, siglen);
	}
}

static int sign_raw(const struct sig_key *k, const void *msg, size_t len, char **sig_b64)
{
	if (!k->priv)
		return -EINVAL;
	const EVP_MD *md = k->alg == SIG_ALG_ED25519 ? NULL : EVP_sha256();
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char *sig = NULL;
	size_t siglen = 0;
	int rc = -EIO;
	if (ctx && EVP_DigestSignInit(ctx, NULL, md, NULL, k->pkey) == 1 &&
	    EVP_DigestSign(ctx, NULL, &siglen, msg, len) == 1 && (sig = malloc(siglen)) != NULL &&
	    EVP_DigestSign(ctx, sig, &siglen, msg, len) == 1)
		rc = base64_encode(sig, siglen, sig_b64);
	free(sig);
	EVP_MD_CTX_free(ctx);
	ERR_clear_error();
	return rc;
}

/* Index of the first key in ks verifying sig over msg, or -1. */
static long first_verifying(const struct sig_keyset *ks, const void *msg, size_t len,
                            const unsigned char *sig, size_t siglen)
{
	for (size_t i = 0; i < ks->n; i++)
		if (key_verifies(ks->keys[i], msg, len, sig, siglen))
			return (long)i;
	return -1;
}

/* ---- payloads ---- */

static bool digest_ok(const char *d, char *why, size_t whylen)
{
	bool ok = d != NULL && strncmp(d, "sha256:", 7) == 0 && strlen(d) == 7 + 64;
	for (size_t i = 7; ok && i < 7 + 64; i++)
		ok = (d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f');
	if (!ok)
		errbuf_set(why, whylen, "invalid image digest '%.80s'", d ? d : "");
	return ok;
}

int sig_dsse_pae(const char *type, const void *body, size_t body_len, unsigned char **out,
                 size_t *out_len)
{
	size_t tl = strlen(type);
	char head[128];
	int hn = snprintf(head, sizeof(head), "DSSEv1 %zu ", tl);
	char mid[48];
	int mn = snprintf(mid, sizeof(mid), " %zu ", body_len);
	size_t total = (size_t)hn + tl + (size_t)mn + body_len;
	unsigned char *p = malloc(total ? total : 1);
	if (p == NULL)
		return -ENOMEM;
	memcpy(p, head, (size_t)hn);
	memcpy(p + hn, type, tl);
	memcpy(p + hn + tl, mid, (size_t)mn);
	if (body_len)
		memcpy(p + hn + tl + mn, body, body_len);
	*out = p;
	*out_len = total;
	return 0;
}

/* A JSON object parsed from outside input, or NULL with "<what> is not a
 * JSON object" in why. Caller frees with cJSON_Delete(). */
static cJSON *parse_object(const void *p, size_t len, const char *what, char *why, size_t whylen)
{
	cJSON *j = cJSON_ParseWithLength(p, len);
	if (j != NULL && cJSON_IsObject(j))
		return j;
	cJSON_Delete(j);
	errbuf_set(why, whylen, "%s is not a JSON object", what);
	return NULL;
}

static const char *jstr(const cJSON *obj, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
	return cJSON_IsString(it) ? it->valuestring : NULL;
}

int sig_check_simple_payload(const void *payload, size_t len, const char *image_digest, char *why,
                             size_t whylen)
{
	if (len > SIGNATURE_MAX_PAYLOAD) {
		errbuf_set(why, whylen, "payload is %zu bytes (limit %u)", len,
		           SIGNATURE_MAX_PAYLOAD);
		return -EMSGSIZE;
	}
	cJSON *j = parse_object(payload, len, "payload", why, whylen);
	if (j == NULL)
		return -EBADMSG;
	int rc = -EBADMSG;
	const cJSON *crit = cJSON_GetObjectItemCaseSensitive(j, "critical");
	const cJSON *image = cJSON_GetObjectItemCaseSensitive(crit, "image");
	const char *type = jstr(crit, "type");
	const char *digest = jstr(image, "docker-manifest-digest");
	if (!cJSON_IsObject(crit))
		errbuf_set(why, whylen, "payload has no 'critical' object");
	else if (type == NULL || strcmp(type, SIGNATURE_PAYLOAD_TYPE) != 0)
		errbuf_set(why, whylen, "payload critical.type is '%.80s', not '%s'",
		           type ? type : "(missing)", SIGNATURE_PAYLOAD_TYPE);
	else if (digest == NULL)
		errbuf_set(why, whylen, "payload has no critical.image.docker-manifest-digest");
	else if (image_digest == NULL || strcmp(digest, image_digest) != 0)
		errbuf_set(why, whylen, "payload is for image %.80s, not %s", digest,
		           image_digest ? image_digest : "(none)");
	else
		rc = 0;
	cJSON_Delete(j);
	return rc;
}

/* Longest signature text read (an RSA-16384 signature wrapped at 64 columns
 * fits); anything longer is refused before decoding. */
#define SIG_TEXT_MAX 4096

/* Decode a base64 field of a signature (text may be NULL: missing). On
 * failure why names the field and, for bad text, the offset Go's decoder
 * (cosign's) would report. -EBADMSG, -EMSGSIZE or -ENOMEM. */
static int decode_field(const char *text, enum base64_dialect d, size_t max, const char *what,
                        unsigned char **out, size_t *out_len, char *why, size_t whylen)
{
	if (text == NULL) {
		errbuf_set(why, whylen, "%s is missing", what);
		return -EBADMSG;
	}
	size_t n = strlen(text), bad = 0;
	if (n > max) {
		errbuf_set(why, whylen, "%s is %zu characters of base64 (limit %zu)", what, n, max);
		return -EMSGSIZE;
	}
	int rc = base64_decode(text, n, d, out, out_len, &bad);
	if (rc == -EINVAL) {
		errbuf_set(why, whylen,
		           "%s is not valid base64 (illegal base64 data at input byte %zu)", what,
		           bad);
		return -EBADMSG;
	}
	if (rc < 0)
		errbuf_set(why, whylen, "out of memory decoding %s", what);
	return rc;
}

/* Checks shared by both verifiers before any parsing. */
static int precheck(const struct sig_keyset *ks, const char *image_digest, size_t len, size_t max,
                    const char *what, char *why, size_t whylen)
{
	if (ks == NULL || ks->n == 0) {
		errbuf_set(why, whylen, "no trusted keys configured");
		return -ENOKEY;
	}
	if (!digest_ok(image_digest, why, whylen))
		return -EINVAL;
	if (len > max) {
		errbuf_set(why, whylen, "%s is %zu bytes (limit %zu)", what, len, max);
		return -EMSGSIZE;
	}
	return 0;
}

int sig_verify_simple(const struct sig_keyset *ks, const char *image_digest, const void *payload,
                      size_t len, const char *signature_b64, char *fp_out, char *why, size_t whylen)
{
	int pre = precheck(ks, image_digest, len, SIGNATURE_MAX_PAYLOAD, "payload", why, whylen);
	if (pre < 0)
		return pre;
	unsigned char *sig = NULL;
	size_t siglen = 0;
	/* cosign and containers/image read the annotation with Go's StdEncoding */
	int rc = decode_field(signature_b64, BASE64_STD, SIG_TEXT_MAX, "signature", &sig, &siglen,
	                      why, whylen);
	if (rc < 0)
		return rc;
	if (siglen == 0) {
		free(sig);
		errbuf_set(why, whylen, "signature is empty");
		return -EBADMSG;
	}
	long k = first_verifying(ks, payload, len, sig, siglen);
	free(sig);
	if (k < 0) {
		errbuf_set(why, whylen, "no trusted key verifies the signature");
		return -EKEYREJECTED;
	}
	rc = sig_check_simple_payload(payload, len, image_digest, why, whylen);
	if (rc < 0)
		return rc;
	if (fp_out)
		snprintf(fp_out, SIGNATURE_FP_MAX, "%s", ks->keys[k]->fp);
	return 0;
}

/* The in-toto statement must be a cosign image signature naming the image. */
static int check_statement(const unsigned char *body, size_t len, const char *image_digest,
                           char *why, size_t whylen)
{
	cJSON *j = parse_object(body, len, "DSSE payload", why, whylen);
	if (j == NULL)
		return -EBADMSG;
	int rc = -EBADMSG;
	const char *type = jstr(j, "_type");
	const char *pred = jstr(j, "predicateType");
	const cJSON *subjects = cJSON_GetObjectItemCaseSensitive(j, "subject");
	const char *want =
	    image_digest && strncmp(image_digest, "sha256:", 7) == 0 ? image_digest + 7 : "";
	if (type == NULL ||
	    (strcmp(type, INTOTO_STATEMENT_V1) != 0 && strcmp(type, INTOTO_STATEMENT_V01) != 0)) {
		errbuf_set(why, whylen, "DSSE payload is not an in-toto statement");
		goto out;
	}
	if (pred == NULL || strcmp(pred, COSIGN_SIGN_PREDICATE) != 0) {
		errbuf_set(why, whylen,
		           "statement predicateType is '%.80s', not an image signature (%s)",
		           pred ? pred : "(missing)", COSIGN_SIGN_PREDICATE);
		goto out;
	}
	if (!cJSON_IsArray(subjects) || cJSON_GetArraySize(subjects) == 0 ||
	    cJSON_GetArraySize(subjects) > MAX_SUBJECTS) {
		errbuf_set(why, whylen, "statement has no subjects");
		goto out;
	}
	const char *first = NULL;
	const cJSON *s;
	cJSON_ArrayForEach(s, subjects)
	{
		const char *hex = jstr(cJSON_GetObjectItemCaseSensitive(s, "digest"), "sha256");
		if (hex && !first)
			first = hex;
		if (hex && want[0] && strcmp(hex, want) == 0) {
			rc = 0;
			goto out;
		}
	}
	errbuf_set(why, whylen, "statement is for sha256:%.64s, not %s",
	           first ? first : "(no sha256 subject)", image_digest ? image_digest : "(none)");
out:
	cJSON_Delete(j);
	return rc;
}

int sig_verify_bundle(const struct sig_keyset *ks, const char *image_digest, const void *bundle,
                      size_t len, char *fp_out, char *why, size_t whylen)
{
	int pre = precheck(ks, image_digest, len, SIGNATURE_MAX_BUNDLE, "bundle", why, whylen);
	if (pre < 0)
		return pre;
	cJSON *j = parse_object(bundle, len, "bundle", why, whylen);
	unsigned char *body = NULL, *pae = NULL;
	size_t body_len = 0, pae_len = 0;
	int rc = -EBADMSG;
	if (j == NULL)
		goto out;
	const char *mt = jstr(j, "mediaType");
	if (mt == NULL || strncmp(mt, "application/vnd.dev.sigstore.bundle", 35) != 0) {
		errbuf_set(why, whylen, "not a sigstore bundle (mediaType '%.80s')",
		           mt ? mt : "(missing)");
		goto out;
	}
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(j, "dsseEnvelope");
	if (!cJSON_IsObject(env)) {
		if (cJSON_GetObjectItemCaseSensitive(j, "messageSignature")) {
			errbuf_set(
			    why, whylen,
			    "messageSignature bundles are not supported (need a DSSE envelope)");
			rc = -EPROTONOSUPPORT;
		} else {
			errbuf_set(why, whylen, "bundle has no dsseEnvelope");
		}
		goto out;
	}
	const char *ptype = jstr(env, "payloadType");
	const char *payload = jstr(env, "payload");
	const cJSON *sigs = cJSON_GetObjectItemCaseSensitive(env, "signatures");
	if (ptype == NULL || strcmp(ptype, SIGNATURE_INTOTO_TYPE) != 0) {
		errbuf_set(why, whylen, "DSSE payloadType is '%.80s', not %s",
		           ptype ? ptype : "(missing)", SIGNATURE_INTOTO_TYPE);
		goto out;
	}
	/* bundles are read through protobuf's JSON mapping (sigstore-go, cosign v3);
	 * the text is bounded by the bundle's size, the statement after decoding */
	if ((rc = decode_field(payload, BASE64_PROTOJSON, SIGNATURE_MAX_BUNDLE, "DSSE payload",
	                       &body, &body_len, why, whylen)) < 0)
		goto out;
	if (body_len > SIGNATURE_MAX_PAYLOAD) {
		errbuf_set(why, whylen, "DSSE payload is %zu bytes (limit %u)", body_len,
		           SIGNATURE_MAX_PAYLOAD);
		rc = -EMSGSIZE;
		goto out;
	}
	rc = -EBADMSG;
	if (!cJSON_IsArray(sigs) || cJSON_GetArraySize(sigs) == 0 ||
	    cJSON_GetArraySize(sigs) > MAX_DSSE_SIGS) {
		errbuf_set(why, whylen, "DSSE envelope has no signatures (or more than %d)",
		           MAX_DSSE_SIGS);
		goto out;
	}
	if ((rc = sig_dsse_pae(ptype, body, body_len, &pae, &pae_len)) < 0)
		goto out;
	long k = -1;
	bool any_decoded = false;
	char first_bad[160] = "";
	const cJSON *s;
	cJSON_ArrayForEach(s, sigs)
	{
		unsigned char *sig = NULL;
		size_t siglen = 0;
		char bad[160];
		if (decode_field(jstr(s, "sig"), BASE64_PROTOJSON, SIG_TEXT_MAX, "DSSE signature",
		                 &sig, &siglen, bad, sizeof(bad)) < 0) {
			if (!first_bad[0])
				snprintf(first_bad, sizeof(first_bad), "%s", bad);
			continue;
		}
		any_decoded = true;
		k = first_verifying(ks, pae, pae_len, sig, siglen);
		free(sig);
		if (k >= 0)
			break;
	}
	if (k < 0) {
		rc = any_decoded ? -EKEYREJECTED : -EBADMSG;
		errbuf_set(why, whylen, "%s",
		           any_decoded ? "no trusted key verifies the DSSE signature" : first_bad);
		goto out;
	}
	if ((rc = check_statement(body, body_len, image_digest, why, whylen)) < 0)
		goto out;
	if (fp_out)
		snprintf(fp_out, SIGNATURE_FP_MAX, "%s", ks->keys[k]->fp);
	rc = 0;
out:
	free(pae);
	free(body);
	cJSON_Delete(j);
	return rc;
}

int sig_verify(const struct sig_keyset *ks, const char *image_digest, const struct sig_candidate *c,
               size_t n, struct sig_verdict *out)
{
	struct sig_verdict v;
	memset(&v, 0, sizeof(v));
	if (ks == NULL || sig_keyset_count(ks) == 0) {
		snprintf(v.reason, sizeof(v.reason), "no trusted keys configured");
		*out = v;
		return -ENOKEY;
	}
	if (n == 0) {
		snprintf(v.reason, sizeof(v.reason), "image %s is not signed (no signatures found)",
		         image_digest ? image_digest : "");
		*out = v;
		return -ENODATA;
	}
	size_t used = 0;
	for (size_t i = 0; i < n; i++) {
		struct sig_verdict one;
		int rc = sig_verify_one(ks, image_digest, &c[i], &one);
		const char *src = c[i].source ? c[i].source : "", *why = one.reason;
		if (rc == 0) {
			*out = one;
			return 0;
		}
		if (used < sizeof(v.reason) - 1) {
			int w = snprintf(v.reason + used, sizeof(v.reason) - used,
			                 "%ssignature %zu%s%s: %s", used ? "; " : "", i + 1,
			                 src[0] ? " " : "", src, why);
			used = w < 0 ? used : used + (size_t)w;
			if (used >= sizeof(v.reason))
				used = sizeof(v.reason) - 1;
		}
	}
	*out = v;
	return -EKEYREJECTED;
}

/* ---- signing ---- */

int sig_sign_simple(const struct sig_key *priv, const char *docker_reference,
                    const char *image_digest, char **payload, size_t *payload_len,
                    char **signature_b64)
{
	if (priv == NULL || !priv->priv || image_digest == NULL)
		return -EINVAL;
	cJSON *j = cJSON_CreateObject();
	cJSON *crit = cJSON_AddObjectToObject(j, "critical");
	cJSON *id = cJSON_AddObjectToObject(crit, "identity");
	cJSON_AddStringToObject(id, "docker-reference", docker_reference ? docker_reference : "");
	cJSON *img = cJSON_AddObjectToObject(crit, "image");
	cJSON_AddStringToObject(img, "docker-manifest-digest", image_digest);
	cJSON_AddStringToObject(crit, "type", SIGNATURE_PAYLOAD_TYPE);
	cJSON_AddNullToObject(j, "optional");
	char *p = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (p == NULL)
		return -ENOMEM;
	char *sig = NULL;
	int rc = sign_raw(priv, p, strlen(p), &sig);
	if (rc < 0) {
		free(p);
		return rc;
	}
	*payload_len = strlen(p);
	*payload = p;
	*signature_b64 = sig;
	return 0;
}

int sig_sign_bundle(const struct sig_key *priv, const char *subject_name, const char *image_digest,
                    char **bundle, size_t *bundle_len)
{
	if (priv == NULL || !priv->priv || image_digest == NULL ||
	    strncmp(image_digest, "sha256:", 7) != 0)
		return -EINVAL;
	cJSON *st = cJSON_CreateObject();
	cJSON_AddStringToObject(st, "_type", INTOTO_STATEMENT_V1);
	cJSON *subs = cJSON_AddArrayToObject(st, "subject");
	cJSON *sub = cJSON_CreateObject();
	if (subject_name && subject_name[0])
		cJSON_AddStringToObject(sub, "name", subject_name);
	cJSON *dg = cJSON_AddObjectToObject(sub, "digest");
	cJSON_AddStringToObject(dg, "sha256", image_digest + 7);
	cJSON_AddItemToArray(subs, sub);
	cJSON_AddStringToObject(st, "predicateType", COSIGN_SIGN_PREDICATE);
	cJSON_AddObjectToObject(st, "predicate");
	char *body = cJSON_PrintUnformatted(st);
	cJSON_Delete(st);
	if (body == NULL)
		return -ENOMEM;
	unsigned char *pae = NULL;
	size_t pae_len = 0;
	char *sig = NULL, *body64 = NULL, *out = NULL;
	int rc = sig_dsse_pae(SIGNATURE_INTOTO_TYPE, body, strlen(body), &pae, &pae_len);
	if (rc == 0)
		rc = sign_raw(priv, pae, pae_len, &sig);
	if (rc == 0)
		rc = base64_encode(body, strlen(body), &body64);
	if (rc == 0) {
		cJSON *b = cJSON_CreateObject();
		cJSON_AddStringToObject(b, "mediaType", SIGNATURE_BUNDLE_MEDIA_TYPE);
		cJSON *vm = cJSON_AddObjectToObject(b, "verificationMaterial");
		cJSON *pk = cJSON_AddObjectToObject(vm, "publicKey");
		cJSON_AddStringToObject(pk, "hint", priv->fp + 7);
		cJSON_AddArrayToObject(vm, "tlogEntries");
		cJSON *env = cJSON_AddObjectToObject(b, "dsseEnvelope");
		cJSON_AddStringToObject(env, "payload", body64);
		cJSON_AddStringToObject(env, "payloadType", SIGNATURE_INTOTO_TYPE);
		cJSON *sigs = cJSON_AddArrayToObject(env, "signatures");
		cJSON *s = cJSON_CreateObject();
		cJSON_AddStringToObject(s, "sig", sig);
		cJSON_AddStringToObject(s, "keyid", "");
		cJSON_AddItemToArray(sigs, s);
		out = cJSON_PrintUnformatted(b);
		cJSON_Delete(b);
		rc = out ? 0 : -ENOMEM;
	}
	free(pae);
	free(sig);
	free(body64);
	free(body);
	if (rc < 0)
		return rc;
	*bundle_len = strlen(out);
	*bundle = out;
	return 0;
}

/* ---- verification cache ---- */

struct cache_entry {
	char digest[80];
	char ksfp[SIGNATURE_FP_MAX];
	struct sig_verdict v;
	int64_t expires;
	uint64_t seq;
	bool used;
};

struct sig_cache {
	pthread_mutex_t mu;
	struct cache_entry *e;
	size_t cap;
	int64_t ttl_ok, ttl_rej;
	uint64_t seq;
};

static int64_t now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec;
}

int sig_cache_new(size_t max_entries, int64_t ttl_ok, int64_t ttl_rejected, struct sig_cache **out)
{
	if (max_entries == 0 || max_entries > 1u << 20 || ttl_ok < 0 || ttl_rejected < 0)
		return -EINVAL;
	struct sig_cache *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	c->e = calloc(max_entries, sizeof(*c->e));
	if (c->e == NULL) {
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_init(&c->mu, NULL);
	c->cap = max_entries;
	c->ttl_ok = ttl_ok;
	c->ttl_rej = ttl_rejected;
	*out = c;
	return 0;
}

void sig_cache_free(struct sig_cache *c)
{
	if (c == NULL)
		return;
	pthread_mutex_destroy(&c->mu);
	free(c->e);
	free(c);
}

static struct cache_entry *cache_find(struct sig_cache *c, const char *d, const char *fp)
{
	for (size_t i = 0; i < c->cap; i++)
		if (c->e[i].used && strcmp(c->e[i].digest, d) == 0 && strcmp(c->e[i].ksfp, fp) == 0)
			return &c->e[i];
	return NULL;
}

int sig_cache_get(struct sig_cache *c, const char *image_digest, const char *keyset_fp,
                  struct sig_verdict *out)
{
	if (image_digest == NULL || keyset_fp == NULL)
		return -ENOENT;
	int rc = -ENOENT;
	pthread_mutex_lock(&c->mu);
	struct cache_entry *e = cache_find(c, image_digest, keyset_fp);
	if (e && e->expires > now_s()) {
		*out = e->v;
		rc = 0;
	} else if (e) {
		e->used = false;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

void sig_cache_put(struct sig_cache *c, const char *image_digest, const char *keyset_fp,
                   const struct sig_verdict *v)
{
	if (image_digest == NULL || keyset_fp == NULL ||
	    strlen(image_digest) >= sizeof(c->e[0].digest) || strlen(keyset_fp) >= SIGNATURE_FP_MAX)
		return;
	pthread_mutex_lock(&c->mu);
	struct cache_entry *e = cache_find(c, image_digest, keyset_fp);
	if (e == NULL) {
		/* a free slot, else the oldest */
		for (size_t i = 0; i < c->cap; i++) {
			if (!c->e[i].used) {
				e = &c->e[i];
				break;
			}
			if (e == NULL || c->e[i].seq < e->seq)
				e = &c->e[i];
		}
	}
	if (e == NULL) { /* no slots at all */
		pthread_mutex_unlock(&c->mu);
		return;
	}
	snprintf(e->digest, sizeof(e->digest), "%s", image_digest);
	snprintf(e->ksfp, sizeof(e->ksfp), "%s", keyset_fp);
	e->v = *v;
	e->expires = now_s() + (v->accepted ? c->ttl_ok : c->ttl_rej);
	e->seq = ++c->seq;
	e->used = true;
	pthread_mutex_unlock(&c->mu);
}
