/* Registry and trust flags shared by every command that reads images
 * (gkm cache, gkm up, gkm agent, gkm operator, gkm webhook): add
 * CLI_REGISTRY_OPTIONS to the getopt table and pass unknown options to
 * cli_registry_flag(). Free with cli_registry_clear(). */
#ifndef GKM_CLI_REGISTRY_H
#define GKM_CLI_REGISTRY_H

#include <getopt.h>

#include "cli_keyless.h"
#include "oci_registry.h"
#include "signature.h"

enum {
	CLI_OPT_AUTHFILE = 0x1100,
	CLI_OPT_CREDS,
	CLI_OPT_PLAIN_HTTP,
	CLI_OPT_TLS_NO_VERIFY,
	CLI_OPT_CA_FILE,
	CLI_OPT_REG_TIMEOUT,
	CLI_OPT_RETRIES,
	CLI_OPT_KEY,
	CLI_OPT_HOSTS_DIR,
	CLI_OPT_REGISTRIES_CONF,
};

#define CLI_REGISTRY_MAX_KEYS 32

#define CLI_REGISTRY_OPTIONS                                                                       \
	{"authfile", required_argument, 0, CLI_OPT_AUTHFILE},                                      \
	    {"creds", required_argument, 0, CLI_OPT_CREDS},                                        \
	    {"plain-http", no_argument, 0, CLI_OPT_PLAIN_HTTP},                                    \
	    {"insecure-skip-tls-verify", no_argument, 0, CLI_OPT_TLS_NO_VERIFY},                   \
	    {"ca-file", required_argument, 0, CLI_OPT_CA_FILE},                                    \
	    {"timeout", required_argument, 0, CLI_OPT_REG_TIMEOUT},                                \
	    {"registry-hosts-dir", required_argument, 0, CLI_OPT_HOSTS_DIR},                       \
	    {"registries-conf", required_argument, 0, CLI_OPT_REGISTRIES_CONF},                    \
	{                                                                                          \
		"retries", required_argument, 0, CLI_OPT_RETRIES                                   \
	}

/* --key (trusted public keys; the private key for signing) is added by the
 * commands that take it. */
#define CLI_KEY_OPTION                                                                             \
	{                                                                                          \
		"key", required_argument, 0, CLI_OPT_KEY                                           \
	}

#define CLI_REGISTRY_HELP                                                                          \
	"Registry flags:\n"                                                                        \
	"  --authfile FILE      dockerconfigjson credentials (or a Secret as JSON)\n"              \
	"  --creds USER:PASS    credentials for the registry\n"                                    \
	"  --plain-http         speak HTTP, not HTTPS (loopback registries fall back by\n"         \
	"                       themselves)\n"                                                     \
	"  --insecure-skip-tls-verify  do not verify the registry's certificate\n"                 \
	"  --ca-file FILE       extra CA certificates for TLS\n"                                   \
	"  --timeout SECONDS    connect timeout, and abort when no byte moves for this long\n"     \
	"                       (default 10 / 30)\n"                                               \
	"  --retries N          retries on 5xx, resets and timeouts (default 4)\n"                 \
	"  --registry-hosts-dir DIR  mirrors from containerd's hosts directory\n"                  \
	"                       (DIR/<registry>/hosts.toml, e.g. /etc/containerd/certs.d)\n"       \
	"  --registries-conf FILE  mirrors from a containers-registries.conf v2 file\n"            \
	"                       (e.g. /etc/containers/registries.conf)\n"

#define CLI_KEY_HELP                                                                               \
	"  --key FILE           trusted public key (PEM), repeatable: an image must carry a\n"     \
	"                       signature by one of them\n"

struct cli_registry {
	struct oci_registry_opts reg;
	const char *keys[CLI_REGISTRY_MAX_KEYS];
	unsigned nkeys;
	struct cli_keyless_flags keyless; /* where the command takes CLI_KEYLESS_OPTIONS */
	char *creds;                      /* owned: "user\0password" */
	size_t creds_len;
};

/* defaults_files: also look in the usual credential files (CLI use). */
void cli_registry_init(struct cli_registry *r, bool default_files);
void cli_registry_clear(struct cli_registry *r);
/* 1 if opt was a registry flag (handled), 0 if not, -1 on a bad value
 * (message printed, naming cmd). */
int cli_registry_flag(struct cli_registry *r, int opt, const char *arg, const char *cmd);
/* Whether any trust was given: --key, or keyless trust. */
bool cli_registry_verifies(const struct cli_registry *r);
/* Load the --key files and the keyless trust into a key set (caller frees;
 * NULL when neither was given). 0, or -errno with a message naming the file
 * printed. */
__attribute__((warn_unused_result)) int
cli_registry_keyset(const struct cli_registry *r, const char *cmd, struct sig_keyset **out);

#endif
