/* cosign signatures: keys and signatures are made by the openssl command
 * line tool (an independent producer), and what gkm signs is checked by it
 * too (an independent consumer). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "signature.h"
#include "tarbuild.h"

#define DIG "sha256:4f6b1c3e0c5a9d2b7e8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"
#define OTHER "sha256:0000000000000000000000000000000000000000000000000000000000000bad"

static char dir[300];

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
	char cmd[4096], full[4500];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	snprintf(full, sizeof(full), "cd '%s' && ( %s ) >/dev/null 2>&1", dir, cmd);
	if (system(full) != 0)
		fail_msg("command failed: %s", cmd);
}

static char *slurp(const char *name, size_t *len)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "rb");
	if (f == NULL)
		fail_msg("missing %s", name);
	char *b = calloc(1, 1 << 20);
	size_t n = fread(b, 1, (1 << 20) - 1, f);
	fclose(f);
	if (len)
		*len = n;
	return b;
}

static void spit(const char *name, const char *data, size_t len)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	fclose(f);
}

/* the exact bytes cosign writes */
static void payload_for(const char *digest, char *buf, size_t len)
{
	snprintf(buf, len,
	         "{\"critical\":{\"identity\":{\"docker-reference\":\"registry.test:5000/caches/"
	         "triton\"},"
	         "\"image\":{\"docker-manifest-digest\":\"%s\"},\"type\":\"cosign container image "
	         "signature\"},\"optional\":null}",
	         digest);
}

static int group_setup(void **state)
{
	(void)state;
	tmpdir_make(dir, sizeof(dir), "sig");
	char cmd[2048];
	snprintf(cmd, sizeof(cmd),
	         "( cd '%s' && "
	         "openssl ecparam -name prime256v1 -genkey -noout -out p256.pem && "
	         "openssl ec -in p256.pem -pubout -out p256.pub && "
	         "openssl ecparam -name prime256v1 -genkey -noout -out other.pem && "
	         "openssl ec -in other.pem -pubout -out other.pub && "
	         "openssl ecparam -name secp384r1 -genkey -noout -out p384.pem && "
	         "openssl ec -in p384.pem -pubout -out p384.pub && "
	         "openssl genrsa -out rsa.pem 2048 && "
	         "openssl rsa -in rsa.pem -pubout -out rsa.pub && "
	         "openssl rsa -in rsa.pem -RSAPublicKey_out -out rsa1.pub && "
	         "openssl genrsa -out rsa1024.pem 1024 && "
	         "openssl rsa -in rsa1024.pem -pubout -out rsa1024.pub && "
	         "openssl genpkey -algorithm ed25519 -out ed.pem && "
	         "openssl pkey -in ed.pem -pubout -out ed.pub && "
	         "openssl ecparam -name secp256k1 -genkey -noout -out k1.pem && "
	         "openssl ec -in k1.pem -pubout -out k1.pub"
	         " ) >/dev/null 2>&1",
	         dir);
	return system(cmd) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	tmpdir_remove(dir);
	return 0;
}

static struct sig_keyset *keyset_of(const char *pubfile)
{
	struct sig_keyset *ks;
	struct sig_key *k;
	char p[512], why[256] = "";
	snprintf(p, sizeof(p), "%s/%s", dir, pubfile);
	assert_int_equal(sig_keyset_new(&ks), 0);
	if (sig_key_load_public_file(p, &k, why, sizeof(why)) != 0)
		fail_msg("%s: %s", pubfile, why);
	assert_int_equal(sig_keyset_add(ks, k), 0);
	return ks;
}

/* openssl signs payload.json with key; returns the base64 signature. */
static char *openssl_sign(const char *key, const char *how)
{
	if (strcmp(how, "ed25519") == 0)
		sh("openssl pkeyutl -sign -rawin -inkey %s -in payload.json -out sig.bin", key);
	else
		sh("openssl dgst %s -sign %s -out sig.bin payload.json", how, key);
	sh("base64 -w0 sig.bin > sig.b64");
	return slurp("sig.b64", NULL);
}

/* The key's fingerprint as openssl computes it (SHA-256 of the DER SPKI). */
static void openssl_fp(const char *pub, char *out)
{
	sh("openssl pkey -pubin -in %s -outform DER | sha256sum | cut -c1-64 > fp.txt", pub);
	char *h = slurp("fp.txt", NULL);
	snprintf(out, SIGNATURE_FP_MAX, "sha256:%.64s", h);
	free(h);
}

