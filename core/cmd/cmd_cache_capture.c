/* gkm cache capture: run a warm-up command against a cache directory (fresh,
 * or a base image's cache overlaid) and package what it compiled; gkm cache
 * promote: the trusted step that signs a candidate and names the image a
 * cache should use. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_capture.h"
#include "cache_tree.h"
#include "cmd.h"
#include "cache_env.h"
#include "cmd_cache.h"
#include "errbuf.h"
#include "fstree.h"
#include "gpu_sources.h"
#include "kube_client.h"
#include "kube_config.h"
#include "oci_image.h"

const char cmd_cache_capture_usage[] =
    "Usage: gkm cache capture -t REF [--base REF] [flags] -- COMMAND [ARG...]\n"
    "       gkm cache capture -t REF [--base REF] --from DIR [--from DIR...] [flags]\n\n"
    "Run COMMAND (a warm-up script) with its kernel cache pointed at a fresh\n"
    "directory, or at a base image's cache (an overlay as root, else a copy), then\n"
    "package what it compiled and store it at REF: on a base, by default only the\n"
    "files it added, as one more layer over the base's layers (which are reused, so\n"
    "only the new layer travels). TRITON_CACHE_DIR (format triton) or\n"
    "VLLM_CACHE_ROOT (format vllm; vLLM keeps torch.compile and its inductor and\n"
    "Triton caches under it) and GKM_CAPTURE_DIR name the directory. COMMAND's\n"
    "output goes to stderr. What it wrote is untrusted: only regular files are taken\n"
    "(no symlinks, devices, set-id bits), within the caps, unchanged while read,\n"
    "with kernels for the GPUs of this machine only. The image is a candidate:\n"
    "sign it with a trusted key (gkm cache promote) before any cache uses it.\n"
    "With --from, no command runs: the files were added elsewhere, in the cache\n"
    "directory of the upper layers of pods' writable volumes (DIR, e.g.\n"
    "<upper>/io.triton.cache); several are united, a path with two contents being\n"
    "a conflict that names it. Give --source-date-epoch so that captures of the\n"
    "same files on several nodes get one digest.\n\n"
    "  -t, --tag REF           where to store the image (required)\n"
    "  --base REF              start from this cache image\n"
    "  --squash                one layer holding the whole cache, base included\n"
    "  --format FMT            triton or vllm (default: the base's, else triton)\n"
    "  --gpu-file FILE         the GPUs the kernels must be for (gkm gpus -o json);\n"
    "                          default: the GPUs probed on this machine\n"
    "  --policy-dir DIR        compat policy overrides (default: built-in)\n"
    "  --max-files N           cap on files and directories captured (default 200000)\n"
    "  --max-bytes N           cap on bytes captured (default 8 GiB)\n"
    "  --workdir DIR           where the workspace is made (default $TMPDIR)\n"
    "  --from DIR              capture the files in DIR instead of running a command\n"
    "                          (repeatable)\n"
    "  --copy                  copy the base even as root (no overlay mount)\n"
    "  --settle-ms N           the time the cache must stay unchanged after COMMAND\n"
    "                          returns, or the capture is refused (default 1000)\n"
    "  --key FILE              sign the image with this private key\n"
    "  --passphrase-file FILE  passphrase of an encrypted key\n"
    "  --label KEY=VALUE       an extra config label (repeatable)\n"
    "  --source-date-epoch N   clamp file times and set the creation time to N\n"
    "  -o json                 print the result as JSON\n\n" REGISTRY_HELP;

const struct option cmd_cache_capture_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"tag", required_argument, 0, 't'},
    {"base", required_argument, 0, OPT_BASE},
    {"squash", no_argument, 0, OPT_SQUASH},
    {"format", required_argument, 0, OPT_FORMAT},
    {"gpu-file", required_argument, 0, OPT_GPU_FILE},
    {"policy-dir", required_argument, 0, OPT_POLICY_DIR},
    {"max-files", required_argument, 0, OPT_MAX_FILES},
    {"max-bytes", required_argument, 0, OPT_MAX_BYTES},
    {"workdir", required_argument, 0, OPT_WORKDIR},
    {"copy", no_argument, 0, OPT_COPY},
    {"from", required_argument, 0, OPT_FROM},
    {"source-date-epoch", required_argument, 0, OPT_SDE},
    {"settle-ms", required_argument, 0, OPT_SETTLE},
    {"key", required_argument, 0, CLI_OPT_KEY},
    {"passphrase-file", required_argument, 0, OPT_PASSFILE},
    {"label", required_argument, 0, OPT_LABEL},
    {"output", required_argument, 0, 'o'},
    {0, 0, 0, 0},
};

int cmd_cache_capture_flag(struct cli *c, int opt, const char *arg)
{
	unsigned long long v = 0;
	switch (opt) {
	case OPT_BASE:
		c->base_ref = arg;
		return 1;
	case OPT_SQUASH:
		c->squash = true;
		return 1;
	case OPT_COPY:
		c->copy = true;
		return 1;
	case OPT_FROM:
		if (c->nfrom == CMD_CACHE_MAX_FROM) {
			cli_usage_error(c->cmd, "at most %d --from", CMD_CACHE_MAX_FROM);
			return -1;
		}
		c->from[c->nfrom++] = arg;
		return 1;
	case OPT_SETTLE:
		if (cli_parse_u64(arg, 600000, &v)) {
			cli_usage_error(c->cmd, "invalid --settle-ms '%s' (0..600000)", arg);
			return -1;
		}
		c->settle_ms = v;
		return 1;
	case OPT_GPU_FILE:
		c->gpu_file = arg;
		return 1;
	case OPT_POLICY_DIR:
		c->policy_dir = arg;
		return 1;
	case OPT_WORKDIR:
		c->workdir = arg;
		return 1;
	case OPT_PASSFILE:
		c->passfile = arg;
		return 1;
	case OPT_MAX_FILES:
	case OPT_MAX_BYTES:
		if (cli_parse_u64(arg, 1ull << 50, &v) || v == 0) {
			cli_usage_error(c->cmd, "invalid --max-%s '%s' (a positive number)",
			                opt == OPT_MAX_FILES ? "files" : "bytes", arg);
			return -1;
		}
		*(opt == OPT_MAX_FILES ? &c->rules.max_files : &c->rules.max_bytes) = v;
		return 1;
	default:
		return cmd_cache_build_flag(c, opt, arg);
	}
}

/* The GPUs the captured kernels must be for: the file given, else a probe. */
static cJSON *load_gpus(struct cli *c)
{
	struct gpu_probe *p = NULL;
	char err[512] = "";
	int rc = c->gpu_file ? gpu_file_probe(c->gpu_file, &p, err, sizeof(err))
	                     : gpu_probe_auto(NULL, NULL, &p, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s: GPUs: %s\n", c->cmd, err[0] ? err : strerror(-rc));
		return NULL;
	}
	cJSON *doc = gpu_probe_to_json(p);
	gpu_probe_free(p);
	cJSON *gpus = doc ? cJSON_DetachItemFromObjectCaseSensitive(doc, "gpus") : NULL;
	cJSON_Delete(doc);
	return gpus;
}

