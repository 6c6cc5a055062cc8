#include "node_capture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_view.h"
#include "errbuf.h"
#include "fsutil.h"
#include "fstree.h"
#include "log.h"

#define CAPTURE_SOURCE_DATE "1" /* one date for every node: same files, same digest */
/* The child's descriptor of the upper layer, and the path that names it there. */
#define CAPTURE_UPPER_FD 3
#define CAPTURE_UPPER_PATH "/proc/self/fd/3"
#define CAPTURE_OUT_MAX (1u << 20)

bool node_capture_repository(const cJSON *cache, char *repo, size_t len)
{
	const cJSON *r = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cache, "spec"),
	                                     "capture"),
	    "repository");
	if (!cJSON_IsString(r) || !*r->valuestring)
		return false;
	if (repo)
		snprintf(repo, len, "%s", r->valuestring);
	return true;
}

bool node_capture_on_exit(const cJSON *cache)
{
	const cJSON *cap = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cache, "spec"), "capture");
	return node_capture_repository(cache, NULL, 0) &&
	       !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cap, "onPodExit"));
}

bool node_capture_namespace_allowed(const cJSON *cache, const char *ns)
{
	const char *own = obj_str(cache, "metadata.namespace");
	if (*own)
		return strcmp(own, ns) == 0;
	const cJSON *v;
	cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(
	                          cJSON_GetObjectItemCaseSensitive(
	                              cJSON_GetObjectItemCaseSensitive(cache, "spec"), "capture"),
	                          "namespaces"))
	{
		if (cJSON_IsString(v) && *ns && strcmp(v->valuestring, ns) == 0)
			return true;
	}
	return false;
}

bool node_capture_demanded(const char *root, const char *ns, const char *name, const cJSON *cache,
                           char **seen)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cache, "metadata"),
	                                     "annotations"),
	    NODE_CAPTURE_ANNOTATION);
	char dir[PATH_MAX], path[PATH_MAX + 16];
	size_t len = 0;
	if (!cJSON_IsString(v) || !*v->valuestring ||
	    (*seen && strcmp(*seen, v->valuestring) == 0) ||
	    cache_view_dir(dir, sizeof(dir), root, CACHE_VIEW_CAPTURES, ns, name) != 0)
		return false;
	snprintf(path, sizeof(path), "%s/.demand", dir);
	/* After a start: the value handled before it. */
	if (!*seen && fsutil_read_file(path, 4096, seen, &len) == 0 &&
	    strcmp(*seen, v->valuestring) == 0)
		return false;
	free(*seen);
	*seen = strdup(v->valuestring);
	if (fsutil_mkdirs(dir, 0700) != 0 ||
	    fsutil_write_atomic(path, v->valuestring, strlen(v->valuestring), 0600) != 0)
		log_warn("cannot record the capture asked for", "cache", name, "value",
		         v->valuestring);
	return true;
}

int node_capture_pending(const char *root, const char *ns, const char *name, char *path, size_t len)
{
	char dir[PATH_MAX], best[256] = "";
	long long best_t = 0;
	if (cache_view_dir(dir, sizeof(dir), root, CACHE_VIEW_CAPTURES, ns, name) != 0)
		return -ENOENT;
	DIR *d = opendir(dir);
	if (!d)
		return -ENOENT;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		const char *dot = strrchr(de->d_name, '.');
		if (de->d_name[0] == '.' || !dot || strlen(de->d_name) >= sizeof(best))
			continue;
		long long t = atoll(dot + 1);
		if (!best[0] || t < best_t) {
			best_t = t;
			snprintf(best, sizeof(best), "%s", de->d_name);
		}
	}
	closedir(d);
	if (!best[0])
		return -ENOENT;
	int n = snprintf(path, len, "%s/%s", dir, best);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int remove_path(const char *path)
{
	char parent[PATH_MAX];
	snprintf(parent, sizeof(parent), "%s", path);
	char *slash = strrchr(parent, '/');
	if (!slash || slash == parent)
		return -EINVAL;
	*slash = '\0';
	int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	int rc = fstree_remove(fd, slash + 1);
	close(fd);
	return rc;
}

void node_capture_discard(const char *path, const char *why)
{
	int rc = remove_path(path);
	log_info("removed a volume handed over for capture", "dir", path, "why", why, "error",
	         rc ? strerror(-rc) : "");
}

