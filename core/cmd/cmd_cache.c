/* gkm cache: package, push, inspect, sign, verify and extract kernel cache
 * images (MCV/TCV format, DESIGN.md section 6), with registries or OCI
 * layout directories ("oci:DIR:TAG") on either side. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "fsutil.h"
#include "cache_image.h"
#include "cli.h"
#include "cli_registry.h"
#include "cmd.h"
#include "cmd_cache.h"
#include "cache_capture.h"
#include "extract.h"
#include "fstree.h"
#include "log.h"
#include "oci_auth.h"
#include "oci_mirrors.h"
#include "oci_pull.h"
#include "oci_ref.h"
#include "oci_repo.h"
#include "oci_sig.h"
#include "signature.h"
#include "store.h"

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
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)n;
	int i = 0;
	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	if (i == 0)
		snprintf(buf, cap, "%" PRIu64 " B", n);
	else
		snprintf(buf, cap, "%.1f %s", v, u[i]);
}

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

struct sig_state {
	bool looked;
	int rc; /* oci_sig_collect's */
	struct oci_sig_found found;
	bool verified_tried;
	int verify_rc;
	struct sig_verdict verdict;
	struct oci_err err;
};

static void sig_state_check(struct cli *c, struct oci_repo *repo, const char *digest,
                            struct sig_state *s)
{
	memset(s, 0, sizeof(*s));
	s->looked = true;
	s->rc = oci_sig_collect(repo, digest, &s->found, &s->err);
	if (s->rc || c->r.nkeys == 0)
		return;
	struct sig_keyset *ks = NULL;
	if ((s->verify_rc = load_keyset(c, &ks)))
		return;
	s->verified_tried = true;
	s->verify_rc = sig_verify(ks, digest, s->found.c, s->found.n, &s->verdict);
	sig_keyset_free(ks);
}

static const char *sig_summary(const struct sig_state *s, char *buf, size_t cap)
{
	if (!s->looked)
		snprintf(buf, cap, "not checked");
	else if (s->rc)
		snprintf(buf, cap, "unknown (%s)", oci_err_str(&s->err, s->rc));
	else if (s->found.n == 0)
		snprintf(buf, cap, "unsigned");
	else if (!s->verified_tried)
		snprintf(buf, cap,
		         "%zu found (%zu simple signing, %zu bundle), not verified (give --key)",
		         s->found.n, s->found.n_simple, s->found.n_bundle);
	else if (s->verify_rc == 0)
		snprintf(buf, cap, "verified: %s", s->verdict.reason);
	else
		snprintf(buf, cap, "NOT verified: %s", s->verdict.reason);
	return buf;
}

/* ---- build ------------------------------------------------------------ */

static const char build_usage[] =
    "Usage: gkm cache build DIR -t REF [--format triton|vllm|auto] [flags]\n\n"
    "Package a Triton or vLLM cache directory into an MCV-compatible image\n"
    "(one tar+gzip layer with io.<fmt>.cache/ and io.<fmt>.manifest/manifest.json,\n"
    "labels cache.<fmt>.image/summary, entry-count, cache-size-bytes) and store it\n"
    "at REF: a registry (host/repo:tag) or a layout directory (oci:DIR:TAG).\n\n"
    "  -t, --tag REF           where to store the image (required)\n"
    "  --format FMT            triton, vllm or auto (default auto)\n"
    "  --rewrite-group-paths   rewrite absolute paths in Triton __grp__*.json files to\n"
    "                          bare file names, so the cache hits wherever it is mounted\n"
    "  --label KEY=VALUE       an extra config label (repeatable)\n"
    "  --source-date-epoch N   clamp file times and set the creation time to N\n"
    "                          (default $SOURCE_DATE_EPOCH, else the newest file time)\n"
    "  --level N               gzip effort 0..3 (default 1)\n"
    "  -o json                 print the result as JSON\n\n" REGISTRY_HELP;