/* Run the command with the cache variables set; its stdout goes to our
 * stderr so that -o json stays parseable. */
static int run_command(struct cli *c, char **argv, enum cache_format f, const char *dir)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "%s: cannot start %s: %s\n", c->cmd, argv[0], strerror(errno));
		return EXIT_FAIL;
	}
	if (pid == 0) {
		if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0 ||
		    setenv(f == CACHE_VLLM ? "VLLM_CACHE_ROOT" : "TRITON_CACHE_DIR", dir, 1) ||
		    setenv("GKM_CAPTURE_DIR", dir, 1))
			_exit(126);
		execvp(argv[0], argv);
		fprintf(stderr, "%s: cannot run %s: %s\n", c->cmd, argv[0], strerror(errno));
		_exit(127);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return EXIT_FAIL;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (WIFEXITED(st))
		fprintf(stderr, "%s: %s exited with status %d; nothing captured\n", c->cmd, argv[0],
		        WEXITSTATUS(st));
	else
		fprintf(stderr, "%s: %s was killed by signal %d; nothing captured\n", c->cmd,
		        argv[0], WTERMSIG(st));
	return EXIT_FAIL;
}

/* A --from directory, held open from the start: its last component opened
 * beneath its parent without following a link, and read from then on only
 * through that descriptor (as /proc/self/fd/N, which the kernel resolves to
 * the open directory itself, never by name again). What a pod wrote can
 * swap the name for a link at any time; the descriptor still names the
 * directory that was checked, and the name is checked again before anything
 * is pushed. */