static void simple_roundtrip(const char *key, const char *pub, const char *how)
{
	char payload[512], why[256] = "", fp[SIGNATURE_FP_MAX] = "", want[SIGNATURE_FP_MAX];
	payload_for(DIG, payload, sizeof(payload));
	spit("payload.json", payload, strlen(payload));
	char *sig = openssl_sign(key, how);
	struct sig_keyset *ks = keyset_of(pub);
	int rc = sig_verify_simple(ks, DIG, payload, strlen(payload), sig, fp, why, sizeof(why));
	if (rc != 0)
		fail_msg("%s/%s: %d %s", key, how, rc, why);
	openssl_fp(pub, want);
	assert_string_equal(fp, want);
	sig_keyset_free(ks);
	free(sig);
}

static void test_ecdsa_p256(void **state)
{
	(void)state;
	simple_roundtrip("p256.pem", "p256.pub", "-sha256");
}

static void test_ecdsa_p384_sha256(void **state)
{
	(void)state;
	simple_roundtrip("p384.pem", "p384.pub", "-sha256");
}

static void test_ecdsa_p384_sha384(void **state)
{
	(void)state;
	simple_roundtrip("p384.pem", "p384.pub", "-sha384");
}

static void test_rsa_spki(void **state)
{
	(void)state;
	simple_roundtrip("rsa.pem", "rsa.pub", "-sha256");
}

static void test_rsa_pkcs1_public_key(void **state)
{
	(void)state;
	simple_roundtrip("rsa.pem", "rsa1.pub", "-sha256");
}

static void test_ed25519(void **state)
{
	(void)state;
	simple_roundtrip("ed.pem", "ed.pub", "ed25519");
}

static void test_wrong_key(void **state)
{
	(void)state;
	char payload[512], why[256] = "";
	payload_for(DIG, payload, sizeof(payload));
	spit("payload.json", payload, strlen(payload));
	char *sig = openssl_sign("p256.pem", "-sha256");
	struct sig_keyset *ks = keyset_of("other.pub");
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL, why, sizeof(why)),
	    -EKEYREJECTED);
	assert_string_equal(why, "no trusted key verifies the signature");
	sig_keyset_free(ks);
	/* An RSA key does not verify an ECDSA signature either. */
	ks = keyset_of("rsa.pub");
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL, why, sizeof(why)),
	    -EKEYREJECTED);
	sig_keyset_free(ks);
	free(sig);
}

static void test_payload_for_another_digest(void **state)
{
	(void)state;
	char payload[512], why[256] = "";
	payload_for(OTHER, payload, sizeof(payload));
	spit("payload.json", payload, strlen(payload));
	char *sig = openssl_sign("p256.pem", "-sha256");
	struct sig_keyset *ks = keyset_of("p256.pub");
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL, why, sizeof(why)),
	    -EBADMSG);
	assert_string_equal(why, "payload is for image " OTHER ", not " DIG);
	sig_keyset_free(ks);
	free(sig);
}

static void test_tampered_payload(void **state)
{
	(void)state;
	char payload[512], why[256] = "";
	payload_for(DIG, payload, sizeof(payload));
	spit("payload.json", payload, strlen(payload));
	char *sig = openssl_sign("p256.pem", "-sha256");
	struct sig_keyset *ks = keyset_of("p256.pub");
	char *reg = strstr(payload, "registry.test");
	reg[0] = 'R'; /* still well-formed, still names the digest */
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL, why, sizeof(why)),
	    -EKEYREJECTED);
	/* trailing whitespace is a change of bytes too */
	reg[0] = 'r';
	strcat(payload, " ");
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL, why, sizeof(why)),
	    -EKEYREJECTED);
	sig_keyset_free(ks);
	free(sig);
}

