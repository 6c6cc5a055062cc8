/* Transparency log (Rekor) entries of keyless signatures: reading them from
 * cosign's bundle annotation or a sigstore bundle, the signed entry
 * timestamp, the inclusion proof and its checkpoint, and whether the entry
 * is this signature (see keyless.h).
 *
 * Formats followed:
 *  - SET: the log's signature over the canonical JSON (keys sorted, no
 *    blanks) of {"body": base64 of the canonicalized body, "integratedTime":
 *    seconds, "logID": hex of the log id, "logIndex": n};
 *  - the log id: sha256 of the log key's DER SubjectPublicKeyInfo;
 *  - inclusion proofs: RFC 6962 (leaf hash sha256(0x00 || body), node hash
 *    sha256(0x01 || left || right)), the path split into inner and border
 *    parts at the point where the paths to the leaf and to the last leaf
 *    part;
 *  - checkpoints: a signed note, "<origin>\n<size>\n<base64 root hash>\n
 *    [other lines]\n" then a blank line and lines "— <name> <base64 of
 *    (4-byte key hint || signature)>\n", the hint being the first 4 bytes of
 *    the log id, the signature over the note's text;
 *  - bodies: hashedrekord 0.0.1 {spec: {data: {hash: {algorithm, value}},
 *    signature: {content, publicKey: {content: base64 of a PEM}}}} and dsse
 *    0.0.1 {spec: {payloadHash: {algorithm, value}, signatures: [{signature,
 *    verifier: base64 of a PEM}]}}. */
#include "keyless_impl.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "errbuf.h"
#include "textfmt.h"

#define MAX_PROOF 64
#define MAX_CHECKPOINT 8192
#define MAX_BODY (512u * 1024)

void kl_entry_clear(struct kl_entry *e)
{
	free(e->body);
	free(e->set);
	free(e->hashes);
	free(e->checkpoint);
	memset(e, 0, sizeof(*e));
}

static int hex_in(const char *s, unsigned char *out, size_t n)
{
	if (!s || strlen(s) != 2 * n)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		unsigned v = 0;
		for (int k = 0; k < 2; k++) {
			char c = s[2 * i + (size_t)k];
			unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
			             : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
			             : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
			                                    : 16;
			if (d > 15)
				return -EINVAL;
			v = v * 16 + d;
		}
		out[i] = (unsigned char)v;
	}
	return 0;
}

/* A base64 field of exactly n bytes into out. */
static int b64_fixed(const char *text, unsigned char *out, size_t n)
{
	unsigned char *b = NULL;
	size_t len = 0;
	int rc = kl_b64(text, &b, &len);
	if (rc == 0 && len != n)
		rc = -EBADMSG;
	if (rc == 0)
		memcpy(out, b, n);
	free(b);
	return rc;
}

static int bad(char *why, size_t whylen, const char *what)
{
	errbuf_set(why, whylen, "malformed log entry: %s", what);
	return -EBADMSG;
}

int kl_entry_from_annotation(const char *json, struct kl_entry *e, char *why, size_t whylen)
{
	cJSON *j = cJSON_Parse(json);
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "Payload");
	int rc = 0;
	memset(e, 0, sizeof(*e));
	if (!cJSON_IsObject(p))
		rc = bad(why, whylen, "the bundle annotation has no Payload");
	else if (kl_b64(kl_jstr(p, "body"), &e->body, &e->body_len) || e->body_len > MAX_BODY)
		rc = bad(why, whylen, "Payload.body is not base64");
	else if (kl_jint(p, "integratedTime", &e->integrated_time) ||
	         kl_jint(p, "logIndex", &e->log_index))
		rc = bad(why, whylen, "Payload.integratedTime or logIndex is not an integer");
	else if (hex_in(kl_jstr(p, "logID"), e->log_id, 32))
		rc = bad(why, whylen, "Payload.logID is not 64 hex digits");
	else if (kl_jstr(j, "SignedEntryTimestamp") &&
	         kl_b64(kl_jstr(j, "SignedEntryTimestamp"), &e->set, &e->set_len))
		rc = bad(why, whylen, "SignedEntryTimestamp is not base64");
	e->has_log_id = rc == 0;
	cJSON_Delete(j);
	if (rc)
		kl_entry_clear(e);
	return rc;
}