static int records_path(const char *root, const char *ns, const char *name, char *path, size_t len)
{
	char dir[PATH_MAX];
	int rc = cache_view_dir(dir, sizeof(dir), root, CACHE_VIEW_CAPTURES, ns, name);
	if (rc == 0 && (size_t)snprintf(path, len, "%s/.records.json", dir) >= len)
		rc = -ENAMETOOLONG;
	return rc;
}

cJSON *node_capture_records_load(const char *root, const char *ns, const char *name)
{
	char path[PATH_MAX + 16], *text = NULL;
	size_t len = 0;
	if (records_path(root, ns, name, path, sizeof(path)) != 0 ||
	    fsutil_read_file(path, 4u << 20, &text, &len) != 0)
		return NULL;
	cJSON *r = cJSON_Parse(text);
	free(text);
	if (cJSON_IsArray(r))
		return r;
	cJSON_Delete(r);
	return NULL;
}

void node_capture_records_save(const char *root, const char *ns, const char *name,
                               const cJSON *records)
{
	char path[PATH_MAX + 16];
	char *text = cJSON_PrintUnformatted(records);
	int rc = text ? records_path(root, ns, name, path, sizeof(path)) : -ENOMEM;
	if (rc == 0)
		rc = fsutil_write_atomic(path, text, strlen(text), 0600);
	cJSON_free(text);
	if (rc)
		log_warn("cannot keep the capture records", "cache", name, "error", strerror(-rc));
}

void node_capture_forget(const char *root, const char *ns, const char *name)
{
	char dir[PATH_MAX];
	if (cache_view_dir(dir, sizeof(dir), root, CACHE_VIEW_CAPTURES, ns, name) == 0 &&
	    access(dir, F_OK) == 0 && remove_path(dir) != 0)
		log_warn("cannot remove a deleted cache's captures", "dir", dir);
}

void node_capture_clear(struct node_capture *k)
{
	free(k->gpus_json);
	k->gpus_json = NULL;
	cJSON_Delete(k->pod);
	k->pod = NULL;
	cJSON_Delete(k->cache);
	k->cache = NULL;
	cJSON_Delete(k->record);
	k->record = NULL;
}

/* ---- the record ---- */

static cJSON *new_record(const struct node_capture *k)
{
	cJSON *rec = cJSON_CreateObject();
	char path[PATH_MAX + 16], *text = NULL, now[40];
	size_t len = 0;
	snprintf(path, sizeof(path), "%s/pod.json", k->dir);
	cJSON *pod = k->live                                          ? cJSON_Duplicate(k->pod, 1)
	             : fsutil_read_file(path, 4096, &text, &len) == 0 ? cJSON_Parse(text)
	                                                              : NULL;
	free(text);
	cJSON_AddItemToObject(rec, "pod", cJSON_IsObject(pod) ? pod : cJSON_CreateObject());
	if (pod && !cJSON_IsObject(pod))
		cJSON_Delete(pod);
	cache_view_rfc3339(time(NULL), now, sizeof(now));
	cJSON_AddStringToObject(rec, "capturedAt", now);
	return rec;
}

/* What the capture's refusal is about, from its message (the first
 * phrase found; the capture code words each rule's message). */
static const char *refusal_reason(const char *msg)
{
	static const struct {
		const char *needle, *reason;
	} table[] = {
	    {"device, not a regular file", "DeviceNode"},
	    {"not a regular file, directory or symlink", "NotARegularFile"},
	    {": a symlink (to", "Symlink"},
	    {"deleted from the base cache", "DeletedFile"},
	    {"set-user-ID or set-group-ID", "SetIDBit"},
	    {"(hard links)", "HardLink"},
	    {"cap (--max-files)", "CapExceeded"},
	    {"byte cap of", "CapExceeded"},
	    {"changed while it was captured", "StillWriting"},
	    {"moved or replaced while it was captured", "Replaced"},
	    {"other contents", "Conflict"},
	    {"cannot push", "PushFailed"},
	    {"GPU", "TargetMismatch"},
	};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strstr(msg, table[i].needle))
			return table[i].reason;
	return "CaptureRefused";
}

static void refuse(cJSON *rec, const char *reason, const char *msg)
{
	cJSON *r = cJSON_AddObjectToObject(rec, "refused");
	cJSON_AddStringToObject(r, "reason", reason);
	cJSON_AddStringToObject(r, "message", msg);
}

/* ---- the run ---- */

static int write_file(const char *dir, const char *name, const char *text, char *path, size_t len)
{
	snprintf(path, len, "%s/%s", dir, name);
	return fsutil_write_atomic(path, text, strlen(text), 0600);
}

