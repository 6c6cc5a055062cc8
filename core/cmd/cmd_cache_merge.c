/* gkm cache merge: one cache image from caches built for different GPUs.
 * Triton names each kernel's directory by a hash of its source and target,
 * so the trees unite; the summary label of the result lists every target,
 * and each node's compat check picks the kernels for its own GPU. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_tree.h"
#include "cmd.h"
#include "cache_env.h"
#include "cmd_cache.h"
#include "fstree.h"

#define MERGE_MAX_INPUTS 16

const char cmd_cache_merge_usage[] =
    "Usage: gkm cache merge IMAGE IMAGE... -t REF [flags]\n\n"
    "Unite the caches of two or more images of the same format (built on different\n"
    "GPUs) into one image at REF, one layer, its summary label listing every\n"
    "target. A path the images hold with different contents is an error that names\n"
    "it: nothing is merged silently. With --key, every input must verify first.\n\n"
    "  -t, --tag REF           where to store the image (required)\n"
    "  --key FILE              a trusted public key the inputs must be signed with\n"
    "  --label KEY=VALUE       an extra config label (repeatable)\n"
    "  --source-date-epoch N   clamp file times and set the creation time to N\n"
    "  -o json                 print the result as JSON\n\n" REGISTRY_HELP;

const struct option cmd_cache_merge_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"tag", required_argument, 0, 't'},
    {"key", required_argument, 0, CLI_OPT_KEY},
    {"label", required_argument, 0, OPT_LABEL},
    {"source-date-epoch", required_argument, 0, OPT_SDE},
    {"output", required_argument, 0, 'o'},
    {0, 0, 0, 0},
};

/* Extract input i into ROOT/in-i and unite its cache into merged. */
static int add_input(struct cli *c, const char *refstr, const char *root, int i, const char *merged,
                     enum cache_format *fmt)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct oci_image img = {0};
	struct oci_err e = {{0}};
	char dir[PATH_MAX / 2 + 32], cache[PATH_MAX];
	int rc = cmd_cache_open_ref(c, refstr, false, &ref, &repo);
	if (rc)
		goto out;
	snprintf(dir, sizeof(dir), "%s/in-%d", root, i);
	if ((rc = cmd_cache_pull_dir(c, repo, &ref, &img, refstr, dir, NULL)))
		goto out;
	enum cache_format f = cache_format_of_labels(oci_config_labels(&img.config));
	if (f == CACHE_AUTO) {
		fprintf(stderr, "%s: %s is not a cache image (no cache labels)\n", c->cmd, refstr);
		rc = EXIT_FAIL;
		goto out;
	}
	if (*fmt != CACHE_AUTO && f != *fmt) {
		fprintf(stderr, "%s: %s is a %s cache, the images before it %s caches\n", c->cmd,
		        refstr, cache_format_name(f), cache_format_name(*fmt));
		rc = EXIT_FAIL;
		goto out;
	}
	*fmt = f;
	snprintf(cache, sizeof(cache), "%s/io.%s.cache", dir, cache_format_name(f));
	int urc = cache_tree_unite(cache, merged, refstr, &e);
	if (urc) {
		rc = cmd_cache_fail(c->cmd, "cannot merge", &e, urc);
		goto out;
	}
	int rrc = fstree_remove(AT_FDCWD, dir); /* its files are in merged now */
	if (rrc)
		fprintf(stderr, "%s: could not remove %s: %s\n", c->cmd, dir, strerror(-rrc));
	rc = 0;
out:
	oci_image_clear(&img);
	oci_repo_free(repo);
	oci_ref_clear(&ref);
	return rc;
}

int cmd_cache_merge(struct cli *c, int argc, char **argv)
{
	struct oci_ref ref = {0};
	struct oci_repo *repo = NULL;
	struct cache_build_result res = {0};
	struct oci_err e = {{0}};
	enum cache_format fmt = CACHE_AUTO;
	char root[PATH_MAX / 2] = "", merged[PATH_MAX];
	bool made = false;
	int rc;
	int n = argc - optind;
	if (n < 2 || n > MERGE_MAX_INPUTS || !c->tag_ref) {
		rc = cli_usage_error(c->cmd, "want two to %d images and -t REF", MERGE_MAX_INPUTS);
		goto out;
	}
	if ((rc = cmd_cache_open_ref(c, c->tag_ref, true, &ref, &repo)))
		goto out;
	if (ref.digest) {
		rc = cli_usage_error(c->cmd, "-t names a tag, not a digest ('%s')", c->tag_ref);
		goto out;
	}
	const char *tmp = getenv("TMPDIR");
	snprintf(root, sizeof(root), "%s/gkm-merge-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	made = mkdtemp(root) != NULL;
	snprintf(merged, sizeof(merged), "%s/merged", root);
	if (!made || mkdir(merged, 0755) < 0) {
		fprintf(stderr, "%s: cannot create a workspace: %s\n", c->cmd, strerror(errno));
		rc = EXIT_FAIL;
		goto out;
	}
	for (int i = 0; i < n; i++)
		if ((rc = add_input(c, argv[optind + i], root, i, merged, &fmt)))
			goto out;
	c->build.format = fmt;
	c->build.extra_labels = c->labels;
	c->build.platform = c->platform;
	int brc = cmd_cache_pack(merged, &c->build, cmd_cache_tree_bytes(merged), &res, &e);
	if (brc == 0)
		brc = cmd_cache_upload(&c->build, &res, repo, ref.tag, &e);
	if (brc) {
		rc = cmd_cache_fail(c->cmd, "cannot package", &e, brc);
		goto out;
	}
	cmd_cache_print_built(c, "Merged", &ref, &res, NULL, NULL);
	rc = EXIT_OK;
out:
	if (made) {
		int rrc = fstree_remove(AT_FDCWD, root);
		if (rrc)
			fprintf(stderr, "%s: could not remove %s: %s\n", c->cmd, root,
			        strerror(-rrc));
	}
	cache_build_result_clear(&res);
	oci_repo_free(repo);
	oci_ref_clear(&ref);
	return rc;
}