int cmd_cache_build_flag(struct cli *c, int opt, const char *arg)
{
	unsigned long long v = 0;
	switch (opt) {
	case 't':
		c->tag_ref = arg;
		return 1;
	case OPT_FORMAT:
		if (strcmp(arg, "triton") == 0)
			c->build.format = CACHE_TRITON;
		else if (strcmp(arg, "vllm") == 0)
			c->build.format = CACHE_VLLM;
		else if (strcmp(arg, "auto") == 0)
			c->build.format = CACHE_AUTO;
		else {
			cli_usage_error(c->cmd, "invalid --format '%s' (want triton, vllm or auto)",
			                arg);
			return -1;
		}
		return 1;
	case OPT_REWRITE:
		c->build.rewrite_group_paths = true;
		return 1;
	case OPT_LABEL: {
		const char *eq = strchr(arg, '=');
		if (!eq || eq == arg || cJSON_GetArraySize(c->labels) >= MAX_LABELS) {
			cli_usage_error(c->cmd, "invalid --label '%s' (want KEY=VALUE)", arg);
			return -1;
		}
		char key[256];
		snprintf(key, sizeof(key), "%.*s", (int)(eq - arg), arg);
		cJSON_DeleteItemFromObjectCaseSensitive(c->labels, key);
		if (!cJSON_AddStringToObject(c->labels, key, eq + 1))
			return -1;
		return 1;
	}
	case OPT_SDE:
		if (cli_parse_u64(arg, 1ull << 40, &v)) {
			cli_usage_error(c->cmd, "invalid --source-date-epoch '%s'", arg);
			return -1;
		}
		c->build.source_date_epoch = (int64_t)v;
		return 1;
	case OPT_LEVEL:
		if (cli_parse_u64(arg, 3, &v)) {
			cli_usage_error(c->cmd, "invalid --level '%s' (0..3)", arg);
			return -1;
		}
		c->build.level = (int)v;
		return 1;
	default:
		return 0;
	}
}

static void print_groups(const struct cache_meta *m, FILE *f)
{
	if (m->abs_groups)
		fprintf(f,
		        "Group files:  %" PRIu64 " of %" PRIu64
		        " hold absolute paths (built at %s): "
		        "the cache only hits when mounted at that path; rebuild with "
		        "--rewrite-group-paths to make it relocatable\n",
		        m->abs_groups, m->groups, m->abs_group_root);
	else if (m->groups)
		fprintf(f, "Group files:  %" PRIu64 ", all with relative paths\n", m->groups);
}

void cmd_cache_print_built(struct cli *c, const char *verb, const struct oci_ref *ref,
                           const struct cache_build_result *res, const struct cache_meta *image,
                           cJSON *extra)
{
	const struct cache_meta *m = image ? image : &res->meta;
	char *summary = cache_summary_json(m);
	char *name = oci_ref_name(ref);
	const cJSON *it;
	if (c->output && strcmp(c->output, "json") == 0) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "reference", c->tag_ref);
		cJSON_AddStringToObject(o, "digest", res->digest);
		cJSON_AddStringToObject(o, "format", cache_format_name(m->format));
		cJSON_AddStringToObject(o, "layerDigest", res->layer_digest);
		cJSON_AddNumberToObject(o, "layerSize", (double)res->layer_size);
		cJSON_AddNumberToObject(o, "entryCount", (double)m->entries);
		cJSON_AddNumberToObject(o, "cacheSizeBytes", (double)m->bytes);
		cJSON_AddItemToObject(o, "targets", cJSON_Duplicate(m->targets, 1));
		cJSON_AddNumberToObject(o, "groupFiles", (double)m->groups);
		cJSON_AddNumberToObject(o, "absoluteGroupFiles", (double)m->abs_groups);
		cJSON_ArrayForEach(it, extra)
		    cJSON_AddItemToObject(o, it->string, cJSON_Duplicate(it, 1));
		cli_print_json(o);
	} else {
		char sz[32], lz[32];
		cmd_cache_human(m->bytes, sz, sizeof(sz));
		cmd_cache_human(res->layer_size, lz, sizeof(lz));
		printf("%s %s@%s\n", verb, name ? name : c->tag_ref, res->digest);
		printf("Format:       %s\nEntries:      %" PRIu64 "\nCache size:   %s (%" PRIu64
		       " bytes, %" PRIu64 " files)\nLayer:        %s (%s)\nSummary:      %s\n",
		       cache_format_name(m->format), m->entries, sz, m->bytes, m->files, lz,
		       res->layer_digest, summary ? summary : "");
		cJSON_ArrayForEach(it, extra)
		{
			char *v = cJSON_IsString(it) ? NULL : cJSON_PrintUnformatted(it);
			printf("%-13s %s\n", it->string, v ? v : it->valuestring);
			free(v);
		}
		print_groups(m, stdout);
	}
	free(summary);
	free(name);
	cJSON_Delete(extra);
}

static const struct option build_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"tag", required_argument, 0, 't'},
    {"format", required_argument, 0, OPT_FORMAT},
    {"rewrite-group-paths", no_argument, 0, OPT_REWRITE},
    {"label", required_argument, 0, OPT_LABEL},
    {"source-date-epoch", required_argument, 0, OPT_SDE},
    {"level", required_argument, 0, OPT_LEVEL},
    {"output", required_argument, 0, 'o'},
    {0, 0, 0, 0},
};

