/* gkm cache push: copy an image between registries and layout directories. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "cmd.h"
#include "cmd_cache.h"
#include "progress.h"

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
	/* between two registries each blob is read into a temporary file, then
	 * sent: its bytes pass twice; the total grows as manifests are read */
	progress_begin("push", PROGRESS_READ | PROGRESS_SENT | PROGRESS_PRESENT,
	               !sref.dir && !dref.dir ? 2 : 1, 0);
	int prc = oci_repo_copy_image(src, oci_ref_reference(&sref), dst, dref.tag, dg, &e);
	progress_end(prc);
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

const struct cmd_cache_sub cmd_cache_push_sub = {
    .name = "push",
    .run = cache_push_cmd,
    .summary = "copy an image between registries and layout directories",
    .usage = push_usage,
    .opts = push_opts,
    .shortopts = "h",
};
