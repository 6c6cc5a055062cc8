/* gkm cache sign, verify and keygen: keys and signatures, and the
 * signature state inspect and extract report and check. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "cli.h"
#include "cmd.h"
#include "cmd_cache.h"
#include "fsutil.h"
#include "oci_sig.h"
#include "signature.h"

/* ---- keys and signatures --------------------------------------------- */

static int load_keyset(struct cli *c, struct sig_keyset **out)
{
	struct sig_keyset *ks = NULL;
	char why[256] = "";
	if (sig_keyset_new(&ks))
		return -ENOMEM;
	for (unsigned i = 0; i < c->r.nkeys; i++) {
		struct sig_key *k = NULL;
		int rc = sig_key_load_public_file(c->r.keys[i], &k, why, sizeof(why));
		if (rc == 0 && (rc = sig_keyset_add(ks, k)))
			sig_key_free(k);
		if (rc) {
			fprintf(stderr, "%s: key %s: %s\n", c->cmd, c->r.keys[i],
			        why[0] ? why : strerror(-rc));
			sig_keyset_free(ks);
			return rc;
		}
	}
	int rc = cli_keyless_attach(&c->r.keyless, &ks, c->cmd);
	if (rc) {
		sig_keyset_free(ks);
		return rc;
	}
	*out = ks;
	return 0;
}

static char *read_passphrase(struct cli *c)
{
	char *buf = NULL;
	size_t len = 0;
	if (c->passfile) {
		if (fsutil_read_file(c->passfile, 4096, &buf, &len))
			return NULL;
		while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
			buf[--len] = '\0';
		return buf;
	}
	const char *env = getenv("GKM_KEY_PASSPHRASE");
	return env ? strdup(env) : NULL;
}

void cmd_cache_sig_check(struct cli *c, struct oci_repo *repo, const char *digest,
                         struct cmd_cache_sigs *s)
{
	memset(s, 0, sizeof(*s));
	s->looked = true;
	s->rc = oci_sig_collect(repo, digest, &s->found, &s->err);
	if (s->rc || !cli_registry_verifies(&c->r))
		return;
	struct sig_keyset *ks = NULL;
	if ((s->verify_rc = load_keyset(c, &ks)))
		return;
	s->verified_tried = true;
	s->verify_rc = sig_verify(ks, digest, s->found.c, s->found.n, &s->verdict);
	sig_keyset_free(ks);
}

const char *cmd_cache_sig_summary(const struct cmd_cache_sigs *s, char *buf, size_t cap)
{
	if (!s->looked)
		snprintf(buf, cap, "not checked");
	else if (s->rc)
		snprintf(buf, cap, "unknown (%s)", oci_err_str(&s->err, s->rc));
	else if (s->found.n == 0)
		snprintf(buf, cap, "unsigned");
	else if (!s->verified_tried)
		snprintf(buf, cap,
		         "%zu found (%zu simple signing, %zu bundle), not verified (give --key, "
		         "or keyless trust)",
		         s->found.n, s->found.n_simple, s->found.n_bundle);
	else if (s->verify_rc == 0)
		snprintf(buf, cap, "verified: %s", s->verdict.reason);
	else
		snprintf(buf, cap, "NOT verified: %s", s->verdict.reason);
	return buf;
}

/* ---- sign / verify ------------------------------------------------------ */

static const char sign_usage[] =
    "Usage: gkm cache sign REF --key PRIVATE.pem [--bundle] [flags]\n\n"
    "Sign the image REF names (by digest) the way cosign does: a simple-signing\n"
    "layer on the sha256-<hex>.sig tag, or with --bundle a sigstore bundle (DSSE over\n"
    "an in-toto statement) stored as an OCI 1.1 referrer (plus the fallback\n"
    "sha256-<hex> index where the registry does not index referrers).\n\n"
    "  --key FILE              PEM private key (PKCS#8, EC or RSA)\n"
    "  --passphrase-file FILE  passphrase of an encrypted key (or $GKM_KEY_PASSPHRASE)\n"
    "  --bundle                write a bundle instead of a simple signature\n\n" REGISTRY_HELP;

