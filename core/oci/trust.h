/* What a daemon trusts (the webhook, the agent, the operator): the public
 * keys found in --trust-dir (a mounted Secret or ConfigMap, every PEM public
 * key of every file; the files trust_keyless.h names hold keyless trust
 * instead) and in --key files, and the switches verify-enabled and
 * allow-unsigned-images (flags, overridden by the keys a --config file or
 * directory sets). Each daemon polls its sources (trust_poll) and swaps in a
 * new snapshot when they change; a source that does not load keeps the last
 * good snapshot.
 *
 * A snapshot is immutable and reference-counted: a review and its registry
 * job keep the snapshot they started with while a reload builds the next
 * one, which replaces it whole or not at all. */
#ifndef GKM_TRUST_H
#define GKM_TRUST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "signature.h"

struct trust_settings {
	bool verify_enabled;
	bool allow_unsigned;
};

struct trust_source {
	const char *trust_dir;        /* NULL: no keys from a directory */
	const char *const *key_files; /* more PEM key files (--key), may be NULL */
	unsigned nkey_files;
	const char *config_path; /* NULL: the flags alone */
	struct trust_settings defaults;
};

struct trust {
	atomic_int refs;
	struct trust_settings s;
	struct sig_keyset *keys; /* never NULL, may be empty */
	size_t nkeys;
	/* sig_keyset_fingerprint(), or "none": verdicts are cached under it */
	char keys_fp[SIGNATURE_FP_MAX];
	char digest[65]; /* of the sources' contents, to notice changes */
};

/* Build a snapshot. 0, or -errno with err naming the file and what is wrong
 * with it ("keys/team.pub: key 1: unsupported curve", "config.yaml:
 * verify-enabled: want true or false, got 'maybe'"). Caller releases with
 * trust_unref(). */
__attribute__((warn_unused_result)) int trust_load(const struct trust_source *src,
                                                   struct trust **out, char *err, size_t errlen);

/* The digest trust_load() would record, without building anything. */
__attribute__((warn_unused_result)) int trust_source_digest(const struct trust_source *src,
                                                            char out[65], char *err, size_t errlen);

/* Look at the sources again. *seen is the digest last looked at (start it
 * with cur->digest). 1 with *out a new snapshot (the caller's reference)
 * when they changed and load; 0 when nothing changed; -errno when they do
 * not read or load (logged once per change; cur stays). */
__attribute__((warn_unused_result)) int trust_poll(const struct trust_source *src,
                                                   const struct trust *cur, char seen[65],
                                                   struct trust **out);

struct trust *trust_ref(struct trust *t);
void trust_unref(struct trust *t);

/* Parse a boolean setting: true/false, yes/no, on/off, 1/0 (any case,
 * surrounding blanks ignored). 0 or -EINVAL. */
__attribute__((warn_unused_result)) int trust_parse_bool(const char *s, bool *out);

#endif
