/* What the gkm cache subcommands share: their parsed flags and the helpers
 * that open, pull, package and sign images and report failures the same way.
 * cmd_cache.c dispatches to the subcommands, each in the file named for it:
 * cmd_cache_build.c (build), cmd_cache_push.c (push), cmd_cache_inspect.c
 * (inspect), cmd_cache_sign.c (sign, verify, keygen), cmd_cache_extract.c
 * (extract), cmd_cache_capture.c (capture, promote) and cmd_cache_merge.c
 * (merge). */
#ifndef GKM_CMD_CACHE_H
#define GKM_CMD_CACHE_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cJSON.h>

#include "cache_image.h"
#include "cli.h"
#include "cli_registry.h"
#include "extract.h"
#include "oci_err.h"
#include "oci_ref.h"
#include "oci_repo.h"
#include "oci_sig.h"
#include "signature.h"

#define MAX_LABELS 64

enum {
	OPT_PLATFORM = CLI_OPT_FIRST_FREE,
	OPT_CHUNK,
	OPT_FORMAT,
	OPT_REWRITE,
	OPT_LABEL,
	OPT_SDE,
	OPT_LEVEL,
	OPT_ENTRIES,
	OPT_PASSFILE,
	OPT_BUNDLE,
	OPT_STORE,
	OPT_PREFIX,
	OPT_NO_SIGS,
	OPT_REQUIRE_SIG,
	OPT_BASE,
	OPT_SQUASH,
	OPT_GPU_FILE,
	OPT_POLICY_DIR,
	OPT_MAX_FILES,
	OPT_MAX_BYTES,
	OPT_WORKDIR,
	OPT_CACHE,
	OPT_COPY,
	OPT_SETTLE,
	OPT_FROM,
	OPT_APPLY,
	OPT_KUBECONFIG,
};

/* The registry flags every command shares (core/cmd/cli_registry.h), plus the
 * two only image copying needs. --key is added per subcommand. */
#define REGISTRY_OPTIONS                                                                           \
	CLI_REGISTRY_OPTIONS, {"platform", required_argument, 0, OPT_PLATFORM},                    \
	{                                                                                          \
		"chunk-size", required_argument, 0, OPT_CHUNK                                      \
	}

#define REGISTRY_HELP                                                                              \
	CLI_REGISTRY_HELP                                                                          \
	"  --platform OS/ARCH   the image to pick from an index (default linux/<this machine>)\n"  \
	"  --chunk-size BYTES   upload blobs in chunks of this size\n"

struct cli {
	const char *cmd;
	struct cli_registry r; /* registry flags and --key files */
	const char *platform;
	const char *output;
	const char *passfile;
	bool bundle, entries, no_sigs, require_sig;
	const char *store_root;
	const char *prefix;
	struct cache_build_opts build;
	cJSON *labels;
	const char *tag_ref;
	/* capture */
	const char *base_ref;
	bool squash, copy;
	const char *gpu_file, *policy_dir, *workdir, *cache_name;
	struct cache_walk_rules rules;
	unsigned long long settle_ms;
#define CMD_CACHE_MAX_FROM 64
	const char *from[CMD_CACHE_MAX_FROM]; /* capture --from */
	unsigned nfrom;
	bool apply; /* promote: patch the cache through the API server */
	const char *kubeconfig;
};

/* Print "CMD: WHAT: reason" and return EXIT_FAIL. */
int cmd_cache_fail(const char *cmd, const char *what, const struct oci_err *e, int rc);
/* Parse s and open its repository (create: a layout may be made). 0 or an
 * exit code, the failure printed. Release with oci_repo_free() and
 * oci_ref_clear(). */
int cmd_cache_open_ref(struct cli *c, const char *s, bool create, struct oci_ref *ref,
                       struct oci_repo **repo);
/* The same, and resolve s to its manifest descriptor. */
int cmd_cache_open_resolved(struct cli *c, const char *s, struct oci_ref *ref,
                            struct oci_repo **repo, struct oci_desc *desc);
/* "1.5 MiB" */
void cmd_cache_human(uint64_t n, char *buf, size_t cap);
/* The build flags (-t, --format, --rewrite-group-paths, --label,
 * --source-date-epoch, --level): 1 handled, 0 not one, -1 usage error. */