static int sign_flag(struct cli *c, int opt, const char *arg)
{
	if (opt == OPT_PASSFILE)
		c->passfile = arg;
	else if (opt == OPT_BUNDLE)
		c->bundle = true;
	else
		return 0;
	return 1;
}

/* 1 when image already has a signature of kind that key verifies (signing
 * again would only add a different-looking copy: ECDSA is randomised),
 * 0 when not, -errno when the repository cannot be read. */
static int signed_by(struct oci_repo *repo, const struct oci_desc *image, const struct sig_key *key,
                     enum sig_kind kind, struct oci_err *e)
{
	struct oci_sig_found found;
	struct sig_keyset *ks = NULL;
	struct sig_verdict v;
	char *pem = NULL, why[128];
	int rc = oci_sig_collect(repo, image->digest, &found, e);
	if (rc)
		return rc;
	struct sig_candidate same[OCI_SIG_MAX_CANDIDATES]; /* borrowed from found */
	size_t n = 0;
	for (size_t i = 0; i < found.n; i++)
		if (found.c[i].kind == kind)
			same[n++] = found.c[i];
	int ret = 0;
	if (n && sig_key_public_pem(key, &pem) == 0 && sig_keyset_new(&ks) == 0 &&
	    sig_keyset_add_pem(ks, pem, strlen(pem), why, sizeof(why)) == 0)
		ret = sig_verify(ks, image->digest, same, n, &v) == 0;
	sig_keyset_free(ks);
	free(pem);
	oci_sig_found_clear(&found);
	return ret;
}

static const struct option sign_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"key", required_argument, 0, CLI_OPT_KEY},
    {"passphrase-file", required_argument, 0, OPT_PASSFILE},
    {"bundle", no_argument, 0, OPT_BUNDLE},
    {0, 0, 0, 0},
};

static int cache_sign_cmd(struct cli *c, int argc, char **argv)
{
	if (optind + 1 != argc || c->r.nkeys != 1)
		return cli_usage_error(c->cmd, "want one image reference and one --key");
	return cmd_cache_sign(c, argv[optind]);
}

int cmd_cache_sign(struct cli *c, const char *refstr)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct oci_desc desc = {0};
	struct sig_key *key = NULL;
	struct oci_err e = {{0}};
	char *pass = NULL, *payload = NULL, *sig = NULL, *name = NULL;
	size_t plen = 0;
	char why[256] = "";
	int rc = 0;
	pass = read_passphrase(c);
	int krc = sig_key_load_private_file(c->r.keys[0], pass, &key, why, sizeof(why));
	if (krc) {
		fprintf(stderr, "%s: key %s: %s\n", c->cmd, c->r.keys[0],
		        why[0] ? why : strerror(-krc));
		rc = EXIT_FAIL;
		goto out;
	}
	if ((rc = cmd_cache_open_resolved(c, refstr, &ref, &repo, &desc)))
		goto out;
	int orc = 0;
	name = oci_ref_name(&ref);
	if (!name) {
		rc = EXIT_FAIL;
		goto out;
	}
	int already =
	    signed_by(repo, &desc, key, c->bundle ? SIG_KIND_BUNDLE : SIG_KIND_SIMPLE, &e);
	if (already < 0) {
		rc = cmd_cache_fail(c->cmd, refstr, &e, already);
		goto out;
	}
	if (already) {
		printf("%s@%s already has a %s signature by key %s; nothing added\n", name,
		       desc.digest, c->bundle ? "bundle" : "simple-signing",
		       sig_key_fingerprint(key));
		rc = EXIT_OK;
		goto out;
	}
	if (c->bundle) {
		bool indexed = false;
		orc = sig_sign_bundle(key, name, desc.digest, &payload, &plen);
		if (orc == 0)
			orc = oci_sig_push_bundle(repo, &desc, payload, plen, &indexed, &e);
		if (orc) {
			rc = cmd_cache_fail(c->cmd, "signing", &e, orc);
			goto out;
		}
		printf("Signed %s@%s (sigstore bundle, key %s; %s)\n", name, desc.digest,
		       sig_key_fingerprint(key),
		       indexed ? "indexed by the registry's referrers API"
		               : "listed in the fallback tag index");
	} else {
		orc = sig_sign_simple(key, name, desc.digest, &payload, &plen, &sig);
		if (orc == 0)
			orc = oci_sig_push_simple(repo, desc.digest, payload, plen, sig, &e);
		if (orc) {
			rc = cmd_cache_fail(c->cmd, "signing", &e, orc);
			goto out;
		}
		char tag[160];
		oci_sig_tag(desc.digest, ".sig", tag, sizeof(tag));
		printf("Signed %s@%s (simple signing on tag %s, key %s)\n", name, desc.digest, tag,
		       sig_key_fingerprint(key));
	}
	rc = EXIT_OK;
