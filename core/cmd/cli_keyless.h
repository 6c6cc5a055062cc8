/* Keyless trust on the command line, as cosign takes it: a trusted root
 * (--trusted-root, sigstore's trusted_root.json; or PEM: --fulcio-ca,
 * --rekor-key, --ctlog-key) and an identity (--certificate-identity(-regexp)
 * with --certificate-oidc-issuer(-regexp), one rule; --identities FILE for
 * several); or --trust-dir DIR, a daemon's trust directory (keys and
 * keyless trust, trust_keyless.h). Commands that verify add
 * CLI_KEYLESS_OPTIONS beside CLI_KEY_OPTION; cli_registry_flag() collects
 * the flags and cli_registry_keyset() builds the trust from them. */
#ifndef GKM_CLI_KEYLESS_H
#define GKM_CLI_KEYLESS_H

#include <getopt.h>

#include "signature.h"

enum {
	CLI_OPT_TRUSTED_ROOT = 0x1200,
	CLI_OPT_FULCIO_CA,
	CLI_OPT_REKOR_KEY,
	CLI_OPT_CTLOG_KEY,
	CLI_OPT_CERT_IDENTITY,
	CLI_OPT_CERT_IDENTITY_RE,
	CLI_OPT_CERT_ISSUER,
	CLI_OPT_CERT_ISSUER_RE,
	CLI_OPT_IDENTITIES,
	CLI_OPT_TRUST_DIR,
};

#define CLI_KEYLESS_MAX 32

#define CLI_KEYLESS_OPTIONS                                                                        \
	{"trusted-root", required_argument, 0, CLI_OPT_TRUSTED_ROOT},                              \
	    {"fulcio-ca", required_argument, 0, CLI_OPT_FULCIO_CA},                                \
	    {"rekor-key", required_argument, 0, CLI_OPT_REKOR_KEY},                                \
	    {"ctlog-key", required_argument, 0, CLI_OPT_CTLOG_KEY},                                \
	    {"certificate-identity", required_argument, 0, CLI_OPT_CERT_IDENTITY},                 \
	    {"certificate-identity-regexp", required_argument, 0, CLI_OPT_CERT_IDENTITY_RE},       \
	    {"certificate-oidc-issuer", required_argument, 0, CLI_OPT_CERT_ISSUER},                \
	    {"certificate-oidc-issuer-regexp", required_argument, 0, CLI_OPT_CERT_ISSUER_RE},      \
	    {"identities", required_argument, 0, CLI_OPT_IDENTITIES},                              \
	{                                                                                          \
		"trust-dir", required_argument, 0, CLI_OPT_TRUST_DIR                               \
	}

#define CLI_KEYLESS_HELP                                                                           \
	"Keyless signatures (Fulcio certificates, Rekor entries), verified offline:\n"             \
	"  --trusted-root FILE  sigstore trusted_root.json (Fulcio CAs, Rekor and CT logs)\n"      \
	"  --fulcio-ca FILE, --rekor-key FILE, --ctlog-key FILE  the same as PEM\n"                \
	"  --certificate-identity S | --certificate-identity-regexp RE\n"                          \
	"                       the signer's SAN (email or URI), as cosign takes it\n"             \
	"  --certificate-oidc-issuer S | --certificate-oidc-issuer-regexp RE\n"                    \
	"                       the OIDC issuer that vouched for it\n"                             \
	"  --identities FILE    several identity rules (a YAML list of issuer or\n"                \
	"                       issuerRegExp and subject or subjectRegExp)\n"                      \
	"  --trust-dir DIR      keys and keyless trust as a daemon reads them (its\n"              \
	"                       mounted trust ConfigMap)\n"

/* The keyless flags of one command line, as given (borrowed from argv). */
struct cli_keyless_flags {
	int opt[CLI_KEYLESS_MAX];
	const char *arg[CLI_KEYLESS_MAX];
	unsigned n;
};

/* 1 if opt was a keyless flag (kept), 0 if not, -1 on too many. */
int cli_keyless_flag(struct cli_keyless_flags *k, int opt, const char *arg, const char *cmd);

/* Build keyless trust from the flags (and --trust-dir's keys) into *ks,
 * making the set when it is NULL. 0 (nothing when no keyless flag was
 * given), or -errno with a message naming the flag printed. */
__attribute__((warn_unused_result)) int cli_keyless_attach(const struct cli_keyless_flags *k,
                                                           struct sig_keyset **ks, const char *cmd);

#endif