static int cache_build_cmd(struct cli *c, int argc, char **argv)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct cache_build_result res = {0};
	struct oci_err e = {{0}};
	int rc = 0;
	if (optind + 1 != argc || !c->tag_ref) {
		rc = cli_usage_error(c->cmd, "want one cache directory and -t REF");
		goto out;
	}
	const char *dir = argv[optind];
	if ((rc = cmd_cache_open_ref(c, c->tag_ref, true, &ref, &repo)))
		goto out;
	if (ref.digest) {
		rc = cli_usage_error(c->cmd, "-t names a tag, not a digest ('%s')", c->tag_ref);
		goto out;
	}
	c->build.extra_labels = c->labels;
	c->build.platform = c->platform;
	int brc = cache_build(dir, &c->build, repo, ref.tag, &res, &e);
	if (brc) {
		rc = cmd_cache_fail(c->cmd, "cannot package", &e, brc);
		goto out;
	}
	cmd_cache_print_built(c, "Built", &ref, &res, NULL, NULL);
	rc = EXIT_OK;
out:
	cache_build_result_clear(&res);
	oci_repo_free(repo);
	oci_ref_clear(&ref);
	return rc;
}

/* ---- push --------------------------------------------------------------- */

static const char push_usage[] =
    "Usage: gkm cache push SRC DST [flags]\n\n"
    "Copy an image (and nothing it already has) from SRC to DST;\n"
    "either may be a registry reference or oci:DIR:TAG.\n\n" REGISTRY_HELP;

static const struct option push_opts[] = {CLI_COMMON_OPTIONS, REGISTRY_OPTIONS, {0, 0, 0, 0}};

static int cache_push_cmd(struct cli *c, int argc, char **argv)
{
	struct oci_ref sref = {0}, dref = {0};
	struct oci_repo *src = NULL, *dst = NULL;
	struct oci_err e = {{0}};
	char dg[OCI_DIGEST_MAX];
	int rc = 0;
	if (optind + 2 != argc) {
		rc = cli_usage_error(c->cmd, "want SRC and DST");
		goto out;
	}
	if ((rc = cmd_cache_open_ref(c, argv[optind], false, &sref, &src)) ||
	    (rc = cmd_cache_open_ref(c, argv[optind + 1], true, &dref, &dst)))
		goto out;
	int prc = oci_repo_copy_image(src, oci_ref_reference(&sref), dst, dref.tag, dg, &e);
	if (prc) {
		rc = cmd_cache_fail(c->cmd, argv[optind], &e, prc);
		goto out;
	}
	char *name = oci_ref_name(&dref);
	printf("Pushed %s@%s\n", name ? name : argv[optind + 1], dg);
	free(name);
	rc = EXIT_OK;
out:
	oci_repo_free(src);
	oci_repo_free(dst);
	oci_ref_clear(&sref);
	oci_ref_clear(&dref);
	return rc;
}

/* ---- inspect ------------------------------------------------------------ */

static const char inspect_usage[] =
    "Usage: gkm cache inspect REF [-o table|json] [--entries] [--key FILE]...\n\n"
    "Show a cache image: targets, sizes, layers, entries, group-file paths and the\n"
    "signature state (verified when --key is given).\n\n"
    "  --entries         read the whole layer (digest-checked) to list the kernels and\n"
    "                    check group files; done anyway for layers up to 64 MiB\n"
    "  --no-signatures   do not look for signatures\n"
    "  --key FILE        a trusted public key (PEM; repeatable)\n"
    "  -o, --output FMT  table (default) or json\n\n" REGISTRY_HELP;

#define INSPECT_SCAN_MAX (64u << 20)

static int inspect_flag(struct cli *c, int opt, const char *arg)
{
	(void)arg;
	if (opt == OPT_ENTRIES)
		c->entries = true;
	else if (opt == OPT_NO_SIGS)
		c->no_sigs = true;
	else
		return 0;
	return 1;
}

enum cache_format cmd_cache_format_of(const struct oci_config *cfg)
{
	if (oci_config_label(cfg, "cache.vllm.image/summary") ||
	    oci_config_label(cfg, "cache.vllm.image/entry-count"))
		return CACHE_VLLM;
	if (oci_config_label(cfg, "cache.triton.image/summary") ||
	    oci_config_label(cfg, "cache.triton.image/entry-count"))
		return CACHE_TRITON;
	return CACHE_AUTO;
}

static const char *label_of(const struct oci_config *cfg, enum cache_format f, const char *key)
{
	char k[96];
	snprintf(k, sizeof(k), "cache.%s.image/%s", f == CACHE_VLLM ? "vllm" : "triton", key);
	return oci_config_label(cfg, k);
}

