/* Keyless trust from command line flags (see cli_keyless.h). */
#include "cli_keyless.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fsutil.h"
#include "keyless.h"
#include "trust_keyless.h"
#include "watched.h"

#define MAX_FILE (4u << 20)

static const char *flag_name(int opt)
{
	static const char *const names[] = {"--trusted-root",
	                                    "--fulcio-ca",
	                                    "--rekor-key",
	                                    "--ctlog-key",
	                                    "--certificate-identity",
	                                    "--certificate-identity-regexp",
	                                    "--certificate-oidc-issuer",
	                                    "--certificate-oidc-issuer-regexp",
	                                    "--identities",
	                                    "--trust-dir"};
	unsigned i = (unsigned)(opt - CLI_OPT_TRUSTED_ROOT);
	return i < sizeof(names) / sizeof(names[0]) ? names[i] : "?";
}

int cli_keyless_flag(struct cli_keyless_flags *k, int opt, const char *arg, const char *cmd)
{
	if (opt < CLI_OPT_TRUSTED_ROOT || opt > CLI_OPT_TRUST_DIR)
		return 0;
	if (k->n >= CLI_KEYLESS_MAX) {
		cli_usage_error(cmd, "at most %d keyless trust flags", CLI_KEYLESS_MAX);
		return -1;
	}
	k->opt[k->n] = opt;
	k->arg[k->n++] = arg;
	return 1;
}

/* One file flag into kl. */
static int add_file(struct sig_keyless *kl, int opt, const char *path, char *why, size_t whylen)
{
	char *text = NULL;
	size_t len = 0;
	int rc = fsutil_read_file(path, MAX_FILE, &text, &len);
	if (rc) {
		snprintf(why, whylen, "%s", rc == -EFBIG ? "larger than 4 MiB" : strerror(-rc));
		return rc;
	}
	switch (opt) {
	case CLI_OPT_TRUSTED_ROOT:
		rc = sig_keyless_add_trusted_root(kl, text, len, why, whylen);
		break;
	case CLI_OPT_FULCIO_CA:
		rc = sig_keyless_add_ca_pem(kl, text, len, why, whylen);
		break;
	case CLI_OPT_REKOR_KEY:
	case CLI_OPT_CTLOG_KEY:
		rc = sig_keyless_add_log_pem(kl, text, len, opt == CLI_OPT_CTLOG_KEY, why, whylen);
		break;
	default:
		rc = sig_keyless_add_rules_text(kl, text, len, why, whylen);
	}
	free(text);
	return rc;
}

/* --trust-dir: every key, and the keyless trust, as a daemon reads them. */
static int trust_dir(const char *dir, struct sig_keyset *ks, const char *cmd)
{
	struct watched_files w = {0};
	char err[600] = "", why[256] = "";
	int rc = watched_read(dir, &w, err, sizeof(err));
	for (size_t i = 0; rc == 0 && i < w.n; i++) {
		if (trust_keyless_file(w.f[i].name))
			continue;
		if ((rc = sig_keyset_add_pem(ks, w.f[i].data, w.f[i].len, why, sizeof(why))))
			snprintf(err, sizeof(err), "%s/%s: %s", dir, w.f[i].name, why);
	}
	if (rc == 0)
		rc = trust_keyless_load(dir, &w, ks, err, sizeof(err));
	if (rc)
		fprintf(stderr, "%s: --trust-dir: %s\n", cmd, err);
	watched_files_clear(&w);
	return rc;
}

/* The one rule the --certificate-* flags make (none when none is given). */
static int flag_rule(const struct cli_keyless_flags *k, struct sig_keyless *kl, char *why,
                     size_t whylen)
{
	struct keyless_rule_spec r = {.name = "command line"};
	bool any = false;
	for (unsigned i = 0; i < k->n; i++) {
		const char **dst = k->opt[i] == CLI_OPT_CERT_IDENTITY      ? &r.subject
		                   : k->opt[i] == CLI_OPT_CERT_IDENTITY_RE ? &r.subject_regexp
		                   : k->opt[i] == CLI_OPT_CERT_ISSUER      ? &r.issuer
		                   : k->opt[i] == CLI_OPT_CERT_ISSUER_RE   ? &r.issuer_regexp
		                                                           : NULL;
		if (dst) {
			*dst = k->arg[i];
			any = true;
		}
	}
	if (!any)
		return 0;
	if (!r.subject && !r.subject_regexp) {
		snprintf(why, whylen,
		         "--certificate-identity or --certificate-identity-regexp "
		         "is required with an issuer");
		return -EINVAL;
	}
	if (!r.issuer && !r.issuer_regexp) {
		snprintf(why, whylen,
		         "--certificate-oidc-issuer or "
		         "--certificate-oidc-issuer-regexp is required with an identity");
		return -EINVAL;
	}
	return sig_keyless_add_rule(kl, &r, why, whylen);
}

static int build(const struct cli_keyless_flags *k, struct sig_keyless *kl, const char *cmd)
{
	char why[600] = "";
	int rc = 0;
	for (unsigned i = 0; i < k->n && rc == 0; i++) {
		int opt = k->opt[i];
		if (opt == CLI_OPT_TRUST_DIR ||
		    (opt >= CLI_OPT_CERT_IDENTITY && opt <= CLI_OPT_CERT_ISSUER_RE))
			continue;
		if ((rc = add_file(kl, opt, k->arg[i], why, sizeof(why))))
			fprintf(stderr, "%s: %s %s: %s\n", cmd, flag_name(opt), k->arg[i], why);
	}
	if (rc == 0 && (rc = flag_rule(k, kl, why, sizeof(why))))
		fprintf(stderr, "%s: %s\n", cmd, why);
	if (rc == 0 && (rc = sig_keyless_complete(kl, why, sizeof(why))))
		fprintf(stderr,
		        "%s: %s (keyless verification wants --trusted-root, or --fulcio-ca and "
		        "--rekor-key, and --certificate-identity with --certificate-oidc-issuer, "
		        "or --identities)\n",
		        cmd, why);
	return rc;
}

int cli_keyless_attach(const struct cli_keyless_flags *k, struct sig_keyset **ks, const char *cmd)
{
	struct sig_keyless *kl = NULL;
	unsigned dirs = 0;
	int rc;
	if (k->n == 0)
		return 0;
	for (unsigned i = 0; i < k->n; i++)
		dirs += k->opt[i] == CLI_OPT_TRUST_DIR;
	if (dirs && (dirs > 1 || k->n > 1)) {
		cli_usage_error(cmd, "--trust-dir takes no other keyless flag (it holds them all)");
		return -EINVAL;
	}
	bool made = *ks == NULL;
	if (made && (rc = sig_keyset_new(ks)))
		return rc;
	if (dirs)
		rc = trust_dir(k->arg[0], *ks, cmd);
	else if ((rc = sig_keyless_new(&kl)) == 0 && (rc = build(k, kl, cmd)) == 0)
		sig_keyset_set_keyless(*ks, kl);
	else
		sig_keyless_free(kl);
	if (rc && made) {
		sig_keyset_free(*ks);
		*ks = NULL;
	}
	return rc;
}
