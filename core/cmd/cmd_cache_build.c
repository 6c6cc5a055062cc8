/* gkm cache build: package a cache directory into an image; the build
 * flags and the summary of a built image, which capture and merge share. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "cache_image.h"
#include "cli.h"
#include "cmd.h"
#include "cmd_cache.h"
#include "fstree.h"
#include "progress.h"

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

void cmd_cache_print_groups(const struct cache_meta *m, FILE *f)
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
		cmd_cache_print_groups(m, stdout);
	}
	free(summary);
	free(name);
	cJSON_Delete(extra);
}

uint64_t cmd_cache_tree_bytes(const char *dir)
{
	struct fstree_usage u = {0};
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	int rc = fstree_walk(fd, 0, &u);
	close(fd);
	return rc ? 0 : u.bytes;
}

int cmd_cache_pack(const char *dir, const struct cache_build_opts *o, uint64_t total,
                   struct cache_build_result *res, struct oci_err *e)
{
	progress_begin("pack", PROGRESS_PACKED, 1, total);
	int rc = cache_build_layer(dir, o, res, e);
	progress_end(rc);
	return rc;
}

int cmd_cache_upload(const struct cache_build_opts *o, struct cache_build_result *res,
                     struct oci_repo *repo, const char *tag, struct oci_err *e)
{
	uint64_t total = res->layer_size + (o->base ? cmd_cache_layers_bytes(o->base) : 0);
	progress_begin("upload", PROGRESS_READ | PROGRESS_SENT | PROGRESS_PRESENT, 1, total);
	int rc = cache_build_push(o, res, repo, tag, e);
	progress_end(rc);
	return rc;
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
	int brc = cmd_cache_pack(dir, &c->build, cmd_cache_tree_bytes(dir), &res, &e);
	if (brc == 0)
		brc = cmd_cache_upload(&c->build, &res, repo, ref.tag, &e);
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

const struct cmd_cache_sub cmd_cache_build_sub = {
    .name = "build",
    .run = cache_build_cmd,
    .summary = "package a Triton or vLLM cache directory into an image",
    .usage = build_usage,
    .opts = build_opts,
    .shortopts = "ht:o:",
    .own = cmd_cache_build_flag,
};