static void print_targets(const cJSON *targets)
{
	printf("Targets:\n  %-8s %-14s %-5s %-4s %s\n", "BACKEND", "ARCH", "WARP", "PTX", "CUDA");
	const cJSON *t;
	cJSON_ArrayForEach(t, targets)
	{
		char arch[64] = "-", warp[16] = "-", ptx[16] = "-";
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(t, "arch");
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(t, "warp_size");
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(t, "ptx_version");
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(t, "backend");
		const cJSON *cu = cJSON_GetObjectItemCaseSensitive(t, "cuda_version");
		if (cJSON_IsNumber(a))
			snprintf(arch, sizeof(arch), "%d", a->valueint);
		else if (cJSON_IsString(a))
			snprintf(arch, sizeof(arch), "%s", a->valuestring);
		if (cJSON_IsNumber(w))
			snprintf(warp, sizeof(warp), "%d", w->valueint);
		if (cJSON_IsNumber(p))
			snprintf(ptx, sizeof(ptx), "%d", p->valueint);
		printf("  %-8s %-14s %-5s %-4s %s\n", cJSON_IsString(b) ? b->valuestring : "-",
		       arch, warp, ptx, cJSON_IsString(cu) ? cu->valuestring : "-");
	}
}

static void print_kernels(const cJSON *kernels)
{
	printf("Kernels:\n  %-36s %-54s %-8s %s\n", "NAME", "HASH DIR", "BACKEND", "ARCH");
	const cJSON *k;
	cJSON_ArrayForEach(k, kernels)
	{
		const cJSON *n = cJSON_GetObjectItemCaseSensitive(k, "name");
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(k, "dir");
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(k, "backend");
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(k, "arch");
		char arch[64] = "-";
		if (cJSON_IsNumber(a))
			snprintf(arch, sizeof(arch), "%d", a->valueint);
		else if (cJSON_IsString(a))
			snprintf(arch, sizeof(arch), "%s", a->valuestring);
		printf("  %-36s %-54s %-8s %s\n", cJSON_IsString(n) ? n->valuestring : "-",
		       cJSON_IsString(d) ? d->valuestring : "-",
		       cJSON_IsString(b) ? b->valuestring : "-", arch);
	}
}

/* All kernels of a meta, flattening vLLM entries. New array, caller frees. */
static cJSON *all_kernels(const struct cache_meta *m)
{
	cJSON *out = cJSON_Duplicate(m->kernels, 1);
	const cJSON *e;
	cJSON_ArrayForEach(e, m->vllm)
	{
		const cJSON *k;
		cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(e, "triton"))
		    cJSON_AddItemToArray(out, cJSON_Duplicate(k, 1));
	}
	return out;
}

static const struct option inspect_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"output", required_argument, 0, 'o'},
    {"entries", no_argument, 0, OPT_ENTRIES},
    {"no-signatures", no_argument, 0, OPT_NO_SIGS},
    {"key", required_argument, 0, CLI_OPT_KEY},
    {0, 0, 0, 0},
};