static void test_bad_base64(void **state)
{
	(void)state;
	char payload[512], why[256] = "";
	payload_for(DIG, payload, sizeof(payload));
	struct sig_keyset *ks = keyset_of("p256.pub");
	/* each refused where Go's decoder (cosign's) refuses it */
	const struct {
		const char *sig, *why;
	} bad[] = {
	    {"not base64!", "signature is not valid base64 (illegal base64 data at input byte 3)"},
	    {"QUJD=x", "signature is not valid base64 (illegal base64 data at input byte 4)"},
	    {"A", "signature is not valid base64 (illegal base64 data at input byte 0)"},
	    {"QUI=QUI=", "signature is not valid base64 (illegal base64 data at input byte 4)"},
	    {"QUI", "signature is not valid base64 (illegal base64 data at input byte 0)"},
	    {"QUJD QUJD", "signature is not valid base64 (illegal base64 data at input byte 4)"},
	    {"QUJD\tQUJD", "signature is not valid base64 (illegal base64 data at input byte 4)"},
	    {"", "signature is empty"},
	    {"\n", "signature is empty"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(sig_verify_simple(ks, DIG, payload, strlen(payload), bad[i].sig,
		                                   NULL, why, sizeof(why)),
		                 -EBADMSG);
		assert_string_equal(why, bad[i].why);
	}
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), NULL, NULL, why, sizeof(why)),
	    -EBADMSG);
	assert_string_equal(why, "signature is missing");
	char *huge = malloc(5000);
	memset(huge, 'A', 4999);
	huge[4999] = '\0';
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), huge, NULL, why, sizeof(why)),
	    -EMSGSIZE);
	assert_string_equal(why, "signature is 4999 characters of base64 (limit 4096)");
	free(huge);
	sig_keyset_free(ks);
}

/* The signature as other tools write it: wrapped by base64(1) at 76
 * columns, by `openssl base64` at 64, with CRLF line ends, with a break
 * inside the padding. All verify, as with cosign; other white space does
 * not. An RSA-2048 signature is 256 bytes: 344 characters ending in "==". */
static void test_wrapped_signature(void **state)
{
	(void)state;
	char payload[512], why[256] = "";
	payload_for(DIG, payload, sizeof(payload));
	spit("payload.json", payload, strlen(payload));
	free(openssl_sign("rsa.pem", "-sha256"));
	struct sig_keyset *ks = keyset_of("rsa.pub");
	const char *ok[] = {
	    "base64 sig.bin",
	    "openssl base64 -in sig.bin",
	    "base64 -w76 sig.bin | sed 's/$/\\r/'",
	    "base64 -w0 sig.bin | sed 's/=$/\\n=/'",
	    "base64 -w1 sig.bin",
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		sh("%s > wrapped.b64", ok[i]);
		char *sig = slurp("wrapped.b64", NULL);
		assert_non_null(strchr(sig, '\n'));
		int rc = sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL, why,
		                           sizeof(why));
		if (rc != 0)
			fail_msg("%s: %d %s", ok[i], rc, why);
		free(sig);
	}
	const struct {
		const char *cmd, *why;
	} bad[] = {
	    {"base64 -w76 sig.bin | tr '\\n' ' '",
	     "signature is not valid base64 (illegal base64 data at input byte 76)"},
	    {"base64 -w76 sig.bin | sed 's/^/\\t/'",
	     "signature is not valid base64 (illegal base64 data at input byte 0)"},
	    /* 342 digits and 5 line breaks: Go counts back the 2 digits of the
	     * short last group from the end */
	    {"base64 sig.bin | tr -d '='",
	     "signature is not valid base64 (illegal base64 data at input byte 345)"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sh("%s > wrapped.b64", bad[i].cmd);
		char *sig = slurp("wrapped.b64", NULL);
		assert_int_equal(sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL,
		                                   why, sizeof(why)),
		                 -EBADMSG);
		assert_string_equal(why, bad[i].why);
		free(sig);
	}
	sig_keyset_free(ks);
}

static void test_wrong_type(void **state)
{
	(void)state;
	char payload[512], why[256] = "";
	snprintf(payload, sizeof(payload),
	         "{\"critical\":{\"identity\":{},\"image\":{\"docker-manifest-digest\":\"%s\"},"
	         "\"type\":\"something else\"},\"optional\":null}",
	         DIG);
	spit("payload.json", payload, strlen(payload));
	char *sig = openssl_sign("p256.pem", "-sha256");
	struct sig_keyset *ks = keyset_of("p256.pub");
	assert_int_equal(
	    sig_verify_simple(ks, DIG, payload, strlen(payload), sig, NULL, why, sizeof(why)),
	    -EBADMSG);
	assert_non_null(strstr(why, "critical.type is 'something else'"));
	assert_int_equal(sig_check_simple_payload("[1,2]", 5, DIG, why, sizeof(why)), -EBADMSG);
	assert_int_equal(sig_check_simple_payload("{\"critical\":", 12, DIG, why, sizeof(why)),
	                 -EBADMSG);
	sig_keyset_free(ks);
	free(sig);
}