out:
	if (pass) {
		explicit_bzero(pass, strlen(pass));
		free(pass);
	}
	free(payload);
	free(sig);
	free(name);
	sig_key_free(key);
	oci_desc_clear(&desc);
	oci_repo_free(repo);
	oci_ref_clear(&ref);
	return rc;
}

static const char verify_usage[] =
    "Usage: gkm cache verify REF --key PUBLIC.pem [--key ...] [-o json] [flags]\n"
    "       gkm cache verify REF --trusted-root FILE --certificate-identity ID\n"
    "                            --certificate-oidc-issuer URL [-o json] [flags]\n\n"
    "Accept the image when at least one of its signatures (simple signing or\n"
    "sigstore bundle) verifies with one of the keys, or was signed keyless by an\n"
    "identity a rule accepts (its Fulcio certificate chaining to the trusted root at\n"
    "the time its Rekor entry says); exit 1 with the reason otherwise.\n\n" CLI_KEYLESS_HELP
    "\n" REGISTRY_HELP;

static const struct option verify_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"key", required_argument, 0, CLI_OPT_KEY},
    CLI_KEYLESS_OPTIONS,
    {"output", required_argument, 0, 'o'},
    {0, 0, 0, 0},
};

static int cache_verify_cmd(struct cli *c, int argc, char **argv)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct oci_desc desc = {0};
	struct cmd_cache_sigs s = {0};
	int rc = 0;
	if (optind + 1 != argc || !cli_registry_verifies(&c->r)) {
		rc = cli_usage_error(c->cmd, "want one image reference and at least one --key, "
		                             "or keyless trust (--trusted-root and an identity)");
		goto out;
	}
	if ((rc = cmd_cache_open_resolved(c, argv[optind], &ref, &repo, &desc)))
		goto out;
	cmd_cache_sig_check(c, repo, desc.digest, &s);
	if (s.rc) {
		rc = cmd_cache_fail(c->cmd, argv[optind], &s.err, s.rc);
		goto out;
	}
	if (!s.verified_tried) {
		rc = EXIT_FAIL; /* the key set did not load; already reported */
		goto out;
	}
	if (strcmp(c->output, "json") == 0) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "reference", argv[optind]);
		cJSON_AddStringToObject(o, "digest", desc.digest);
		cJSON_AddBoolToObject(o, "verified", s.verify_rc == 0);
		cJSON_AddNumberToObject(o, "signatures", (double)s.found.n);
		cJSON_AddStringToObject(o, "kind",
		                        s.verify_rc                         ? ""
		                        : s.verdict.kind == SIG_KIND_BUNDLE ? "bundle"
		                                                            : "simple");
		cJSON_AddStringToObject(o, "key", s.verify_rc ? "" : s.verdict.key_fingerprint);
		if (s.verify_rc == 0 && s.verdict.rule[0]) {
			cJSON_AddStringToObject(o, "identity", s.verdict.identity);
			cJSON_AddStringToObject(o, "issuer", s.verdict.issuer);
			cJSON_AddStringToObject(o, "rule", s.verdict.rule);
			cJSON_AddNumberToObject(o, "integratedTime",
			                        (double)s.verdict.integrated_time);
		}
		cJSON_AddStringToObject(o, "reason", s.verdict.reason);
		cli_print_json(o);
	}
	if (s.verify_rc == 0) {
		if (strcmp(c->output, "json") != 0)
			printf("Verified %s@%s: %s\n", argv[optind], desc.digest, s.verdict.reason);
		rc = EXIT_OK;
	} else {
		fprintf(stderr, "%s: %s@%s is not verified: %s\n", c->cmd, argv[optind],
		        desc.digest,
		        s.verify_rc == -ENODATA ? "image is not signed" : s.verdict.reason);
		rc = EXIT_FAIL;
	}