static int cache_inspect_cmd(struct cli *c, int argc, char **argv)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct oci_image img = {0};
	struct cache_meta meta = {0};
	struct sig_state sigs = {0};
	struct oci_err e = {{0}};
	cJSON *summary = NULL, *kernels = NULL;
	bool scanned = false;
	int rc = 0;
	if (optind + 1 != argc) {
		rc = cli_usage_error(c->cmd, "want one image reference");
		goto out;
	}
	if ((rc = cmd_cache_open_ref(c, argv[optind], false, &ref, &repo)))
		goto out;
	int frc = oci_repo_fetch_image(repo, oci_ref_reference(&ref), c->platform, &img, &e);
	if (frc) {
		rc = cmd_cache_fail(c->cmd, argv[optind], &e, frc);
		goto out;
	}
	enum cache_format fmt = cmd_cache_format_of(&img.config);
	const char *sum_s = label_of(&img.config, fmt, "summary");
	summary = sum_s ? cJSON_Parse(sum_s) : NULL;
	uint64_t layer_bytes = 0;
	for (size_t i = 0; i < img.manifest.n_layers; i++)
		layer_bytes += (uint64_t)img.manifest.layers[i].size;
	if (cache_meta_init(&meta, fmt)) {
		rc = EXIT_FAIL;
		goto out;
	}
	if ((c->entries || layer_bytes <= INSPECT_SCAN_MAX) && img.manifest.n_layers > 0) {
		for (size_t i = 0; i < img.manifest.n_layers; i++) {
			struct oci_blob_reader *r = NULL;
			char what[32];
			snprintf(what, sizeof(what), "layer %zu", i);
			int lrc = oci_repo_blob_open(repo, &img.manifest.layers[i], what, &r, &e);
			if (lrc == 0) {
				lrc = cache_scan_layer(r, &meta, NULL, &e);
				oci_blob_close(r);
			}
			if (lrc) {
				rc = cmd_cache_fail(c->cmd, argv[optind], &e, lrc);
				goto out;
			}
		}
		scanned = true;
		kernels = all_kernels(&meta);
	}
	if (!c->no_sigs)
		sig_state_check(c, repo, img.top_digest, &sigs);
	const char *entries = label_of(&img.config, fmt, "entry-count");
	const char *size = label_of(&img.config, fmt, "cache-size-bytes");
	const char *created = NULL;
	const cJSON *cr = cJSON_GetObjectItemCaseSensitive(img.config.root, "created");
	if (cJSON_IsString(cr))
		created = cr->valuestring;
	char sigbuf[700];
	sig_summary(&sigs, sigbuf, sizeof(sigbuf));
	if (strcmp(c->output, "json") == 0) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "reference", argv[optind]);
		cJSON_AddStringToObject(o, "digest", img.top_digest);
		cJSON_AddStringToObject(o, "manifestDigest", img.desc.digest);
		cJSON_AddStringToObject(o, "mediaType", img.top_media_type);
		cJSON_AddStringToObject(o, "format",
		                        fmt == CACHE_AUTO ? "unknown" : cache_format_name(fmt));
		if (created)
			cJSON_AddStringToObject(o, "created", created);
		const cJSON *labels = oci_config_labels(&img.config);
		cJSON_AddItemToObject(o, "labels",
		                      labels ? cJSON_Duplicate(labels, 1) : cJSON_CreateObject());
		cJSON_AddNumberToObject(o, "entryCount", entries ? strtod(entries, NULL) : 0);
		cJSON_AddNumberToObject(o, "cacheSizeBytes", size ? strtod(size, NULL) : 0);
		cJSON *t = summary ? cJSON_GetObjectItemCaseSensitive(summary, "targets") : NULL;
		cJSON_AddItemToObject(o, "targets",
		                      t ? cJSON_Duplicate(t, 1) : cJSON_CreateArray());
		cJSON *ls = cJSON_AddArrayToObject(o, "layers");
		for (size_t i = 0; i < img.manifest.n_layers; i++)
			cJSON_AddItemToArray(ls, oci_desc_to_json(&img.manifest.layers[i]));
		if (scanned) {
			cJSON *sc = cJSON_AddObjectToObject(o, "scan");
			cJSON_AddNumberToObject(sc, "files", (double)meta.files);
			cJSON_AddNumberToObject(sc, "bytes", (double)meta.bytes);
			cJSON_AddNumberToObject(sc, "entries", (double)meta.entries);
			cJSON_AddItemToObject(sc, "targets", cJSON_Duplicate(meta.targets, 1));
			cJSON_AddItemToObject(sc, "kernels", cJSON_Duplicate(kernels, 1));
			cJSON *g = cJSON_AddObjectToObject(sc, "groupFiles");
			cJSON_AddNumberToObject(g, "total", (double)meta.groups);
			cJSON_AddNumberToObject(g, "absolute", (double)meta.abs_groups);
			if (meta.abs_groups)
				cJSON_AddStringToObject(g, "buildRoot", meta.abs_group_root);
		}
		cJSON *sg = cJSON_AddObjectToObject(o, "signatures");
		cJSON_AddBoolToObject(sg, "checked", sigs.looked);
		if (sigs.looked && sigs.rc == 0) {
			cJSON_AddNumberToObject(sg, "found", (double)sigs.found.n);
			cJSON_AddNumberToObject(sg, "simpleSigning", (double)sigs.found.n_simple);
			cJSON_AddNumberToObject(sg, "bundles", (double)sigs.found.n_bundle);
			cJSON_AddBoolToObject(sg, "referrersAPI", sigs.found.referrers_api);
		}
		if (sigs.verified_tried)
			cJSON_AddBoolToObject(sg, "verified", sigs.verify_rc == 0);
		else
			cJSON_AddNullToObject(sg, "verified");
		cJSON_AddStringToObject(sg, "state", sigbuf);
		cli_print_json(o);
	} else {
		char hs[32];
		printf("Image:        %s\nDigest:       %s\n", argv[optind], img.top_digest);
		if (strcmp(img.top_digest, img.desc.digest) != 0)
			printf("Manifest:     %s (picked from the index)\n", img.desc.digest);
		printf("Format:       %s\n",
		       fmt == CACHE_AUTO ? "unknown (no cache labels)" : cache_format_name(fmt));
		if (created)
			printf("Created:      %s\n", created);
		if (entries)
			printf("Entries:      %s\n", entries);
		if (size) {
			cmd_cache_human((uint64_t)strtoull(size, NULL, 10), hs, sizeof(hs));
			printf("Cache size:   %s (%s bytes)\n", hs, size);
		}
		const cJSON *t =
		    summary ? cJSON_GetObjectItemCaseSensitive(summary, "targets") : NULL;
		if (t)
			print_targets(t);
		else if (sum_s)
			printf("Summary:      %s (not valid JSON)\n", sum_s);
		printf("Layers:\n  %-2s %-48s %-10s %s\n", "#", "MEDIA TYPE", "SIZE", "DIGEST");
		for (size_t i = 0; i < img.manifest.n_layers; i++) {
			const struct oci_desc *l = &img.manifest.layers[i];
			cmd_cache_human((uint64_t)l->size, hs, sizeof(hs));
			printf("  %-2zu %-48s %-10s %s\n", i, l->media_type, hs, l->digest);
		}
		if (scanned) {
			cmd_cache_human(meta.bytes, hs, sizeof(hs));
			printf("Layer scan:   %" PRIu64 " files, %s, %" PRIu64 " entries\n",
			       meta.files, hs, meta.entries);
			if (cJSON_GetArraySize(kernels) > 0)
				print_kernels(kernels);
			print_groups(&meta, stdout);
		} else {
			printf("Layer scan:   skipped (layers over 64 MiB; use --entries)\n");
		}
		printf("Signatures:   %s\n", sigbuf);
	}
	rc = EXIT_OK;
	if (sigs.verified_tried && sigs.verify_rc)
		rc = EXIT_FAIL;