struct held_dir {
	int parent, fd;
	struct stat st;
	const char *given; /* as the user (or the agent) named it */
	char name[NAME_MAX + 1];
	char path[32]; /* /proc/self/fd/N */
};

/* "X: a symlink (to 'T')" or "X: why", for a name that is not the
 * directory it should be. */
static void not_held(const struct held_dir *h, const char *why, struct oci_err *e)
{
	char t[PATH_MAX];
	ssize_t n = readlinkat(h->parent, h->name, t, sizeof(t) - 1);
	if (n >= 0) {
		t[n] = '\0';
		oci_errf(e,
		         "cannot capture %s: a symlink (to '%s')%s; a capture reads only the "
		         "directory it opened, never through a link",
		         h->given, t, why);
	} else {
		oci_errf(e, "cannot capture %s: %s", h->given,
		         why[0] ? why + 1 : "not a directory");
	}
}

static int hold_open(struct held_dir *h, const char *given, struct oci_err *e)
{
	char parent[PATH_MAX];
	size_t len = strlen(given);
	h->parent = h->fd = -1;
	h->given = given;
	while (len > 1 && given[len - 1] == '/')
		len--;
	if (len >= sizeof(parent)) {
		oci_errf(e, "cannot capture %s: path too long", given);
		return -ENAMETOOLONG;
	}
	memcpy(parent, given, len);
	parent[len] = '\0';
	char *slash = strrchr(parent, '/');
	const char *name = slash ? slash + 1 : parent;
	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
	    strlen(name) >= sizeof(h->name)) {
		oci_errf(e, "cannot capture %s: name the directory itself (not '.' or '..')",
		         given);
		return -EINVAL;
	}
	snprintf(h->name, sizeof(h->name), "%s", name);
	if (slash == parent)
		slash[1] = '\0'; /* "/x": the parent is "/" */
	else if (slash)
		*slash = '\0';
	h->parent = open(slash ? parent : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (h->parent < 0) {
		int rc = -errno;
		oci_errf(e, "cannot capture %s: %s", given, strerror(errno));
		return rc;
	}
	h->fd = openat(h->parent, h->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (h->fd < 0 || fstat(h->fd, &h->st) < 0) {
		int rc = -errno;
		char why[300];
		snprintf(why, sizeof(why), " %s", strerror(errno));
		not_held(h, errno == ELOOP || errno == ENOTDIR ? "" : why, e);
		return rc;
	}
	snprintf(h->path, sizeof(h->path), "/proc/self/fd/%d", h->fd);
	return 0;
}

/* The name still leads to the directory opened. */
static int hold_check(const struct held_dir *h, struct oci_err *e)
{
	struct stat now;
	if (fstatat(h->parent, h->name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
	    now.st_dev == h->st.st_dev && now.st_ino == h->st.st_ino && S_ISDIR(now.st_mode))
		return 0;
	not_held(h, " replaced it while it was captured", e);
	if (!strstr(e->msg, "symlink"))
		oci_errf(e, "cannot capture %s: it was moved or replaced while it was captured",
		         h->given);
	return -EPERM;
}

static void hold_close(struct held_dir *h)
{
	if (h->fd >= 0)
		close(h->fd);
	if (h->parent >= 0)
		close(h->parent);
	h->fd = h->parent = -1;
}

struct capture {
	struct held_dir held[CMD_CACHE_MAX_FROM];
	unsigned nheld;
	struct oci_ref bref, tref;
	struct oci_repo *brepo, *trepo;
	struct oci_image base;
	struct cache_capture_ws ws;
	bool ws_open;
	struct cache_meta added, whole;
	bool added_scanned; /* one --from, no base: its check is the scan */
	struct cache_build_result res;
	cJSON *gpus;
	char root[PATH_MAX / 2];
	char staged[PATH_MAX / 2 + 16];
};

static void capture_clear(struct capture *k)
{
	for (unsigned i = 0; i < k->nheld; i++)
		hold_close(&k->held[i]);
	/* a workspace still mounted is left alone: removing through the
	 * mount would be removing from the merged view */
	bool keep = k->ws_open && cache_capture_ws_close(&k->ws) != 0;
	if (!keep && k->root[0] && fstree_remove(AT_FDCWD, k->root))
		fprintf(stderr, "could not remove the workspace %s\n", k->root);
	cache_build_result_clear(&k->res);
	cache_meta_clear(&k->added);
	cache_meta_clear(&k->whole);
	cJSON_Delete(k->gpus);
	oci_image_clear(&k->base);
	oci_repo_free(k->brepo);
	oci_repo_free(k->trepo);
	oci_ref_clear(&k->bref);
	oci_ref_clear(&k->tref);
}

/* Extract the base into ROOT/base; *fmt from its labels; lower its cache. */
static int pull_base(struct cli *c, struct capture *k, enum cache_format *fmt, char *lower)
{
	char dir[PATH_MAX / 2 + 16];
	unsigned nkeys = c->r.nkeys; /* --key is the signing key here, not a trust anchor */
	int rc = cmd_cache_open_ref(c, c->base_ref, false, &k->bref, &k->brepo);
	if (rc)
		return rc;
	snprintf(dir, sizeof(dir), "%s/base", k->root);
	c->r.nkeys = 0;
	rc = cmd_cache_pull_dir(c, k->brepo, &k->bref, &k->base, c->base_ref, dir, NULL);
	c->r.nkeys = nkeys;
	if (rc)
		return rc;
	enum cache_format bf = cache_format_of_labels(oci_config_labels(&k->base.config));
	if (bf == CACHE_AUTO) {
		fprintf(stderr, "%s: %s is not a cache image (no cache labels)\n", c->cmd,
		        c->base_ref);
		return EXIT_FAIL;
	}
	if (*fmt != CACHE_AUTO && *fmt != bf) {
		fprintf(stderr, "%s: --format %s, but the base %s is a %s cache\n", c->cmd,
		        cache_format_name(*fmt), c->base_ref, cache_format_name(bf));
		return EXIT_USAGE;
	}
	*fmt = bf;
	if ((size_t)snprintf(lower, PATH_MAX, "%s/io.%s.cache", dir, cache_format_name(bf)) >=
	    PATH_MAX)
		return EXIT_FAIL;
	struct stat st;
	if (stat(lower, &st) != 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "%s: the base %s has no io.%s.cache directory\n", c->cmd,
		        c->base_ref, cache_format_name(bf));
		return EXIT_FAIL;
	}
	return 0;
}

/* Print a failure, naming each --from directory as it was given rather
 * than by the descriptor it is read through. */
static int capture_fail(struct cli *c, const struct capture *k, const char *what, struct oci_err *e,
                        int rc)
{
	for (unsigned i = 0; i < k->nheld; i++)
		errbuf_rename_path(e->msg, sizeof(e->msg), k->held[i].path, k->held[i].given);
	return cmd_cache_fail(c->cmd, what, e, rc);
}

/* Every --from directory is still where it was named. */
static int check_held(struct cli *c, const struct capture *k)
{
	struct oci_err e = {{0}};
	for (unsigned i = 0; i < k->nheld; i++) {
		int rc = hold_check(&k->held[i], &e);
		if (rc)
			return capture_fail(c, k, "nothing captured", &e, rc);
	}
	return 0;
}

/* What the image says besides the summary: how much was added, from where. */
static cJSON *capture_facts(const struct capture *k, const char *base_ref, size_t layers, bool json)
{
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return NULL;
	cJSON_AddNumberToObject(o, "addedFiles", (double)k->added.files);
	cJSON_AddNumberToObject(o, "addedBytes", (double)k->added.bytes);
	cJSON_AddItemToObject(o, "addedTargets", cJSON_Duplicate(k->added.targets, 1));
	if (base_ref) {
		cJSON_AddStringToObject(o, "base", base_ref);
		cJSON_AddStringToObject(o, "baseDigest", k->base.desc.digest);
	}
	cJSON_AddNumberToObject(o, "layers", (double)layers);
	if (json && k->res.files)
		cJSON_AddItemToObject(o, "addedPaths", cJSON_Duplicate(k->res.files, 1));
	return o;
}

/* The captured tree's two walks (the check, then the layer) must agree:
 * a file that appeared in between was written during the capture. */
static bool same_walk(const struct cache_meta *a, const struct cache_meta *b)
{
	return a->files == b->files && a->bytes == b->bytes && a->stamp == b->stamp;
}

/* --from: check each directory with the untrusted rules; several are
 * united into ROOT/added, where a path with two contents is a conflict. */
static int stage_from(struct cli *c, struct capture *k, enum cache_format fmt,
                      const struct cache_walk_rules *rules, const char **top)
{
	struct oci_err e = {{0}};
	/* one directory without a base is the tree packaged: its scan is kept
	 * as what was added instead of walking it again */
	bool keep = c->nfrom == 1 && !c->base_ref;
	for (unsigned i = 0; i < c->nfrom; i++) {
		struct cache_meta m;
		int rc =
		    cache_scan_dir(k->held[i].path, fmt, rules, true, keep ? &k->added : &m, &e);
		if (!keep)
			cache_meta_clear(&m);
		if (rc)
			return capture_fail(c, k, "nothing captured", &e, rc);
		k->added_scanned = keep;
	}
	if (c->nfrom == 1) {
		*top = k->held[0].path;
		return 0;
	}
	snprintf(k->staged, sizeof(k->staged), "%s/added", k->root);
	if (mkdir(k->staged, 0755) < 0) {
		fprintf(stderr, "%s: cannot create %s: %s\n", c->cmd, k->staged, strerror(errno));
		return EXIT_FAIL;
	}
	for (unsigned i = 0; i < c->nfrom; i++) {
		int rc = cache_tree_unite(k->held[i].path, k->staged, c->from[i], &e);
		if (rc) {
			fprintf(stderr, "%s: nothing captured: conflict: %s\n", c->cmd,
			        oci_err_str(&e, rc));
			return EXIT_FAIL;
		}
	}
	*top = k->staged;
	return 0;
}

/* Check the flags, open the target and the --from directories, learn the
 * GPUs and make the workspace. 0 or an exit code, the failure printed. */
static int capture_start(struct cli *c, struct capture *k, int argc)
{
	struct oci_err e = {{0}};
	int rc;
	if (!c->tag_ref || (c->nfrom == 0) == (optind >= argc))
		return cli_usage_error(c->cmd, "want -t REF and either a command to run or --from");
	if (c->r.nkeys > 1)
		return cli_usage_error(c->cmd, "one --key signs; give one");
	if ((rc = cmd_cache_open_ref(c, c->tag_ref, true, &k->tref, &k->trepo)))
		return rc;
	if (k->tref.digest)
		return cli_usage_error(c->cmd, "-t names a tag, not a digest ('%s')", c->tag_ref);
	/* the directories are opened before anything else happens, and only
	 * once (struct held_dir) */
	for (unsigned i = 0; i < c->nfrom; i++, k->nheld++) {
		int hrc = hold_open(&k->held[i], c->from[i], &e);
		if (hrc) {
			k->nheld++;
			return cmd_cache_fail(c->cmd, "nothing captured", &e, hrc);
		}
	}
	if (!(k->gpus = load_gpus(c)))
		return EXIT_FAIL;
	const char *tmp = c->workdir ? c->workdir : getenv("TMPDIR");
	snprintf(k->root, sizeof(k->root), "%s/gkm-capture-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(k->root)) {
		fprintf(stderr, "%s: cannot create a workspace in %s: %s\n", c->cmd,
		        tmp && *tmp ? tmp : "/tmp", strerror(errno));
		k->root[0] = '\0';
		return EXIT_FAIL;
	}
	return 0;
}

/* Stage the --from directories or run the command in the workspace, then
 * check what was added (k->added): the caps, some files, the GPUs' kernels.
 * 0 or an exit code, the failure printed. */
static int capture_added(struct cli *c, struct capture *k, char **cmd, enum cache_format fmt,
                         const char *lower, const struct cache_walk_rules *added_rules)
{
	struct oci_err e = {{0}};
	const char *top = NULL;
	int rc;
	if (c->nfrom &&
	    ((rc = check_held(c, k)) || (rc = stage_from(c, k, fmt, added_rules, &top))))
		return rc;
	char wsdir[PATH_MAX / 2 + 16];
	snprintf(wsdir, sizeof(wsdir), "%s/ws", k->root);
	int wrc = mkdir(wsdir, 0755) < 0 ? -errno : 0;
	if (wrc == 0)
		wrc = cache_capture_ws_open(wsdir, c->base_ref ? lower : NULL, top,
		                            geteuid() == 0 && !c->copy, &k->ws, &e);
	if (wrc)
		return capture_fail(c, k, "workspace", &e, wrc);
	k->ws_open = true;
	if (!c->nfrom && (rc = run_command(c, cmd, fmt, k->ws.cache)))
		return rc;
	if (k->added_scanned)
		rc = cache_scan_check_found(k->ws.added, &k->added, &e);
	else
		rc = cache_scan_dir(k->ws.added, fmt, added_rules, c->base_ref != NULL, &k->added,
		                    &e);
	if (rc)
		return capture_fail(c, k, "nothing captured", &e, rc);
	if (k->added.files == 0) {
		fprintf(stderr, "%s: %s added no files to the cache; nothing captured\n", c->cmd,
		        c->nfrom ? "the --from directories" : cmd[0]);
		return EXIT_FAIL;
	}
	if ((rc = cache_capture_check_targets(k->added.targets, k->gpus, c->policy_dir, &e)))
		return capture_fail(c, k, "nothing captured", &e, rc);
	/* a writer the command left running shows between the two walks */
	if (c->settle_ms) {
		struct timespec ts = {.tv_sec = c->settle_ms / 1000,
		                      .tv_nsec = (long)(c->settle_ms % 1000) * 1000000};
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	return 0;
}

/* Package what was added: one layer on the base's, or the whole tree in
 * one layer; then push it, unless the tree changed between the walks or a
 * --from directory moved. 0 or an exit code, the failure printed. */
static int capture_package(struct cli *c, struct capture *k, enum cache_format fmt,
                           const struct cache_walk_rules *added_rules, bool layered)
{
	struct oci_err e = {{0}};
	struct cache_build_opts o = c->build;
	struct cache_walk_rules whole_rules = c->rules;
	int rc;
	o.format = fmt;
	o.extra_labels = c->labels;
	o.platform = c->platform;
	/* the layer's first files and their digests, for conflict checks
	 * across candidates (only where the layer is what was added) */
	if (!c->base_ref || !c->squash)
		o.list_files = CACHE_CAPTURE_LISTED;
	if (layered) {
		if ((rc = cache_scan_dir(k->ws.cache, fmt, NULL, false, &k->whole, &e)))
			return capture_fail(c, k, "nothing captured", &e, rc);
		o.rules = added_rules;
		o.base = &k->base;
		o.base_repo = k->brepo;
		o.image_meta = &k->whole;
	} else {
		o.rules = &whole_rules;
	}
	const char *dir = layered ? k->ws.added : k->ws.cache;
	uint64_t total = strcmp(dir, k->ws.added) == 0 ? k->added.bytes : cmd_cache_tree_bytes(dir);
	if ((rc = cmd_cache_pack(dir, &o, total, &k->res, &e)))
		return capture_fail(c, k, "nothing captured", &e, rc);
	if (dir == k->ws.added && !same_walk(&k->added, &k->res.meta)) {
		fprintf(stderr,
		        "%s: nothing captured: the cache directory changed while it was captured "
		        "(%" PRIu64 " files, then %" PRIu64 "): something is still writing it\n",
		        c->cmd, k->added.files, k->res.meta.files);
		return EXIT_FAIL;
	}
	/* the last moment before anything leaves the machine */
	if (c->nfrom && (rc = check_held(c, k)))
		return rc;
	if ((rc = cmd_cache_upload(&o, &k->res, k->trepo, k->tref.tag, &e)))
		return cmd_cache_fail(c->cmd, "cannot push the capture", &e, rc);
	return 0;
}

int cmd_cache_capture(struct cli *c, int argc, char **argv)
{
	struct capture k = {0};
	enum cache_format fmt = c->build.format;
	char lower[PATH_MAX] = "";
	int rc = capture_start(c, &k, argc);
	if (rc || (c->base_ref && (rc = pull_base(c, &k, &fmt, lower))))
		goto out;
	if (fmt == CACHE_AUTO)
		fmt = CACHE_TRITON;
	/* what was added, checked before anything is packaged; in an upper
	 * layer, files only touched were copied up: they are left out */
	struct cache_walk_rules added_rules = c->rules;
	if (c->base_ref)
		added_rules.unchanged_from = lower;
	bool layered = c->base_ref && !c->squash;
	if ((rc = capture_added(c, &k, argv + optind, fmt, lower, &added_rules)) ||
	    (rc = capture_package(c, &k, fmt, &added_rules, layered)))
		goto out;
	size_t layers = layered ? k.base.manifest.n_layers + 1 : 1;
	cmd_cache_print_built(
	    c, "Captured", &k.tref, &k.res, layered ? &k.whole : NULL,
	    capture_facts(&k, c->base_ref, layers, c->output && strcmp(c->output, "json") == 0));
	rc = EXIT_OK;
	if (c->r.nkeys == 1) {
		char *name = oci_ref_name(&k.tref);
		char signref[PATH_MAX];
		snprintf(signref, sizeof(signref), "%s@%s", name ? name : "", k.res.digest);
		free(name);
		rc = cmd_cache_sign(c, signref);
	}
out:
	capture_clear(&k);
	return rc;
}

/* ---- promote ------------------------------------------------------------- */

const char cmd_cache_promote_usage[] =
    "Usage: gkm cache promote CANDIDATE --key PRIVATE.pem [-t REF] [--cache [NS/]NAME\n"
    "                         [--apply]]\n\n"
    "Make a captured candidate the cache: sign it (by digest) with a trusted key the\n"
    "cluster verifies with (--key, given by a person or CI: gkm never signs what it\n"
    "captured by itself), copied first to REF when -t is given, and print the\n"
    "spec.image the cache must name, with the kubectl command that sets it; with\n"
    "--apply, set it through the API server (a merge patch of spec.image).\n\n"
    "  --key FILE              the private signing key\n"
    "  --passphrase-file FILE  passphrase of an encrypted key\n"
    "  --bundle                sign with a sigstore bundle\n"
    "  -t, --tag REF           copy the candidate here first (a release tag)\n"
    "  --cache [NS/]NAME       the GKMCache (NS/NAME) or ClusterGKMCache (NAME)\n"
    "  --apply                 set the cache's spec.image (needs --cache)\n"
    "  --kubeconfig FILE       kubeconfig for --apply (default: in-cluster, else\n"
    "                          $KUBECONFIG)\n"
    "  -o json                 print the result as JSON\n\n" REGISTRY_HELP;

const struct option cmd_cache_promote_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"key", required_argument, 0, CLI_OPT_KEY},
    {"passphrase-file", required_argument, 0, OPT_PASSFILE},
    {"bundle", no_argument, 0, OPT_BUNDLE},
    {"tag", required_argument, 0, 't'},
    {"cache", required_argument, 0, OPT_CACHE},
    {"apply", no_argument, 0, OPT_APPLY},
    {"kubeconfig", required_argument, 0, OPT_KUBECONFIG},
    {"output", required_argument, 0, 'o'},
    {0, 0, 0, 0},
};