static void test_dsse_pae_vector(void **state)
{
	(void)state;
	/* the DSSE specification's example */
	unsigned char *p;
	size_t n;
	assert_int_equal(sig_dsse_pae("http://example.com/HelloWorld", "hello world", 11, &p, &n),
	                 0);
	const char *want = "DSSEv1 29 http://example.com/HelloWorld 11 hello world";
	assert_int_equal(n, strlen(want));
	assert_memory_equal(p, want, n);
	free(p);
	assert_int_equal(sig_dsse_pae("", "", 0, &p, &n), 0);
	assert_int_equal(n, strlen("DSSEv1 0  0 "));
	assert_memory_equal(p, "DSSEv1 0  0 ", n);
	free(p);
}

/* A bundle made by the shell and openssl: statement, PAE by printf, sign. */
static char *openssl_bundle(const char *key, const char *how, const char *subject_hex,
                            const char *predicate, size_t *len)
{
	char st[1024];
	snprintf(st, sizeof(st),
	         "{\"_type\":\"https://in-toto.io/Statement/"
	         "v1\",\"subject\":[{\"name\":\"x\",\"digest\":"
	         "{\"sha512\":\"00\"}},{\"name\":\"registry.test:5000/caches/"
	         "triton\",\"digest\":{\"sha256\":"
	         "\"%s\"}}],\"predicateType\":\"%s\",\"predicate\":{}}",
	         subject_hex, predicate);
	spit("statement.json", st, strlen(st));
	sh("T=application/vnd.in-toto+json; printf 'DSSEv1 %%d %%s %%d ' ${#T} $T $(wc -c < "
	   "statement.json) > "
	   "payload.json && cat statement.json >> payload.json");
	char *sig = openssl_sign(key, how);
	sh("base64 -w0 statement.json > st.b64");
	char *st64 = slurp("st.b64", NULL);
	char *b = malloc(8192);
	snprintf(
	    b, 8192,
	    "{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
	    "\"verificationMaterial\":{\"publicKey\":{\"hint\":\"abc\"},\"tlogEntries\":[]},"
	    "\"dsseEnvelope\":{\"payload\":\"%s\",\"payloadType\":\"application/vnd.in-toto+json\","
	    "\"signatures\":[{\"sig\":\"%s\",\"keyid\":\"\"}]}}",
	    st64, sig);
	free(sig);
	free(st64);
	*len = strlen(b);
	return b;
}

static void test_bundle_made_by_openssl(void **state)
{
	(void)state;
	size_t len;
	char why[256] = "", fp[SIGNATURE_FP_MAX] = "", want[SIGNATURE_FP_MAX];
	char *b = openssl_bundle("p256.pem", "-sha256", DIG + 7,
	                         "https://sigstore.dev/cosign/sign/v1", &len);
	struct sig_keyset *ks = keyset_of("p256.pub");
	int rc = sig_verify_bundle(ks, DIG, b, len, fp, why, sizeof(why));
	if (rc)
		fail_msg("%d %s", rc, why);
	openssl_fp("p256.pub", want);
	assert_string_equal(fp, want);
	/* the same bundle checked against another image */
	assert_int_equal(sig_verify_bundle(ks, OTHER, b, len, NULL, why, sizeof(why)), -EBADMSG);
	assert_string_equal(why, "statement is for sha256:"
	                         "4f6b1c3e0c5a9d2b7e8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"
	                         ", not " OTHER);
	sig_keyset_free(ks);
	/* a key that did not sign it */
	ks = keyset_of("other.pub");
	assert_int_equal(sig_verify_bundle(ks, DIG, b, len, NULL, why, sizeof(why)), -EKEYREJECTED);
	sig_keyset_free(ks);
	free(b);

	b = openssl_bundle("ed.pem", "ed25519", DIG + 7, "https://sigstore.dev/cosign/sign/v1",
	                   &len);
	ks = keyset_of("ed.pub");
	assert_int_equal(sig_verify_bundle(ks, DIG, b, len, NULL, why, sizeof(why)), 0);
	sig_keyset_free(ks);
	free(b);
}