out:
	oci_sig_found_clear(&sigs.found);
	cJSON_Delete(summary);
	cJSON_Delete(kernels);
	cache_meta_clear(&meta);
	oci_image_clear(&img);
	oci_repo_free(repo);
	oci_ref_clear(&ref);
	return rc;
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
    "Usage: gkm cache verify REF --key PUBLIC.pem [--key ...] [-o json] [flags]\n\n"
    "Accept the image when at least one of its signatures (simple signing or\n"
    "sigstore bundle) verifies with one of the keys; exit 1 with the reason "
    "otherwise.\n\n" REGISTRY_HELP;

static const struct option verify_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"key", required_argument, 0, CLI_OPT_KEY},
    {"output", required_argument, 0, 'o'},
    {0, 0, 0, 0},
};

static int cache_verify_cmd(struct cli *c, int argc, char **argv)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct oci_desc desc = {0};
	struct sig_state s = {0};
	int rc = 0;
	if (optind + 1 != argc || c->r.nkeys == 0) {
		rc = cli_usage_error(c->cmd, "want one image reference and at least one --key");
		goto out;
	}
	if ((rc = cmd_cache_open_resolved(c, argv[optind], &ref, &repo, &desc)))
		goto out;
	sig_state_check(c, repo, desc.digest, &s);
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

/* ---- extract -------------------------------------------------------------- */

static const char extract_usage[] =
    "Usage: gkm cache extract REF DIR [--key FILE]... [flags]\n"
    "       gkm cache extract REF --store ROOT [--key FILE]... [flags]\n\n"
    "Pull the image (layers streamed, digests checked while reading), extract it\n"
    "safely (no paths outside the tree, no devices, no setuid, size caps) into a\n"
    "new directory DIR, or into the content store at ROOT (one copy per digest: a\n"
    "digest already there is ready at once, nothing pulled). With --key the\n"
    "signature is verified first and nothing is extracted unless it verifies.\n\n"
    "  --key FILE            a trusted public key (PEM; repeatable)\n"
    "  --store ROOT          extract into the content store at ROOT\n\n" REGISTRY_HELP;

static int extract_flag(struct cli *c, int opt, const char *arg)
{
	if (opt != OPT_STORE)
		return 0;
	c->store_root = arg;
	return 1;
}