/* An int64 of a bundle: protobuf's JSON mapping leaves out a field that
 * is 0 (the first entry of a log, index 0, has no logIndex). */
static int pb_int(const cJSON *o, const char *key, int64_t *out)
{
	if (!cJSON_GetObjectItemCaseSensitive(o, key)) {
		*out = 0;
		return 0;
	}
	return kl_jint(o, key, out);
}

static int proof_from(const cJSON *pr, struct kl_entry *e, char *why, size_t whylen)
{
	const cJSON *hashes = cJSON_GetObjectItemCaseSensitive(pr, "hashes"), *h;
	const char *cp = kl_jstr(cJSON_GetObjectItemCaseSensitive(pr, "checkpoint"), "envelope");
	if (pb_int(pr, "logIndex", &e->proof_index) || pb_int(pr, "treeSize", &e->tree_size) ||
	    b64_fixed(kl_jstr(pr, "rootHash"), e->root_hash, 32))
		return bad(why, whylen, "inclusionProof: logIndex, treeSize or rootHash");
	if (!cp || strlen(cp) > MAX_CHECKPOINT || !(e->checkpoint = strdup(cp)))
		return bad(why, whylen, "inclusionProof has no checkpoint");
	int n = hashes ? cJSON_GetArraySize(hashes) : 0;
	if ((hashes && !cJSON_IsArray(hashes)) || n > MAX_PROOF)
		return bad(why, whylen, "inclusionProof.hashes");
	if (n && !(e->hashes = calloc((size_t)n, 32)))
		return -ENOMEM;
	cJSON_ArrayForEach(h, hashes)
	{
		if (!cJSON_IsString(h) || b64_fixed(h->valuestring, e->hashes[e->nhashes], 32))
			return bad(why, whylen, "inclusionProof.hashes: not 32-byte hashes");
		e->nhashes++;
	}
	e->has_proof = true;
	return 0;
}

int kl_entry_from_bundle(const cJSON *j, struct kl_entry *e, char *why, size_t whylen)
{
	const cJSON *kv = cJSON_GetObjectItemCaseSensitive(j, "kindVersion");
	const cJSON *promise = cJSON_GetObjectItemCaseSensitive(j, "inclusionPromise");
	const cJSON *proof = cJSON_GetObjectItemCaseSensitive(j, "inclusionProof");
	const char *kind = kl_jstr(kv, "kind"), *version = kl_jstr(kv, "version");
	int rc = 0;
	memset(e, 0, sizeof(*e));
	if (!kind || !version || strlen(kind) >= sizeof(e->kind) ||
	    strlen(version) >= sizeof(e->version))
		rc = bad(why, whylen, "kindVersion");
	else if (kl_b64(kl_jstr(j, "canonicalizedBody"), &e->body, &e->body_len) ||
	         e->body_len > MAX_BODY)
		rc = bad(why, whylen, "canonicalizedBody is not base64");
	else if (pb_int(j, "logIndex", &e->log_index))
		rc = bad(why, whylen, "logIndex");
	else if (b64_fixed(kl_jstr(cJSON_GetObjectItemCaseSensitive(j, "logId"), "keyId"),
	                   e->log_id, 32))
		rc = bad(why, whylen, "logId.keyId is not a 32-byte id");
	else if (pb_int(j, "integratedTime", &e->integrated_time))
		rc = bad(why, whylen, "integratedTime");
	if (rc == 0 && promise &&
	    kl_b64(kl_jstr(promise, "signedEntryTimestamp"), &e->set, &e->set_len))
		rc = bad(why, whylen, "inclusionPromise.signedEntryTimestamp is not base64");
	if (rc == 0 && proof)
		rc = proof_from(proof, e, why, whylen);
	if (rc == 0) {
		snprintf(e->kind, sizeof(e->kind), "%s", kind);
		snprintf(e->version, sizeof(e->version), "%s", version);
		e->has_log_id = true;
	} else {
		kl_entry_clear(e);
	}
	return rc;
}