int cmd_cache_promote_flag(struct cli *c, int opt, const char *arg)
{
	switch (opt) {
	case OPT_PASSFILE:
		c->passfile = arg;
		return 1;
	case OPT_BUNDLE:
		c->bundle = true;
		return 1;
	case 't':
		c->tag_ref = arg;
		return 1;
	case OPT_CACHE:
		c->cache_name = arg;
		return 1;
	case OPT_APPLY:
		c->apply = true;
		return 1;
	case OPT_KUBECONFIG:
		c->kubeconfig = arg;
		return 1;
	default:
		return 0;
	}
}

/* Set spec.image of the GKMCache ns/name (ClusterGKMCache name when ns is
 * empty) with a merge patch: only that field changes. */
static int apply_image(struct cli *c, const char *ns, const char *name, const char *image)
{
	struct kube_config *cfg = NULL;
	struct kube_client *kc = NULL;
	struct kube_resource r;
	struct kube_error ke = {0};
	char err[512] = "", path[1024];
	char *body = NULL;
	cJSON *patch = cJSON_CreateObject();
	int rc = -ENOMEM;
	if (!patch ||
	    !cJSON_AddStringToObject(cJSON_AddObjectToObject(patch, "spec"), "image", image) ||
	    !(body = cJSON_PrintUnformatted(patch)))
		goto out;
	if ((rc = kube_config_load(c->kubeconfig, NULL, &cfg, err, sizeof(err))) ||
	    (rc = kube_client_new(cfg, NULL, &kc)))
		goto out;
	if ((rc = kube_resource_builtin("gkm.io/v1alpha1", ns[0] ? "GKMCache" : "ClusterGKMCache",
	                                &r)) ||
	    (rc = kube_resource_path(&r, ns, name, NULL, path, sizeof(path))))
		goto out;
	struct kube_request rq = {.method = "PATCH",
	                          .path = path,
	                          .content_type = "application/merge-patch+json",
	                          .body = body,
	                          .body_len = strlen(body)};
	if ((rc = kube_client_do(kc, &rq, NULL, &ke)))
		snprintf(err, sizeof(err), "%.500s", ke.message);
out:
	if (rc)
		fprintf(stderr, "%s: signed, but spec.image of %s%s%s was not set: %s\n", c->cmd,
		        ns, ns[0] ? "/" : "", name, err[0] ? err : strerror(-rc));
	kube_client_free(kc);
	kube_config_free(cfg);
	cJSON_Delete(patch);
	free(body);
	return rc ? EXIT_FAIL : 0;
}