int cmd_cache_build_flag(struct cli *c, int opt, const char *arg);
/* The bytes of the regular files under dir (0: cannot tell). */
uint64_t cmd_cache_tree_bytes(const char *dir);
/* The bytes of an image's layers. */
uint64_t cmd_cache_layers_bytes(const struct oci_image *img);
/* cache_build_layer and cache_build_push, each shown as a stage of progress
 * (progress.h): "pack" (total: the tree's bytes, 0 when not known) and
 * "upload" (the layer, and the base's layers the target lacks). */
int cmd_cache_pack(const char *dir, const struct cache_build_opts *o, uint64_t total,
                   struct cache_build_result *res, struct oci_err *e);
int cmd_cache_upload(const struct cache_build_opts *o, struct cache_build_result *res,
                     struct oci_repo *repo, const char *tag, struct oci_err *e);
/* Fetch the image ref names (verified with the --keys first when given)
 * and extract it safely into the new directory dest (stats_out may be
 * NULL). 0 or EXIT_FAIL, the failure printed. img is the caller's to clear
 * either way. */
int cmd_cache_pull_dir(struct cli *c, struct oci_repo *repo, const struct oci_ref *ref,
                       struct oci_image *img, const char *refstr, const char *dest,
                       struct extract_stats *stats_out);
/* Sign the image refstr names with the single private --key (simple signing,
 * or a bundle with --bundle), unless that key signed it already. 0 or an exit
 * code, the failure printed. */
int cmd_cache_sign(struct cli *c, const char *refstr);
/* Print a built image's summary (-o json or a table): the image's content
 * is image (NULL: res->meta, a one-layer image); extra (consumed, may be
 * NULL) is an object of more fields to show. */
void cmd_cache_print_built(struct cli *c, const char *verb, const struct oci_ref *ref,
                           const struct cache_build_result *res, const struct cache_meta *image,
                           cJSON *extra);

/* What an image's signatures say (cmd_cache_sig_check). */
struct cmd_cache_sigs {
	bool looked;
	int rc; /* oci_sig_collect's */
	struct oci_sig_found found;
	bool verified_tried;
	int verify_rc;
	struct sig_verdict verdict;
	struct oci_err err;
};
/* Collect digest's signatures in repo and, with --key, verify them; a
 * failure is recorded in s, not printed. Release s->found with
 * oci_sig_found_clear(). */
void cmd_cache_sig_check(struct cli *c, struct oci_repo *repo, const char *digest,
                         struct cmd_cache_sigs *s);
/* "unsigned", "verified: ..." and the like, in buf. */
const char *cmd_cache_sig_summary(const struct cmd_cache_sigs *s, char *buf, size_t cap);
/* The group-file line of a summary (nothing when there are none). */
void cmd_cache_print_groups(const struct cache_meta *m, FILE *f);

/* One subcommand: its name, code, one-line summary, usage, flags and the
 * handler of its own flags (NULL: none). */
struct cmd_cache_sub {
	const char *name;
	int (*run)(struct cli *c, int argc, char **argv); /* args from argv[optind] on */
	const char *summary;
	const char *usage;
	const struct option *opts;
	const char *shortopts;
	int (*own)(struct cli *c, int opt, const char *arg);
};
extern const struct cmd_cache_sub cmd_cache_build_sub, cmd_cache_push_sub, cmd_cache_inspect_sub,
    cmd_cache_sign_sub, cmd_cache_verify_sub, cmd_cache_extract_sub, cmd_cache_keygen_sub;

/* The subcommands that export their parts. */
int cmd_cache_capture(struct cli *c, int argc, char **argv);
int cmd_cache_capture_flag(struct cli *c, int opt, const char *arg);
extern const char cmd_cache_capture_usage[];
extern const struct option cmd_cache_capture_opts[];
int cmd_cache_promote(struct cli *c, int argc, char **argv);
int cmd_cache_promote_flag(struct cli *c, int opt, const char *arg);
extern const char cmd_cache_promote_usage[];
extern const struct option cmd_cache_promote_opts[];
int cmd_cache_merge(struct cli *c, int argc, char **argv);
extern const char cmd_cache_merge_usage[];
extern const struct option cmd_cache_merge_opts[];

#endif