out:
	oci_sig_found_clear(&s.found);
	oci_desc_clear(&desc);
	oci_repo_free(repo);
	oci_ref_clear(&ref);
	return rc;
}

/* ---- keygen --------------------------------------------------------------- */

static const char keygen_usage[] =
    "Usage: gkm cache keygen [--output-key-prefix PREFIX] [--passphrase-file FILE]\n\n"
    "Make an ECDSA P-256 key pair: PREFIX.key (PKCS#8, encrypted when a passphrase\n"
    "is given, mode 0600) and PREFIX.pub (SPKI). PREFIX defaults to \"cosign\".\n"
    "Existing files are never overwritten.\n\n";

static int keygen_flag(struct cli *c, int opt, const char *arg)
{
	if (opt == OPT_PREFIX)
		c->prefix = arg;
	else if (opt == OPT_PASSFILE)
		c->passfile = arg;
	else
		return 0;
	return 1;
}

static int write_new_file(const char *path, const char *data, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	int rc = fsutil_write_all(fd, data, strlen(data));
	if (rc == 0 && fsync(fd) != 0)
		rc = -errno;
	close(fd);
	if (rc)
		unlink(path);
	return rc;
}

static const struct option keygen_opts[] = {
    CLI_COMMON_OPTIONS,
    {"output-key-prefix", required_argument, 0, OPT_PREFIX},
    {"passphrase-file", required_argument, 0, OPT_PASSFILE},
    {0, 0, 0, 0},
};

static int cache_keygen_cmd(struct cli *c, int argc, char **argv)
{
	char *priv = NULL, *pub = NULL, *pass = NULL, kp[PATH_MAX], pp[PATH_MAX];
	int rc = 0;
	if (optind != argc) {
		rc = cli_usage_error(c->cmd, "takes no arguments");
		goto out;
	}
	snprintf(kp, sizeof(kp), "%s.key", c->prefix);
	snprintf(pp, sizeof(pp), "%s.pub", c->prefix);
	if (access(kp, F_OK) == 0 || access(pp, F_OK) == 0) {
		fprintf(stderr, "%s: %s or %s already exists; not overwriting\n", c->cmd, kp, pp);
		rc = EXIT_FAIL;
		goto out;
	}
	pass = read_passphrase(c);
	if ((rc = sig_keygen_p256(pass, &priv, &pub))) {
		fprintf(stderr, "%s: key generation failed: %s\n", c->cmd, strerror(-rc));
		rc = EXIT_FAIL;
		goto out;
	}
	if ((rc = write_new_file(kp, priv, 0600)) || (rc = write_new_file(pp, pub, 0644))) {
		fprintf(stderr, "%s: cannot write the key files: %s\n", c->cmd, strerror(-rc));
		unlink(kp);
		rc = EXIT_FAIL;
		goto out;
	}
	printf("Private key written to %s%s\nPublic key written to %s\n", kp,
	       pass && *pass ? " (encrypted)" : " (NOT encrypted: no passphrase given)", pp);
	rc = EXIT_OK;
out:
	if (priv) {
		explicit_bzero(priv, strlen(priv));
		free(priv);
	}
	if (pass) {
		explicit_bzero(pass, strlen(pass));
		free(pass);
	}
	free(pub);
	return rc;
}

const struct cmd_cache_sub cmd_cache_sign_sub = {
    .name = "sign",
    .run = cache_sign_cmd,
    .summary = "sign an image (cosign simple signing or sigstore bundle)",
    .usage = sign_usage,
    .opts = sign_opts,
    .shortopts = "h",
    .own = sign_flag,
};

const struct cmd_cache_sub cmd_cache_verify_sub = {
    .name = "verify",
    .run = cache_verify_cmd,
    .summary = "verify an image's signature against trusted keys",
    .usage = verify_usage,
    .opts = verify_opts,
    .shortopts = "ho:",
};

const struct cmd_cache_sub cmd_cache_keygen_sub = {
    .name = "keygen",
    .run = cache_keygen_cmd,
    .summary = "make an ECDSA P-256 key pair for signing",
    .usage = keygen_usage,
    .opts = keygen_opts,
    .shortopts = "h",
    .own = keygen_flag,
};
