#include "cli_registry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "oci_mirrors.h"

void cli_registry_init(struct cli_registry *r, bool default_files)
{
	memset(r, 0, sizeof(*r));
	oci_registry_opts_init(&r->reg);
	r->reg.no_default_auth_files = !default_files;
}

void cli_registry_clear(struct cli_registry *r)
{
	if (r->creds) {
		explicit_bzero(r->creds, r->creds_len);
		free(r->creds);
	}
	r->creds = NULL;
}

int cli_registry_flag(struct cli_registry *r, int opt, const char *arg, const char *cmd)
{
	unsigned long long v;
	switch (opt) {
	case CLI_OPT_AUTHFILE:
		r->reg.auth_file = arg;
		return 1;
	case CLI_OPT_CREDS: {
		cli_registry_clear(r);
		r->creds = strdup(arg);
		r->creds_len = strlen(arg) + 1;
		char *colon = r->creds ? strchr(r->creds, ':') : NULL;
		if (!colon) {
			cli_usage_error(cmd, "--creds wants USER:PASSWORD");
			return -1;
		}
		*colon = '\0';
		r->reg.username = r->creds;
		r->reg.password = colon + 1;
		return 1;
	}
	case CLI_OPT_PLAIN_HTTP:
		r->reg.plain_http = "*";
		return 1;
	case CLI_OPT_TLS_NO_VERIFY:
		r->reg.tls_no_verify = true;
		return 1;
	case CLI_OPT_CA_FILE:
		r->reg.ca_file = arg;
		return 1;
	case CLI_OPT_REG_TIMEOUT:
		if (cli_parse_u64(arg, 3600, &v) != 0 || v == 0) {
			cli_usage_error(cmd, "invalid --timeout '%s' (1..3600 seconds)", arg);
			return -1;
		}
		r->reg.connect_timeout_s = r->reg.stall_timeout_s = (unsigned)v;
		if (r->reg.request_timeout_s > 4 * v)
			r->reg.request_timeout_s = (unsigned)(4 * v);
		return 1;
	case CLI_OPT_RETRIES:
		if (cli_parse_u64(arg, 20, &v) != 0) {
			cli_usage_error(cmd, "invalid --retries '%s' (0..20)", arg);
			return -1;
		}
		r->reg.retries = r->reg.resumes = (unsigned)v;
		return 1;
	case CLI_OPT_HOSTS_DIR:
	case CLI_OPT_REGISTRIES_CONF: {
		/* a malformed file is an error now, not at the first pull */
		struct oci_err e = {{0}};
		bool dir = opt == CLI_OPT_HOSTS_DIR;
		if (oci_mirrors_check(dir ? arg : NULL, dir ? NULL : arg, &e)) {
			fprintf(stderr, "%s: %s\n", cmd, e.msg);
			return -1;
		}
		if (dir)
			r->reg.hosts_dir = arg;
		else
			r->reg.registries_conf = arg;
		return 1;
	}
	case CLI_OPT_KEY:
		if (r->nkeys >= CLI_REGISTRY_MAX_KEYS) {
			cli_usage_error(cmd, "at most %d --key flags", CLI_REGISTRY_MAX_KEYS);
			return -1;
		}
		r->keys[r->nkeys++] = arg;
		return 1;
	default:
		return cli_keyless_flag(&r->keyless, opt, arg, cmd);
	}
}

bool cli_registry_verifies(const struct cli_registry *r)
{
	return r->nkeys > 0 || r->keyless.n > 0;
}

int cli_registry_keyset(const struct cli_registry *r, const char *cmd, struct sig_keyset **out)
{
	struct sig_keyset *ks = NULL;
	int rc;
	*out = NULL;
	if (r->nkeys == 0)
		return cli_keyless_attach(&r->keyless, out, cmd);
	if ((rc = sig_keyset_new(&ks)))
		return rc;
	for (unsigned i = 0; i < r->nkeys; i++) {
		struct sig_key *k = NULL;
		char why[256] = "cannot add the key";
		if ((rc = sig_key_load_public_file(r->keys[i], &k, why, sizeof(why))) ||
		    (rc = sig_keyset_add(ks, k))) {
			if (k && rc)
				sig_key_free(k);
			fprintf(stderr, "%s: --key %s: %s\n", cmd, r->keys[i], why);
			sig_keyset_free(ks);
			return rc;
		}
	}
	if ((rc = cli_keyless_attach(&r->keyless, &ks, cmd))) {
		sig_keyset_free(ks);
		return rc;
	}
	*out = ks;
	return 0;
}