static int verify_before_extract(struct cli *c, struct oci_repo *repo, const char *digest)
{
	if (c->r.nkeys == 0)
		return 0;
	struct sig_state s;
	sig_state_check(c, repo, digest, &s);
	int rc = 0;
	if (s.rc) {
		fprintf(stderr, "%s: %s\n", c->cmd, oci_err_str(&s.err, s.rc));
		rc = -EIO;
	} else if (!s.verified_tried) {
		rc = -EINVAL;
	} else if (s.verify_rc) {
		fprintf(stderr, "%s: refusing %s: %s\n", c->cmd, digest,
		        s.verify_rc == -ENODATA ? "image is not signed" : s.verdict.reason);
		rc = s.verify_rc;
	} else {
		log_info("signature verified", "digest", digest, "by", s.verdict.reason);
	}
	oci_sig_found_clear(&s.found);
	return rc;
}

static int extract_to_store(struct cli *c, struct oci_repo *repo, const struct oci_ref *ref,
                            struct oci_image *img, const char *refstr)
{
	struct store *st = NULL;
	struct store_entry_info info = {0};
	struct oci_err e = {{0}};
	char path[PATH_MAX];
	int rc = store_open(c->store_root, &st);
	if (rc) {
		fprintf(stderr, "%s: cannot open store %s: %s\n", c->cmd, c->store_root,
		        strerror(-rc));
		return EXIT_FAIL;
	}
	/* by digest, a present entry needs no network at all (unless verifying) */
	const char *digest = ref->digest;
	if (!(digest && c->r.nkeys == 0 && store_lookup(st, digest, &info) == 0)) {
		rc = oci_repo_fetch_image(repo, oci_ref_reference(ref), c->platform, img, &e);
		if (rc) {
			rc = cmd_cache_fail(c->cmd, refstr, &e, rc);
			goto out;
		}
		digest = img->desc.digest;
		if (verify_before_extract(c, repo, img->top_digest)) {
			rc = EXIT_FAIL;
			goto out;
		}
		bool present = false;
		if ((rc = oci_pull_into_store(st, repo, img, NULL, &info, &present, &e))) {
			rc = cmd_cache_fail(c->cmd, refstr, &e, rc);
			goto out;
		}
		if (!present)
			log_info("extracted into the store", "digest", digest);
	}
	if (store_entry_path(st, digest, path, sizeof(path))) {
		rc = EXIT_FAIL;
		goto out;
	}
	char hs[32];
	cmd_cache_human(info.bytes, hs, sizeof(hs));
	printf("Ready %s at %s (%" PRIu64 " files, %s)\n", digest, path, info.files, hs);
	rc = EXIT_OK;
out:
	store_close(st);
	return rc;
}

int cmd_cache_pull_dir(struct cli *c, struct oci_repo *repo, const struct oci_ref *ref,
                       struct oci_image *img, const char *refstr, const char *dest,
                       struct extract_stats *stats_out)
{
	struct oci_err e = {{0}};
	struct extract *x = NULL;
	char tmp[PATH_MAX];
	int dfd = -1;
	int rc = oci_repo_fetch_image(repo, oci_ref_reference(ref), c->platform, img, &e);
	if (rc)
		return cmd_cache_fail(c->cmd, refstr, &e, rc);
	if (verify_before_extract(c, repo, img->top_digest))
		return EXIT_FAIL;
	struct stat st;
	if (lstat(dest, &st) == 0) {
		fprintf(stderr, "%s: %s already exists (extract wants a new directory)\n", c->cmd,
		        dest);
		return EXIT_FAIL;
	}
	struct extract_stats stats = {0};
	/* a layer a mirror sent wrong (-ESTALE): the tree is made again, from the
	 * next source */
	for (int tries = 0;; tries++) {
		/* extract beside dest, rename when complete: a half-extracted tree
		 * is never at dest */
		if ((size_t)snprintf(tmp, sizeof(tmp), "%s.partial-%d", dest, (int)getpid()) >=
		        sizeof(tmp) ||
		    mkdir(tmp, 0755) < 0 ||
		    (dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
			fprintf(stderr, "%s: cannot create %s: %s\n", c->cmd, tmp, strerror(errno));
			return EXIT_FAIL;
		}
		x = NULL;
		rc = extract_new(dfd, NULL, &x);
		if (rc == 0)
			rc = oci_pull_extract(repo, img, x, &e);
		if (rc == 0 && (rc = extract_finish(x)))
			oci_errf(&e, "%s", extract_error(x));
		if (x)
			extract_get_stats(x, &stats);
		extract_free(x);
		close(dfd);
		if (rc != -ESTALE || tries >= OCI_MIRRORS_MAX || fstree_remove(AT_FDCWD, tmp))
			break;
		log_warn("pull retried from the next source", "digest", img->desc.digest, "error",
		         oci_err_str(&e, rc));
	}
	if (rc == 0 && rename(tmp, dest) < 0) {
		rc = -errno;
		oci_errf(&e, "cannot rename %s to %s: %s", tmp, dest, strerror(errno));
	}
	if (rc) {
		/* remove our own partial tree; nothing was ever visible at dest */
		int rrc = fstree_remove(AT_FDCWD, tmp);
		fprintf(stderr, "%s: %s: %s\n", c->cmd, refstr, oci_err_str(&e, rc));
		if (rrc)
			fprintf(stderr, "%s: could not remove %s: %s\n", c->cmd, tmp,
			        strerror(-rrc));
		return EXIT_FAIL;
	}
	if (stats_out)
		*stats_out = stats;
	return EXIT_OK;
}

static int extract_to_dir(struct cli *c, struct oci_repo *repo, const struct oci_ref *ref,
                          struct oci_image *img, const char *refstr, const char *dest)
{
	struct extract_stats stats = {0};
	int rc = cmd_cache_pull_dir(c, repo, ref, img, refstr, dest, &stats);
	if (rc)
		return rc;
	char hs[32];
	cmd_cache_human(stats.bytes, hs, sizeof(hs));
	printf("Extracted %s@%s into %s (%" PRIu64 " files, %s)\n", refstr, img->desc.digest, dest,
	       stats.files, hs);
	return EXIT_OK;
}

static const struct option extract_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"key", required_argument, 0, CLI_OPT_KEY},
    {"store", required_argument, 0, OPT_STORE},
    {0, 0, 0, 0},
};