/* ---- the log's signatures ---- */

static const struct kl_log *log_of(const struct sig_keyless *kl, const unsigned char id[32])
{
	for (size_t i = 0; i < kl->ntlogs; i++)
		if (memcmp(kl->tlogs[i].id, id, 32) == 0)
			return &kl->tlogs[i];
	return NULL;
}

static bool set_ok(const struct kl_log *log, const struct kl_entry *e)
{
	char *body = NULL, *msg = NULL, id[65];
	bool ok = false;
	hex_encode(e->log_id, 32, id);
	if (base64_encode(e->body, e->body_len, &body) == 0 &&
	    asprintf(&msg,
	             "{\"body\":\"%s\",\"integratedTime\":%lld,\"logID\":\"%s\",\"logIndex\":%lld}",
	             body, (long long)e->integrated_time, id, (long long)e->log_index) > 0)
		ok = kl_verify_sig(log->key, msg, strlen(msg), e->set, e->set_len);
	free(body);
	free(msg);
	return ok;
}

static void hash_node(const unsigned char *l, const unsigned char *r, unsigned char out[32])
{
	unsigned char buf[65];
	buf[0] = 1;
	memcpy(buf + 1, l, 32);
	memcpy(buf + 33, r, 32);
	kl_sha256(buf, sizeof(buf), out);
}

static bool merkle_ok(const struct kl_entry *e)
{
	uint64_t index = (uint64_t)e->proof_index, size = (uint64_t)e->tree_size;
	if (e->proof_index < 0 || e->tree_size <= 0 || index >= size)
		return false;
	size_t inner = 0, border = 0;
	for (uint64_t x = index ^ (size - 1); x; x >>= 1)
		inner++;
	for (uint64_t x = inner < 64 ? index >> inner : 0; x; x >>= 1)
		border += x & 1;
	if (e->nhashes != inner + border)
		return false;
	unsigned char h[32], *leaf = malloc(e->body_len + 1);
	if (!leaf)
		return false;
	leaf[0] = 0;
	memcpy(leaf + 1, e->body, e->body_len);
	kl_sha256(leaf, e->body_len + 1, h);
	free(leaf);
	for (size_t i = 0; i < e->nhashes; i++) {
		if (i < inner && !((index >> i) & 1))
			hash_node(h, e->hashes[i], h);
		else
			hash_node(e->hashes[i], h, h);
	}
	return memcmp(h, e->root_hash, 32) == 0;
}

/* The checkpoint is signed by a trusted log and commits to the proof's
 * tree size and root hash. */