static void test_bundle_refusals(void **state)
{
	(void)state;
	size_t len;
	char why[256] = "";
	struct sig_keyset *ks = keyset_of("p256.pub");
	/* an attestation of another kind, by a trusted key, is not a signature */
	char *b =
	    openssl_bundle("p256.pem", "-sha256", DIG + 7, "https://slsa.dev/provenance/v1", &len);
	assert_int_equal(sig_verify_bundle(ks, DIG, b, len, NULL, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "predicateType is 'https://slsa.dev/provenance/v1'"));
	/* tampered payload: flip a character of the base64 statement */
	char *pl = strstr(b, "\"payload\":\"") + 11;
	pl[10] = pl[10] == 'A' ? 'B' : 'A';
	assert_int_equal(sig_verify_bundle(ks, DIG, b, len, NULL, why, sizeof(why)), -EKEYREJECTED);
	free(b);
	const char *msgsig =
	    "{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
	    "\"verificationMaterial\":{},\"messageSignature\":{\"messageDigest\":"
	    "{\"algorithm\":\"SHA2_256\",\"digest\":\"AA==\"},\"signature\":\"AA==\"}}";
	assert_int_equal(sig_verify_bundle(ks, DIG, msgsig, strlen(msgsig), NULL, why, sizeof(why)),
	                 -EPROTONOSUPPORT);
	const char *notbundle = "{\"mediaType\":\"application/json\"}";
	assert_int_equal(
	    sig_verify_bundle(ks, DIG, notbundle, strlen(notbundle), NULL, why, sizeof(why)),
	    -EBADMSG);
	assert_int_equal(sig_verify_bundle(ks, DIG, "{", 1, NULL, why, sizeof(why)), -EBADMSG);
	sig_keyset_free(ks);
}

/* The text of a bundle field ("payload", "sig") rewritten in place by f. */
static void rewrite_field(char *b, const char *field, void (*f)(char *text, size_t *len))
{
	char key[32];
	snprintf(key, sizeof(key), "\"%s\":\"", field);
	char *t = strstr(b, key);
	assert_non_null(t);
	t += strlen(key);
	size_t len = strcspn(t, "\""), nlen = len;
	f(t, &nlen);
	memmove(t + nlen, t + len, strlen(t + len) + 1);
}

static void url_unpadded(char *t, size_t *len)
{
	size_t n = 0;
	for (size_t i = 0; i < *len; i++)
		if (t[i] != '=')
			t[n++] = t[i] == '+' ? '-' : t[i] == '/' ? '_' : t[i];
	*len = n;
}

static void space_at_8(char *t, size_t *len)
{
	t[8] = ' ';
	(void)len;
}

static void bang_at_5(char *t, size_t *len)
{
	t[5] = '!';
	(void)len;
}

/* Bundles are read as protobuf JSON reads bytes (sigstore-go, cosign v3):
 * the URL-safe alphabet and missing padding are accepted, white space is not. */
static void test_bundle_base64_forms(void **state)
{
	(void)state;
	size_t len;
	char why[256] = "";
	struct sig_keyset *ks = keyset_of("p256.pub");
	char *b = openssl_bundle("p256.pem", "-sha256", DIG + 7,
	                         "https://sigstore.dev/cosign/sign/v1", &len);
	rewrite_field(b, "payload", url_unpadded);
	rewrite_field(b, "sig", url_unpadded);
	int rc = sig_verify_bundle(ks, DIG, b, strlen(b), NULL, why, sizeof(why));
	if (rc != 0)
		fail_msg("URL-safe, unpadded: %d %s", rc, why);
	rewrite_field(b, "sig", space_at_8);
	assert_int_equal(sig_verify_bundle(ks, DIG, b, strlen(b), NULL, why, sizeof(why)),
	                 -EBADMSG);
	assert_string_equal(
	    why, "DSSE signature is not valid base64 (illegal base64 data at input byte 8)");
	rewrite_field(b, "payload", bang_at_5);
	assert_int_equal(sig_verify_bundle(ks, DIG, b, strlen(b), NULL, why, sizeof(why)),
	                 -EBADMSG);
	assert_string_equal(
	    why, "DSSE payload is not valid base64 (illegal base64 data at input byte 5)");
	free(b);
	sig_keyset_free(ks);
}