static int cache_extract_cmd(struct cli *c, int argc, char **argv)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct oci_image img = {0};
	int rc = 0;
	int want = c->store_root ? 1 : 2;
	if (argc - optind != want) {
		rc = cli_usage_error(c->cmd, c->store_root
		                                 ? "want one image reference with --store"
		                                 : "want an image reference and a directory");
		goto out;
	}
	if ((rc = cmd_cache_open_ref(c, argv[optind], false, &ref, &repo)))
		goto out;
	rc = c->store_root ? extract_to_store(c, repo, &ref, &img, argv[optind])
	                   : extract_to_dir(c, repo, &ref, &img, argv[optind], argv[optind + 1]);
out:
	oci_image_clear(&img);
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

/* ---- dispatch --------------------------------------------------------------- */

static const struct sub {
	const char *name;
	int (*run)(struct cli *c, int argc, char **argv); /* args from argv[optind] on */
	const char *summary;
	const char *usage;
	const struct option *opts;
	const char *shortopts;
	int (*own)(struct cli *c, int opt, const char *arg);
} subs[] = {
    {"build", cache_build_cmd, "package a Triton or vLLM cache directory into an image",
     build_usage, build_opts, "ht:o:", cmd_cache_build_flag},
    {"push", cache_push_cmd, "copy an image between registries and layout directories", push_usage,
     push_opts, "h", NULL},
    {"inspect", cache_inspect_cmd, "show targets, sizes, entries and signature state",
     inspect_usage, inspect_opts, "ho:", inspect_flag},
    {"sign", cache_sign_cmd, "sign an image (cosign simple signing or sigstore bundle)", sign_usage,
     sign_opts, "h", sign_flag},
    {"verify", cache_verify_cmd, "verify an image's signature against trusted keys", verify_usage,
     verify_opts, "ho:", NULL},
    {"extract", cache_extract_cmd, "pull, verify and safely extract an image", extract_usage,
     extract_opts, "h", extract_flag},
    {"keygen", cache_keygen_cmd, "make an ECDSA P-256 key pair for signing", keygen_usage,
     keygen_opts, "h", keygen_flag},
    {"capture", cmd_cache_capture, "run a warm-up command and package what it compiled",
     cmd_cache_capture_usage, cmd_cache_capture_opts, "+ht:o:", cmd_cache_capture_flag},
    {"merge", cmd_cache_merge, "one image from caches built for different GPUs",
     cmd_cache_merge_usage, cmd_cache_merge_opts, "ht:o:", cmd_cache_build_flag},
    {"promote", cmd_cache_promote, "sign a captured candidate and name it the cache's image",
     cmd_cache_promote_usage, cmd_cache_promote_opts, "ht:o:", cmd_cache_promote_flag},
};

/* Flags, defaults and the parse every subcommand shares, then its own code. */
static int run_sub(const struct sub *sub, int argc, char **argv)
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
		fprintf(f, "  %-8s %s\n", subs[i].name, subs[i].summary);
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
		if (strcmp(argv[1], subs[i].name) == 0)
			return run_sub(&subs[i], argc - 1, argv + 1);
	fprintf(stderr, "gkm cache: unknown command '%s'\n\n", argv[1]);
	cache_usage(stderr);
	return EXIT_USAGE;
}