static bool checkpoint_ok(const struct sig_keyless *kl, const struct kl_entry *e, char *why,
                          size_t whylen)
{
	const char *cp = e->checkpoint, *sep = strstr(cp, "\n\n");
	if (!sep) {
		errbuf_set(why, whylen, "the checkpoint has no signatures");
		return false;
	}
	size_t note_len = (size_t)(sep - cp) + 1;
	char size_text[32];
	unsigned char root[32];
	const char *l1 = strchr(cp, '\n'), *l2 = l1 ? strchr(l1 + 1, '\n') : NULL;
	const char *l3 = l2 ? strchr(l2 + 1, '\n') : NULL;
	char root_text[64];
	if (!l3 || l3 > sep || (size_t)(l2 - l1 - 1) >= sizeof(size_text) ||
	    (size_t)(l3 - l2 - 1) >= sizeof(root_text)) {
		errbuf_set(why, whylen, "the checkpoint's note is not origin, size, root hash");
		return false;
	}
	snprintf(size_text, sizeof(size_text), "%.*s", (int)(l2 - l1 - 1), l1 + 1);
	snprintf(root_text, sizeof(root_text), "%.*s", (int)(l3 - l2 - 1), l2 + 1);
	char want[32];
	snprintf(want, sizeof(want), "%lld", (long long)e->tree_size);
	if (strcmp(size_text, want) != 0 || b64_fixed(root_text, root, 32) ||
	    memcmp(root, e->root_hash, 32) != 0) {
		errbuf_set(
		    why, whylen,
		    "the checkpoint is for another tree (size %s) than the inclusion proof's",
		    size_text);
		return false;
	}
	/* signature lines: "\u2014 <name> <base64>\n" */
	for (const char *line = sep + 2; *line;) {
		const char *end = strchr(line, '\n');
		size_t n = end ? (size_t)(end - line) : strlen(line);
		const char *sp = n > 4 && memcmp(line, "\xe2\x80\x94 ", 4) == 0
		                     ? memchr(line + 4, ' ', n - 4)
		                     : NULL;
		if (sp) {
			char b64[1024];
			unsigned char *sig = NULL;
			size_t siglen = 0;
			snprintf(b64, sizeof(b64), "%.*s", (int)(line + n - sp - 1), sp + 1);
			if (kl_b64(b64, &sig, &siglen) == 0 && siglen > 4) {
				for (size_t i = 0; i < kl->ntlogs; i++) {
					const struct kl_log *l = &kl->tlogs[i];
					if (memcmp(l->id, sig, 4) == 0 &&
					    kl_verify_sig(l->key, cp, note_len, sig + 4,
					                  siglen - 4)) {
						free(sig);
						return true;
					}
				}
			}
			free(sig);
		}
		line += n + (end ? 1 : 0);
	}
	errbuf_set(why, whylen, "no signature of the checkpoint verifies with a trusted log key");
	return false;
}

int kl_entry_verify(const struct sig_keyless *kl, const struct kl_entry *e,
                    struct keyless_result *res, char *why, size_t whylen)
{
	char id[65], detail[256] = "";
	hex_encode(e->log_id, 32, id);
	const struct kl_log *log = log_of(kl, e->log_id);
	res->log_index = e->log_index;
	if (!log) {
		res->cause = KEYLESS_LOG_UNTRUSTED;
		errbuf_set(why, whylen,
		           "the log entry is from a log that is not trusted (log id %.16s...)", id);
		return -EKEYREJECTED;
	}
	if (e->has_proof) {
		bool ok = checkpoint_ok(kl, e, detail, sizeof(detail));
		if (ok && !merkle_ok(e)) {
			snprintf(
			    detail, sizeof(detail),
			    "the inclusion proof does not lead from the entry to the root hash");
			ok = false;
		}
		if (!ok) {
			res->cause = KEYLESS_LOG_UNTRUSTED;
			errbuf_set(why, whylen, "log entry %lld: %s", (long long)e->log_index,
			           detail);
			return -EKEYREJECTED;
		}
		res->inclusion_proof = true;
	}
	if (!e->set) {
		res->cause = KEYLESS_NO_LOG_ENTRY;
		errbuf_set(why, whylen,
		           "no log entry with a signed time: log entry %lld has no signed entry "
		           "timestamp, so when it was integrated is not proven",
		           (long long)e->log_index);
		return -EKEYREJECTED;
	}
	if (e->integrated_time < log->start || e->integrated_time > log->end || !set_ok(log, e)) {
		res->cause = KEYLESS_LOG_UNTRUSTED;
		errbuf_set(
		    why, whylen,
		    "the signed entry timestamp of log entry %lld does not verify with the "
		    "trusted log key (the entry, its time or its index was altered, or the key "
		    "was not valid then)",
		    (long long)e->log_index);
		return -EKEYREJECTED;
	}
	res->integrated_time = e->integrated_time;
	return 0;
}

/* ---- the entry's body ---- */