static void test_sign_and_openssl_verifies(void **state)
{
	(void)state;
	char *priv, *pub, why[256] = "";
	assert_int_equal(sig_keygen_p256(NULL, &priv, &pub), 0);
	assert_non_null(strstr(priv, "-----BEGIN PRIVATE KEY-----"));
	assert_non_null(strstr(pub, "-----BEGIN PUBLIC KEY-----"));
	spit("gen.pub", pub, strlen(pub));
	struct sig_key *k;
	assert_int_equal(sig_key_load_private(priv, strlen(priv), NULL, &k, why, sizeof(why)), 0);
	assert_true(sig_key_is_private(k));
	assert_string_equal(sig_key_alg_name(k), "ecdsa-p256");
	char *payload, *sig;
	size_t plen;
	assert_int_equal(sig_sign_simple(k, "registry.test:5000/c\"q", DIG, &payload, &plen, &sig),
	                 0);
	assert_non_null(strstr(payload, "\"docker-manifest-digest\":\"" DIG "\""));
	assert_non_null(strstr(payload, "c\\\"q")); /* escaped, not injected */
	/* independent consumer: openssl checks our signature */
	spit("payload.json", payload, plen);
	spit("sig.b64", sig, strlen(sig));
	sh("base64 -d sig.b64 > sig.bin && openssl dgst -sha256 -verify gen.pub -signature sig.bin "
	   "payload.json");
	/* and we do too, through the key set */
	struct sig_keyset *ks = keyset_of("gen.pub");
	char fp[SIGNATURE_FP_MAX];
	assert_int_equal(sig_verify_simple(ks, DIG, payload, plen, sig, fp, why, sizeof(why)), 0);
	assert_string_equal(fp, sig_key_fingerprint(k));
	char *bundle;
	size_t blen;
	assert_int_equal(sig_sign_bundle(k, "registry.test:5000/c", DIG, &bundle, &blen), 0);
	assert_int_equal(sig_verify_bundle(ks, DIG, bundle, blen, fp, why, sizeof(why)), 0);
	assert_int_equal(sig_verify_bundle(ks, OTHER, bundle, blen, fp, why, sizeof(why)),
	                 -EBADMSG);
	/* a public key cannot sign */
	struct sig_key *pk;
	assert_int_equal(sig_key_load_public(pub, strlen(pub), &pk, why, sizeof(why)), 0);
	char *p2, *s2;
	size_t l2;
	assert_int_equal(sig_sign_simple(pk, "r", DIG, &p2, &l2, &s2), -EINVAL);
	sig_key_free(pk);
	free(bundle);
	free(payload);
	free(sig);
	sig_keyset_free(ks);
	sig_key_free(k);
	free(priv);
	free(pub);
}

static void test_sign_other_algorithms(void **state)
{
	(void)state;
	const char *keys[][2] = {
	    {"rsa.pem", "rsa.pub"}, {"ed.pem", "ed.pub"}, {"p384.pem", "p384.pub"}};
	for (size_t i = 0; i < 3; i++) {
		char p[512], why[256] = "";
		struct sig_key *k;
		snprintf(p, sizeof(p), "%s/%s", dir, keys[i][0]);
		assert_int_equal(sig_key_load_private_file(p, NULL, &k, why, sizeof(why)), 0);
		char *payload, *sig, *bundle;
		size_t plen, blen;
		assert_int_equal(sig_sign_simple(k, "r", DIG, &payload, &plen, &sig), 0);
		assert_int_equal(sig_sign_bundle(k, "r", DIG, &bundle, &blen), 0);
		struct sig_keyset *ks = keyset_of(keys[i][1]);
		assert_int_equal(
		    sig_verify_simple(ks, DIG, payload, plen, sig, NULL, why, sizeof(why)), 0);
		assert_int_equal(sig_verify_bundle(ks, DIG, bundle, blen, NULL, why, sizeof(why)),
		                 0);
		sig_keyset_free(ks);
		free(payload);
		free(sig);
		free(bundle);
		sig_key_free(k);
	}
}

static void test_passphrase_keys(void **state)
{
	(void)state;
	char *priv, *pub, why[256] = "";
	assert_int_equal(sig_keygen_p256("s3cret", &priv, &pub), 0);
	assert_non_null(strstr(priv, "ENCRYPTED PRIVATE KEY"));
	struct sig_key *k;
	assert_int_equal(sig_key_load_private(priv, strlen(priv), "wrong", &k, why, sizeof(why)),
	                 -EINVAL);
	assert_int_equal(sig_key_load_private(priv, strlen(priv), NULL, &k, why, sizeof(why)),
	                 -EINVAL);
	assert_int_equal(sig_key_load_private(priv, strlen(priv), "s3cret", &k, why, sizeof(why)),
	                 0);
	sig_key_free(k);
	/* openssl reads it with the passphrase too */
	spit("enc.pem", priv, strlen(priv));
	sh("openssl pkey -in enc.pem -passin pass:s3cret -noout");
	free(priv);
	free(pub);
}