/* The name of the cache directory in the upper layer (NULL when the pod
 * added none). Only a choice of name: whatever it is (a link the pod made),
 * the capture opens it beneath the upper layer without following links. */
static const char *cache_dir_in(int upper)
{
	static const char *const names[] = {"io.triton.cache", "io.vllm.cache"};
	struct stat st;
	for (size_t i = 0; i < 2; i++)
		if (fstatat(upper, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0)
			return names[i];
	return NULL;
}

/* Whether this process may mount (CAP_SYS_ADMIN): an agent that may not
 * lets the capture copy the base instead of overlaying it. */
static bool may_mount(void)
{
	char *text = NULL;
	size_t len = 0;
	bool yes = false;
	if (fsutil_read_file("/proc/self/status", 1 << 16, &text, &len) == 0) {
		const char *cap = strstr(text, "CapEff:");
		yes = cap && (strtoull(cap + 7, NULL, 16) & (1ull << 21));
	}
	free(text);
	return yes;
}

/* The candidate's tag: "candidate-" and the capture directory's name, in
 * the tag grammar. */
static void candidate_tag(const struct node_capture *k, char *tag, size_t len)
{
	const char *base = strrchr(k->dir, '/');
	char suffix[101];
	snprintf(suffix, sizeof(suffix), "%s", base ? base + 1 : "x");
	for (char *c = suffix; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
		      (*c >= '0' && *c <= '9') || *c == '-' || *c == '.' || *c == '_'))
			*c = '_';
	snprintf(tag, len, "%s:candidate-%s", k->repository, suffix);
}

/* Start argv with stdin empty, stdout and stderr into outp and errp, and
 * the upper layer's descriptor at CAPTURE_UPPER_FD. The daemon blocks the
 * signals its loop reads: the child gets none blocked and their default
 * actions, so that SIGTERM ends it. 0 or a positive errno. */
static int start_child(const char *const *argv, const char *outp, const char *errp, int upper,
                       pid_t *pid)
{
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_adddup2(&fa, upper, CAPTURE_UPPER_FD);
	posix_spawnattr_t at;
	sigset_t none, deflt;
	sigemptyset(&none);
	sigemptyset(&deflt);
	sigaddset(&deflt, SIGTERM);
	sigaddset(&deflt, SIGINT);
	sigaddset(&deflt, SIGHUP);
	posix_spawnattr_init(&at);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &deflt);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	extern char **environ;
	int rc = posix_spawn(pid, argv[0], &fa, &at, (char *const *)argv, environ);
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	return rc;
}

/* Wait for the child; a stopping agent ends it (nothing is pushed before
 * the layer is whole, and the manifest goes last). False when it was ended
 * so. */