/* Whether a base64 PEM (certificate or public key) from a body is leaf. */
static bool same_signer(const char *b64, X509 *leaf)
{
	unsigned char *pem = NULL;
	size_t n = 0;
	bool same = false;
	if (kl_b64(b64, &pem, &n) || n > INT32_MAX) {
		free(pem);
		return false;
	}
	BIO *b = BIO_new_mem_buf(pem, (int)n);
	X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
	if (x) {
		same = X509_cmp(x, leaf) == 0;
	} else if (b && BIO_reset(b) == 1) {
		EVP_PKEY *k = PEM_read_bio_PUBKEY(b, NULL, NULL, NULL);
		same = k && EVP_PKEY_eq(k, X509_get0_pubkey(leaf)) == 1;
		EVP_PKEY_free(k);
	}
	X509_free(x);
	BIO_free(b);
	free(pem);
	ERR_clear_error();
	return same;
}

static bool same_bytes(const char *b64, const unsigned char *want, size_t n)
{
	unsigned char *got = NULL;
	size_t len = 0;
	bool same = kl_b64(b64, &got, &len) == 0 && len == n && memcmp(got, want, n) == 0;
	free(got);
	return same;
}

static int mismatch(char *why, size_t whylen, const char *what)
{
	errbuf_set(why, whylen, "the log entry is for %s", what);
	return -EKEYREJECTED;
}

int kl_entry_match(const struct kl_entry *e, const struct kl_signed *s, char *why, size_t whylen)
{
	cJSON *b = cJSON_ParseWithLength((const char *)e->body, e->body_len);
	const char *kind = kl_jstr(b, "kind"), *ver = kl_jstr(b, "apiVersion");
	const cJSON *spec = cJSON_GetObjectItemCaseSensitive(b, "spec");
	const char *want_kind = s->dsse ? "dsse" : "hashedrekord";
	const cJSON *hash, *sig = NULL;
	const char *signer = NULL;
	char hex[65];
	int rc = -EKEYREJECTED;
	hex_encode(s->payload_sha256, 32, hex);
	if (!kind || !ver || !cJSON_IsObject(spec)) {
		errbuf_set(why, whylen, "the log entry's body is not a Rekor entry");
		goto out;
	}
	if (e->kind[0] && (strcmp(e->kind, kind) || strcmp(e->version, ver))) {
		errbuf_set(why, whylen, "the log entry says %s %s, its body %s %s", e->kind,
		           e->version, kind, ver);
		goto out;
	}
	if (strcmp(kind, want_kind) || strcmp(ver, "0.0.1")) {
		errbuf_set(why, whylen, "the log entry is a %.32s %.16s, not a %s 0.0.1 entry",
		           kind, ver, want_kind);
		goto out;
	}
	if (s->dsse) {
		const cJSON *sigs = cJSON_GetObjectItemCaseSensitive(spec, "signatures");
		hash = cJSON_GetObjectItemCaseSensitive(spec, "payloadHash");
		if (cJSON_GetArraySize(sigs) == 1)
			sig = cJSON_GetArrayItem(sigs, 0);
		signer = kl_jstr(sig, "verifier");
	} else {
		hash = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(spec, "data"), "hash");
		sig = cJSON_GetObjectItemCaseSensitive(spec, "signature");
		signer = kl_jstr(cJSON_GetObjectItemCaseSensitive(sig, "publicKey"), "content");
	}
	const char *alg = kl_jstr(hash, "algorithm"), *value = kl_jstr(hash, "value");
	if (!alg || strcmp(alg, "sha256") || !value || strcmp(value, hex)) {
		errbuf_set(why, whylen,
		           "the log entry is for another payload (sha256 %.64s; this payload's is "
		           "%s)",
		           value ? value : "(none)", hex);
		goto out;
	}
	if (!same_bytes(kl_jstr(sig, s->dsse ? "signature" : "content"), s->sig, s->sig_len)) {
		rc = mismatch(why, whylen, "another signature");
		goto out;
	}
	if (!signer || !same_signer(signer, s->cert)) {
		rc = mismatch(why, whylen, "another certificate");
		goto out;
	}
	rc = 0;
out:
	cJSON_Delete(b);
	return rc;
}
