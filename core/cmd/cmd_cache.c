/* gkm cache: the dispatcher of its subcommands (package, push, inspect,
 * sign, verify, extract, capture, merge and promote kernel cache images in
 * the MCV/TCV format, DESIGN.md section 6, with registries or OCI layout
 * directories ("oci:DIR:TAG") on either side), the flags they share and the
 * helpers that open images and report failures the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "cache_capture.h"
#include "cache_image.h"
#include "cli.h"
#include "cli_registry.h"
#include "cmd.h"
#include "cmd_cache.h"
#include "oci_ref.h"
#include "oci_repo.h"
#include "progress.h"

static void cli_free(struct cli *c)
{
	cli_registry_clear(&c->r);
	cJSON_Delete(c->labels);
}

/* Handle a flag shared by the subcommands. 1 handled, 0 not ours, -1 usage error. */
static int common_flag(struct cli *c, int opt, const char *arg)
{
	unsigned long long v = 0;
	int r = cli_registry_flag(&c->r, opt, arg, c->cmd);
	if (r != 0)
		return r;
	switch (opt) {
	case OPT_PLATFORM:
		c->platform = arg;
		return 1;
	case OPT_CHUNK:
		if (cli_parse_u64(arg, 1ull << 34, &v) || v < 4096) {
			cli_usage_error(c->cmd, "invalid --chunk-size '%s' (at least 4096)", arg);
			return -1;
		}
		c->r.reg.chunk_size = (size_t)v;
		return 1;
	case 'o':
		if (strcmp(arg, "json") != 0 && strcmp(arg, "table") != 0) {
			cli_usage_error(c->cmd, "invalid -o '%s' (want table or json)", arg);
			return -1;
		}
		c->output = arg;
		return 1;
	default:
		return 0;
	}
}

/* getopt loop shared by every subcommand; positional args land in argv[optind..]. */
static int parse(struct cli *c, int argc, char **argv, const char *usage, const struct option *opts,
                 const char *shortopts, int (*own)(struct cli *c, int opt, const char *arg))
{
	cli_reset();
	int opt, ex;
	while ((opt = cli_next(argc, argv, shortopts, opts, c->cmd, usage, &ex)) != -1) {
		int r = common_flag(c, opt, optarg);
		if (r == 0 && own)
			r = own(c, opt, optarg);
		if (r < 0)
			return EXIT_USAGE;
	}
	if (ex >= 0)
		return ex == EXIT_OK ? -1 : EXIT_USAGE; /* -1: --help printed */
	return 0;
}

int cmd_cache_fail(const char *cmd, const char *what, const struct oci_err *e, int rc)
{
	fprintf(stderr, "%s: %s: %s\n", cmd, what, oci_err_str(e, rc));
	return EXIT_FAIL;
}

int cmd_cache_open_ref(struct cli *c, const char *s, bool create, struct oci_ref *ref,
                       struct oci_repo **repo)
{
	struct oci_err e = {{0}};
	int rc = oci_ref_parse(s, ref, &e);
	if (rc) {
		fprintf(stderr, "%s: invalid image reference '%s': %s\n", c->cmd, s, e.msg);
		return EXIT_USAGE;
	}
	if ((rc = oci_repo_open(ref, &c->r.reg, create, repo, &e))) {
		oci_ref_clear(ref);
		return cmd_cache_fail(c->cmd, s, &e, rc);
	}
	return 0;
}

/* Open the repository of s and resolve it to its manifest descriptor. */
int cmd_cache_open_resolved(struct cli *c, const char *s, struct oci_ref *ref,
                            struct oci_repo **repo, struct oci_desc *desc)
{
	struct oci_err e = {{0}};
	int rc = cmd_cache_open_ref(c, s, false, ref, repo);
	if (rc)
		return rc;
	int orc = oci_repo_resolve(*repo, oci_ref_reference(ref), desc, &e);
	return orc ? cmd_cache_fail(c->cmd, s, &e, orc) : 0;
}