static bool wait_child(const struct node_capture *k, pid_t pid, int *status)
{
	bool killed = false;
	for (;;) {
		pid_t w = waitpid(pid, status, WNOHANG);
		if (w == pid || (w < 0 && errno != EINTR))
			break;
		if (!killed && k->cancel && atomic_load(k->cancel)) {
			kill(pid, SIGTERM);
			killed = true;
		}
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	return !killed;
}

/* What the child said: 0 with *out its JSON when it succeeded, else the
 * last line of its errors in msg, naming the upper layer by where. */
static int child_result(bool ok, const char *outp, const char *errp, const char *where, cJSON **out,
                        char *msg, size_t msglen)
{
	char *text = NULL;
	size_t len = 0;
	if (fsutil_read_file(ok ? outp : errp, CAPTURE_OUT_MAX, &text, &len) != 0) {
		snprintf(msg, msglen, "gkm cache capture failed and said nothing");
		return -EIO;
	}
	if (ok) {
		*out = cJSON_Parse(text);
		free(text);
		if (!*out) {
			snprintf(msg, msglen, "gkm cache capture printed no JSON");
			return -EIO;
		}
		return 0;
	}
	/* the last line that says something */
	while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
		text[--len] = '\0';
	char *last = strrchr(text, '\n');
	const char *line = last ? last + 1 : text;
	const char *prefix = "gkm cache capture: ";
	if (!strncmp(line, prefix, strlen(prefix)))
		line += strlen(prefix);
	snprintf(msg, msglen, "%s", *line ? line : "gkm cache capture failed");
	/* the child names the upper layer by its descriptor: say where it is */
	errbuf_rename_path(msg, msglen, CAPTURE_UPPER_PATH, where);
	free(text);
	return -EPERM;
}

/* Run gkm cache capture; 0 with *out its JSON, else the last line of its
 * errors in msg. */
static int spawn_capture(struct node_capture *k, int upper, const char *where, const char *name,
                         const char *authfile, const char *gpufile, cJSON **out, char *msg,
                         size_t msglen)
{
	char exe[PATH_MAX], tag[PATH_MAX + 700], outp[PATH_MAX + 16], errp[PATH_MAX + 16], from[64];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		snprintf(msg, msglen, "cannot find the gkm binary: %s", strerror(errno));
		return -errno;
	}
	exe[n] = '\0';
	candidate_tag(k, tag, sizeof(tag));
	/* the child reaches the pod's files only through the agent's descriptor
	 * of the upper layer, never by a path the pod could redirect */
	snprintf(from, sizeof(from), "%s/%s", CAPTURE_UPPER_PATH, name);
	snprintf(outp, sizeof(outp), "%s/out.json", k->work);
	snprintf(errp, sizeof(errp), "%s/err.txt", k->work);
	const char *argv[32];
	int i = 0;
	argv[i++] = exe;
	argv[i++] = "cache";
	argv[i++] = "capture";
	argv[i++] = "-t";
	argv[i++] = tag;
	argv[i++] = "--base";
	argv[i++] = k->base;
	argv[i++] = "--from";
	argv[i++] = from;
	argv[i++] = "--gpu-file";
	argv[i++] = gpufile;
	argv[i++] = "--source-date-epoch";
	argv[i++] = CAPTURE_SOURCE_DATE;
	argv[i++] = "--workdir";
	argv[i++] = k->work;
	argv[i++] = "-o";
	argv[i++] = "json";
	if (!may_mount())
		argv[i++] = "--copy";
	if (authfile) {
		argv[i++] = "--authfile";
		argv[i++] = authfile;
	}
	argv[i] = NULL;
	pid_t pid;
	int rc = start_child(argv, outp, errp, upper, &pid);
	if (rc) {
		snprintf(msg, msglen, "cannot run gkm cache capture: %s", strerror(rc));
		return -rc;
	}
	int status = 0;
	if (!wait_child(k, pid, &status)) {
		snprintf(msg, msglen, "the agent stopped during the capture");
		return -ECANCELED;
	}
	return child_result(WIFEXITED(status) && WEXITSTATUS(status) == 0, outp, errp, where, out,
	                    msg, msglen);
}

static void copy_item(cJSON *to, const char *as, const cJSON *from, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(from, key);
	if (v)
		cJSON_AddItemToObject(to, as, cJSON_Duplicate(v, 1));
}

/* What a capture gave, where `kubectl describe` shows it. */
static void tell(const struct node_capture *k)
{
	const cJSON *r = cJSON_GetObjectItemCaseSensitive(k->record, "refused");
	char msg[1536], who[320];
	snprintf(who, sizeof(who), "pod %s/%s on %s", obj_str(k->record, "pod.namespace"),
	         obj_str(k->record, "pod.name"), obj_str(k->record, "pod.node"));
	if (r)
		snprintf(msg, sizeof(msg), "%s: not captured: %s", who, obj_str(r, "message"));
	else
		snprintf(
		    msg, sizeof(msg),
		    "%s: candidate %s@%s (%.0f files added), unsigned: gkm cache promote makes it "
		    "the cache",
		    who, k->repository, obj_str(k->record, "digest"),
		    cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(k->record, "files")));
	if (k->os && k->cache &&
	    k->os->ops->event(k->os, k->cache, r ? "Warning" : "Normal",
	                      r ? "CaptureRefused" : "CaptureCandidate", msg, NULL) != 0)
		log_warn("cannot record the capture's Event", "message", msg);
}

/* Remove the scratch directory. A capture ended by a signal leaves its
 * workspace's read-only overlay mounted (gkm cache capture mounts it at
 * ws/cache of a gkm-capture-XXXXXX directory of its --workdir): detached
 * first. */
static void remove_work(const char *work)
{
	char pattern[PATH_MAX + 32];
	glob_t g;
	if (remove_path(work) == 0)
		return;
	snprintf(pattern, sizeof(pattern), "%s/gkm-capture-*/ws/cache", work);
	if (glob(pattern, GLOB_NOSORT, NULL, &g) == 0) {
		for (size_t i = 0; i < g.gl_pathc; i++)
			if (umount2(g.gl_pathv[i], MNT_DETACH | UMOUNT_NOFOLLOW) != 0 &&
			    errno != EINVAL)
				log_warn("cannot unmount a capture's workspace", "dir",
				         g.gl_pathv[i], "error", strerror(errno));
		globfree(&g);
	}
	if (remove_path(work) != 0)
		log_warn("cannot remove a capture's scratch directory", "dir", work);
}