static void test_key_refusals(void **state)
{
	(void)state;
	char p[512], why[256] = "";
	struct sig_key *k;
	snprintf(p, sizeof(p), "%s/rsa1024.pub", dir);
	assert_int_equal(sig_key_load_public_file(p, &k, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "RSA key of 1024 bits is too small (at least 2048)");
	snprintf(p, sizeof(p), "%s/k1.pub", dir);
	assert_int_equal(sig_key_load_public_file(p, &k, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "unsupported EC curve"));
	assert_int_equal(sig_key_load_public("garbage", 7, &k, why, sizeof(why)), -EINVAL);
	const char *cosign = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END "
	                     "ENCRYPTED SIGSTORE PRIVATE KEY-----\n";
	assert_int_equal(sig_key_load_private(cosign, strlen(cosign), "x", &k, why, sizeof(why)),
	                 -EINVAL);
	assert_non_null(strstr(why, "cosign-encrypted"));
	size_t n;
	char *pubpem = slurp("p256.pub", &n);
	assert_int_equal(sig_key_load_private(pubpem, n, NULL, &k, why, sizeof(why)), -EINVAL);
	free(pubpem);
	snprintf(p, sizeof(p), "%s/no-such-key.pub", dir);
	assert_int_equal(sig_key_load_public_file(p, &k, why, sizeof(why)), -ENOENT);
}

static void test_keyset_fingerprint(void **state)
{
	(void)state;
	size_t n1, n2;
	char *a = slurp("p256.pub", &n1), *b = slurp("ed.pub", &n2);
	char both[8192], why[256] = "";
	snprintf(both, sizeof(both), "%s%s", a, b);
	struct sig_keyset *s1, *s2;
	assert_int_equal(sig_keyset_new(&s1), 0);
	assert_int_equal(sig_keyset_new(&s2), 0);
	assert_int_equal(sig_keyset_add_pem(s1, both, strlen(both), why, sizeof(why)), 0);
	assert_int_equal(sig_keyset_count(s1), 2);
	assert_int_equal(sig_keyset_add_pem(s2, b, n2, why, sizeof(why)), 0);
	const char *fp_one = sig_keyset_fingerprint(s2);
	char saved[SIGNATURE_FP_MAX];
	snprintf(saved, sizeof(saved), "%s", fp_one);
	assert_int_equal(sig_keyset_add_pem(s2, a, n1, why, sizeof(why)), 0);
	assert_string_not_equal(saved, sig_keyset_fingerprint(s2)); /* changed with the set */
	assert_string_equal(sig_keyset_fingerprint(s1),
	                    sig_keyset_fingerprint(s2)); /* order-free */
	/* adding a key again changes nothing */
	assert_int_equal(sig_keyset_add_pem(s2, a, n1, why, sizeof(why)), 0);
	assert_int_equal(sig_keyset_count(s2), 2);
	/* one bad block rejects the whole value, set unchanged */
	char bad[8192];
	snprintf(bad, sizeof(bad), "%s-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
	         a);
	assert_int_equal(sig_keyset_add_pem(s1, bad, strlen(bad), why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "key 2"));
	assert_int_equal(sig_keyset_count(s1), 2);
	sig_keyset_free(s1);
	sig_keyset_free(s2);
	free(a);
	free(b);
}

static void test_verify_any(void **state)
{
	(void)state;
	char good[512], wrongdig[512];
	payload_for(DIG, good, sizeof(good));
	payload_for(OTHER, wrongdig, sizeof(wrongdig));
	spit("payload.json", wrongdig, strlen(wrongdig));
	char *sig_wrong = openssl_sign("p256.pem", "-sha256");
	spit("payload.json", good, strlen(good));
	char *sig_other_key = openssl_sign("other.pem", "-sha256");
	char *sig_good = openssl_sign("p256.pem", "-sha256");
	struct sig_keyset *ks = keyset_of("p256.pub");
	struct sig_candidate c[3] = {
	    {SIG_KIND_SIMPLE, wrongdig, strlen(wrongdig), sig_wrong, "sha256-x.sig layer 0", 0, 0,
	     0},
	    {SIG_KIND_SIMPLE, good, strlen(good), sig_other_key, "sha256-x.sig layer 1", 0, 0, 0},
	    {SIG_KIND_SIMPLE, good, strlen(good), sig_good, "sha256-x.sig layer 2", 0, 0, 0},
	};
	struct sig_verdict v;
	assert_int_equal(sig_verify(ks, DIG, c, 3, &v), 0);
	assert_true(v.accepted);
	assert_non_null(strstr(v.reason, "layer 2"));
	assert_int_equal(sig_verify(ks, DIG, c, 2, &v), -EKEYREJECTED);
	assert_false(v.accepted);
	assert_non_null(
	    strstr(v.reason, "signature 1 sha256-x.sig layer 0: payload is for image " OTHER));
	assert_non_null(
	    strstr(v.reason, "signature 2 sha256-x.sig layer 1: no trusted key verifies"));
	assert_int_equal(sig_verify(ks, "sha256:short", c, 3, &v), -EKEYREJECTED);
	assert_non_null(strstr(v.reason, "invalid image digest"));
	assert_int_equal(sig_verify(ks, DIG, c, 0, &v), -ENODATA);
	assert_non_null(strstr(v.reason, "not signed"));
	struct sig_keyset *empty;
	assert_int_equal(sig_keyset_new(&empty), 0);
	assert_int_equal(sig_verify(empty, DIG, c, 3, &v), -ENOKEY);
	sig_keyset_free(empty);
	sig_keyset_free(ks);
	free(sig_wrong);
	free(sig_other_key);
	free(sig_good);
}

static void test_cache(void **state)
{
	(void)state;
	struct sig_cache *c;
	assert_int_equal(sig_cache_new(2, 3600, 0, &c), 0);
	struct sig_verdict ok = {.accepted = true, .kind = SIG_KIND_SIMPLE},
	                   no = {.accepted = false}, got;
	snprintf(ok.reason, sizeof(ok.reason), "fine");
	assert_int_equal(sig_cache_get(c, DIG, "sha256:ks1", &got), -ENOENT);
	sig_cache_put(c, DIG, "sha256:ks1", &ok);
	assert_int_equal(sig_cache_get(c, DIG, "sha256:ks1", &got), 0);
	assert_true(got.accepted);
	assert_string_equal(got.reason, "fine");
	/* another key set is another question */
	assert_int_equal(sig_cache_get(c, DIG, "sha256:ks2", &got), -ENOENT);
	/* rejections with ttl 0 are not remembered */
	sig_cache_put(c, OTHER, "sha256:ks1", &no);
	assert_int_equal(sig_cache_get(c, OTHER, "sha256:ks1", &got), -ENOENT);
	/* capacity 2: the oldest goes */
	sig_cache_put(c, DIG, "sha256:ks2", &ok);
	sig_cache_put(c, DIG, "sha256:ks3", &ok);
	assert_int_equal(sig_cache_get(c, DIG, "sha256:ks3", &got), 0);
	int hits = (sig_cache_get(c, DIG, "sha256:ks1", &got) == 0) +
	           (sig_cache_get(c, DIG, "sha256:ks2", &got) == 0);
	assert_int_equal(hits, 1);
	sig_cache_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_ecdsa_p256),
	    cmocka_unit_test(test_ecdsa_p384_sha256),
	    cmocka_unit_test(test_ecdsa_p384_sha384),
	    cmocka_unit_test(test_rsa_spki),
	    cmocka_unit_test(test_rsa_pkcs1_public_key),
	    cmocka_unit_test(test_ed25519),
	    cmocka_unit_test(test_wrong_key),
	    cmocka_unit_test(test_payload_for_another_digest),
	    cmocka_unit_test(test_tampered_payload),
	    cmocka_unit_test(test_bad_base64),
	    cmocka_unit_test(test_wrapped_signature),
	    cmocka_unit_test(test_wrong_type),
	    cmocka_unit_test(test_dsse_pae_vector),
	    cmocka_unit_test(test_bundle_made_by_openssl),
	    cmocka_unit_test(test_bundle_refusals),
	    cmocka_unit_test(test_bundle_base64_forms),
	    cmocka_unit_test(test_sign_and_openssl_verifies),
	    cmocka_unit_test(test_sign_other_algorithms),
	    cmocka_unit_test(test_passphrase_keys),
	    cmocka_unit_test(test_key_refusals),
	    cmocka_unit_test(test_keyset_fingerprint),
	    cmocka_unit_test(test_verify_any),
	    cmocka_unit_test(test_cache),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