void cmd_cache_human(uint64_t n, char *buf, size_t cap)
{
	progress_human(n, buf, cap);
}

uint64_t cmd_cache_layers_bytes(const struct oci_image *img)
{
	uint64_t n = 0;
	for (size_t i = 0; i < img->manifest.n_layers; i++)
		n += (uint64_t)img->manifest.layers[i].size;
	return n;
}

/* ---- dispatch --------------------------------------------------------------- */

static const struct cmd_cache_sub capture_sub = {
    .name = "capture",
    .run = cmd_cache_capture,
    .summary = "run a warm-up command and package what it compiled",
    .usage = cmd_cache_capture_usage,
    .opts = cmd_cache_capture_opts,
    .shortopts = "+ht:o:",
    .own = cmd_cache_capture_flag,
};
static const struct cmd_cache_sub merge_sub = {
    .name = "merge",
    .run = cmd_cache_merge,
    .summary = "one image from caches built for different GPUs",
    .usage = cmd_cache_merge_usage,
    .opts = cmd_cache_merge_opts,
    .shortopts = "ht:o:",
    .own = cmd_cache_build_flag,
};
static const struct cmd_cache_sub promote_sub = {
    .name = "promote",
    .run = cmd_cache_promote,
    .summary = "sign a captured candidate and name it the cache's image",
    .usage = cmd_cache_promote_usage,
    .opts = cmd_cache_promote_opts,
    .shortopts = "ht:o:",
    .own = cmd_cache_promote_flag,
};

static const struct cmd_cache_sub *const subs[] = {
    &cmd_cache_build_sub,  &cmd_cache_push_sub,   &cmd_cache_inspect_sub,
    &cmd_cache_sign_sub,   &cmd_cache_verify_sub, &cmd_cache_extract_sub,
    &cmd_cache_keygen_sub, &capture_sub,          &merge_sub,
    &promote_sub,
};

/* Flags, defaults and the parse every subcommand shares, then its own code. */
static int run_sub(const struct cmd_cache_sub *sub, int argc, char **argv)
{
	char cmd[64];
	snprintf(cmd, sizeof(cmd), "gkm cache %s", sub->name);
	struct cli c = {.cmd = cmd, .output = "table", .prefix = "cosign"};
	cli_registry_init(&c.r, true);
	cache_build_opts_init(&c.build);
	cache_capture_rules_default(&c.rules);
	c.settle_ms = 1000;
	const char *sde = getenv("SOURCE_DATE_EPOCH");
	unsigned long long v = 0;
	if (sde && *sde && cli_parse_u64(sde, 1ull << 40, &v) == 0)
		c.build.source_date_epoch = (int64_t)v;
	int rc = EXIT_FAIL;
	if ((c.labels = cJSON_CreateObject()))
		rc = parse(&c, argc, argv, sub->usage, sub->opts, sub->shortopts, sub->own);
	if (rc == 0)
		rc = sub->run(&c, argc, argv);
	cli_free(&c);
	return rc < 0 ? EXIT_OK : rc; /* -1: --help was printed */
}

static void cache_usage(FILE *f)
{
	fprintf(f, "Usage: gkm cache COMMAND [FLAGS] [ARGS]\n\nCommands:\n");
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
		fprintf(f, "  %-8s %s\n", subs[i]->name, subs[i]->summary);
	fprintf(f,
	        "\nImages are registry references (host[:port]/repo[:tag][@digest]) or OCI\n"
	        "layout directories (oci:DIR[:TAG]). Run 'gkm cache COMMAND --help' for flags.\n");
}

int cmd_cache(int argc, char **argv)
{
	if (argc < 2) {
		cache_usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		cache_usage(stdout);
		return EXIT_OK;
	}
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
		if (strcmp(argv[1], subs[i]->name) == 0)
			return run_sub(subs[i], argc - 1, argv + 1);
	fprintf(stderr, "gkm cache: unknown command '%s'\n\n", argv[1]);
	cache_usage(stderr);
	return EXIT_USAGE;
}
