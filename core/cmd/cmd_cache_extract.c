/* gkm cache extract: pull, verify and safely extract an image into a new
 * directory or the content store. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cmd.h"
#include "cmd_cache.h"
#include "extract.h"
#include "fstree.h"
#include "log.h"
#include "oci_mirrors.h"
#include "oci_pull.h"
#include "oci_sig.h"
#include "progress.h"
#include "store.h"

/* ---- extract -------------------------------------------------------------- */

static const char extract_usage[] =
    "Usage: gkm cache extract REF DIR [--key FILE]... [flags]\n"
    "       gkm cache extract REF --store ROOT [--key FILE]... [flags]\n\n"
    "Pull the image (layers streamed, digests checked while reading), extract it\n"
    "safely (no paths outside the tree, no devices, no setuid, size caps) into a\n"
    "new directory DIR, or into the content store at ROOT (one copy per digest: a\n"
    "digest already there is ready at once, nothing pulled). With --key (or keyless\n"
    "trust) the signature is verified first and nothing is extracted unless it\n"
    "verifies.\n\n"
    "  --key FILE            a trusted public key (PEM; repeatable)\n"
    "  --store ROOT          extract into the content store at ROOT\n\n" CLI_KEYLESS_HELP
    "\n" REGISTRY_HELP;

static int extract_flag(struct cli *c, int opt, const char *arg)
{
	if (opt != OPT_STORE)
		return 0;
	c->store_root = arg;
	return 1;
}

static int verify_before_extract(struct cli *c, struct oci_repo *repo, const char *digest)
{
	if (!cli_registry_verifies(&c->r))
		return 0;
	struct cmd_cache_sigs s;
	cmd_cache_sig_check(c, repo, digest, &s);
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
	if (!(digest && !cli_registry_verifies(&c->r) && store_lookup(st, digest, &info) == 0)) {
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
		progress_begin("extract", PROGRESS_READ | PROGRESS_EXTRACTED, 1,
		               cmd_cache_layers_bytes(img));
		rc = oci_pull_into_store(st, repo, img, NULL, &info, &present, &e);
		progress_end(rc);
		if (rc) {
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
	progress_begin("extract", PROGRESS_READ | PROGRESS_EXTRACTED, 1,
	               cmd_cache_layers_bytes(img));
	/* a layer a mirror sent wrong (-ESTALE): the tree is made again, from the
	 * next source */
	for (int tries = 0;; tries++) {
		/* extract beside dest, rename when complete: a half-extracted tree
		 * is never at dest */
		if ((size_t)snprintf(tmp, sizeof(tmp), "%s.partial-%d", dest, (int)getpid()) >=
		        sizeof(tmp) ||
		    mkdir(tmp, 0755) < 0 ||
		    (dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
			int err = errno;
			progress_end(-err);
			fprintf(stderr, "%s: cannot create %s: %s\n", c->cmd, tmp, strerror(err));
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
	progress_end(rc);
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
    CLI_KEYLESS_OPTIONS,
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

const struct cmd_cache_sub cmd_cache_extract_sub = {
    .name = "extract",
    .run = cache_extract_cmd,
    .summary = "pull, verify and safely extract an image",
    .usage = extract_usage,
    .opts = extract_opts,
    .shortopts = "h",
    .own = extract_flag,
};