/* The volume's upper layer, open (the directory is the agent's or the CSI
 * plugin's, never the pod's: the pod sees only the merged view). A live
 * volume with a size limit has it on its layer (csi/csi_layer.h). */
static int open_upper(const struct node_capture *k, char *upper, size_t len)
{
	snprintf(upper, len, "%s/upper", k->dir);
	int fd = open(upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		snprintf(upper, len, "%s/layer/upper", k->dir);
		fd = open(upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (fd < 0 || fd > CAPTURE_UPPER_FD)
		return fd;
	/* kept clear of the number it gets in the child, where dup2 onto
	 * itself would leave it close-on-exec */
	int high = fcntl(fd, F_DUPFD_CLOEXEC, CAPTURE_UPPER_FD + 1);
	close(fd);
	return high;
}

void node_capture_run(struct node_capture *k)
{
	char gpufile[PATH_MAX + 16], authfile[PATH_MAX + 16], msg[1024];
	struct pull_secret ps;
	memset(&ps, 0, sizeof(ps));
	cJSON *out = NULL;
	char where[PATH_MAX + 16];
	int upper = open_upper(k, where, sizeof(where));
	const char *name = upper >= 0 ? cache_dir_in(upper) : NULL;
	if (!name) {
		if (upper >= 0)
			close(upper);
		if (!k->live)
			node_capture_discard(k->dir,
			                     "the pod added nothing under the cache directory");
		return;
	}
	k->record = new_record(k);
	const char *pod_ns = obj_str(k->record, "pod.namespace");
	if (!node_capture_namespace_allowed(k->cache, pod_ns)) {
		snprintf(msg, sizeof(msg),
		         "pod %s/%s: its namespace is not one spec.capture.namespaces lists for "
		         "this cache; nothing pushed",
		         pod_ns, obj_str(k->record, "pod.name"));
		refuse(k->record, "NamespaceNotAllowed", msg);
		k->work[0] = '\0';
		goto out;
	}
	if (!mkdtemp(k->work)) {
		refuse(k->record, "CaptureFailed", strerror(errno));
		k->work[0] = '\0';
		goto out;
	}
	char host[sizeof(k->repository)];
	snprintf(host, sizeof(host), "%s", k->repository);
	host[strcspn(host, "/")] = '\0';
	if (k->secrets.names[0] && pull_secret_read(k->os, k->secrets.ns, k->secrets.names, host,
	                                            &ps, msg, sizeof(msg)) != 0) {
		refuse(k->record, "SecretUnreadable", msg);
		goto out;
	}
	/* no Secret: the daemon's own credentials only where they serve the
	 * cache's namespace, else none at all (an empty credentials file) */
	const char *auth = ps.auth_json ? ps.auth_json : k->secrets.global ? NULL : "{}";
	if (write_file(k->work, "gpus.json", k->gpus_json ? k->gpus_json : "{\"gpus\":[]}", gpufile,
	               sizeof(gpufile)) != 0 ||
	    (auth && write_file(k->work, "auth.json", auth, authfile, sizeof(authfile)) != 0)) {
		refuse(k->record, "CaptureFailed", "cannot write the capture's scratch files");
		goto out;
	}
	int rc = spawn_capture(k, upper, where, name, auth ? authfile : NULL, gpufile, &out, msg,
	                       sizeof(msg));
	if (rc == -ECANCELED) {
		/* not refused: the next agent captures it */
		cJSON_Delete(k->record);
		k->record = NULL;
		goto out;
	}
	if (rc) {
		refuse(k->record, refusal_reason(msg), msg);
		goto out;
	}
	copy_item(k->record, "digest", out, "digest");
	cJSON_AddStringToObject(k->record, "repository", k->repository);
	copy_item(k->record, "baseDigest", out, "baseDigest");
	copy_item(k->record, "files", out, "addedFiles");
	copy_item(k->record, "bytes", out, "addedBytes");
	copy_item(k->record, "targets", out, "addedTargets");
	/* the files as the capture itself read them: the agent opens nothing
	 * the pod wrote */
	copy_item(k->record, "paths", out, "addedPaths");
out:
	close(upper);
	cJSON_Delete(out);
	pull_secret_clear(&ps);
	if (k->work[0])
		remove_work(k->work);
	if (k->record)
		tell(k);
	if (!k->live && k->record)
		node_capture_discard(k->dir, cJSON_GetObjectItemCaseSensitive(k->record, "refused")
		                                 ? "refused"
		                                 : "captured");
}