int cmd_cache_promote(struct cli *c, int argc, char **argv)
{
	struct oci_ref ref = {0}, tref = {0};
	struct oci_repo *repo = NULL, *trepo = NULL;
	struct oci_desc desc = {0};
	struct oci_err e = {{0}};
	char *name = NULL, image[PATH_MAX];
	int rc;
	if (optind + 1 != argc || c->r.nkeys != 1) {
		rc = cli_usage_error(c->cmd, "want one candidate image and one --key");
		goto out;
	}
	if (c->apply && !c->cache_name) {
		rc = cli_usage_error(c->cmd, "--apply needs --cache");
		goto out;
	}
	if ((rc = cmd_cache_open_resolved(c, argv[optind], &ref, &repo, &desc)))
		goto out;
	if (c->tag_ref) {
		char dg[OCI_DIGEST_MAX];
		if ((rc = cmd_cache_open_ref(c, c->tag_ref, true, &tref, &trepo)))
			goto out;
		int crc = oci_repo_copy_image(repo, desc.digest, trepo, tref.tag, dg, &e);
		if (crc) {
			rc = cmd_cache_fail(c->cmd, c->tag_ref, &e, crc);
			goto out;
		}
		name = oci_ref_name(&tref);
	} else {
		name = oci_ref_name(&ref);
	}
	snprintf(image, sizeof(image), "%s@%s", name ? name : "", desc.digest);
	if ((rc = cmd_cache_sign(c, image)))
		goto out;
	char ns[256] = "", nm[256] = "";
	if (c->cache_name) {
		const char *slash = strchr(c->cache_name, '/');
		if (slash)
			snprintf(ns, sizeof(ns), "%.*s", (int)(slash - c->cache_name),
			         c->cache_name);
		snprintf(nm, sizeof(nm), "%s", slash ? slash + 1 : c->cache_name);
	}
	if (c->apply && (rc = apply_image(c, ns, nm, image)))
		goto out;
	if (strcmp(c->output, "json") == 0) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "candidate", argv[optind]);
		cJSON_AddBoolToObject(o, "applied", c->apply);
		cJSON_AddStringToObject(o, "image", image);
		cJSON_AddStringToObject(o, "digest", desc.digest);
		cJSON *p = cJSON_AddObjectToObject(o, "patch");
		cJSON_AddStringToObject(cJSON_AddObjectToObject(p, "spec"), "image", image);
		cli_print_json(o);
	} else {
		printf("Promoted %s\nspec.image: %s\n", image, image);
		if (c->apply)
			printf("Set spec.image of %s %s%s%s\n",
			       ns[0] ? "GKMCache" : "ClusterGKMCache", ns, ns[0] ? "/" : "", nm);
		else if (nm[0])
			printf("kubectl patch %s %s%s%s --type merge -p "
			       "'{\"spec\":{\"image\":\"%s\"}}'\n",
			       ns[0] ? "gkmcache" : "clustergkmcache", nm, ns[0] ? " -n " : "", ns,
			       image);
	}
	rc = EXIT_OK;
out:
	free(name);
	oci_desc_clear(&desc);
	oci_repo_free(repo);
	oci_repo_free(trepo);
	oci_ref_clear(&ref);
	oci_ref_clear(&tref);
	return rc;
}
