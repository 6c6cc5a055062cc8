#include "cache_misses.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_view.h"
#include "fsutil.h"

#define META_MAX (64u << 10) /* a kernel's metadata JSON is read up to this */

/* A directory beneath dir, without following links; -1 when there is none. */
static int open_dir(int dir, const char *name)
{
	if (dir < 0)
		return -1;
	return openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static bool has_dir(int dir, const char *name)
{
	struct stat st;
	return dir >= 0 && fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

static void add_name(struct cache_misses *m, const char *name)
{
	if (m->nnames < CACHE_MISSES_NAMES)
		snprintf(m->names[m->nnames++], sizeof(m->names[0]), "%s", name);
}

/* "add_kernel (cuda 90)" from a kernel directory's metadata, else the
 * directory's own name. */
static void kernel_name(int kdir, const char *hash, char *out, size_t len)
{
	snprintf(out, len, "%.40s", hash);
	DIR *d = fdopendir(dup(kdir));
	struct dirent *e;
	if (!d)
		return;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0 ||
		    strncmp(e->d_name, "__grp__", 7) == 0)
			continue;
		int fd = openat(kdir, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		char *buf = NULL;
		size_t n = 0;
		struct stat st;
		if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
		                fsutil_read_fd(fd, META_MAX, &buf, &n) != 0))
			n = 0;
		if (fd >= 0)
			close(fd);
		cJSON *j = n > 0 ? cJSON_ParseWithLength(buf, n) : NULL;
		free(buf);
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "target");
		const cJSON *be = cJSON_GetObjectItemCaseSensitive(t, "backend");
		const cJSON *arch = cJSON_GetObjectItemCaseSensitive(t, "arch");
		char a[32] = "";
		if (cJSON_IsNumber(arch))
			snprintf(a, sizeof(a), " %d", (int)arch->valuedouble);
		else if (cJSON_IsString(arch))
			snprintf(a, sizeof(a), " %.24s", arch->valuestring);
		snprintf(out, len, "%.*s%s%s%s%s", (int)(l - 5 > 96 ? 96 : l - 5), e->d_name,
		         cJSON_IsString(be) ? " (" : "", cJSON_IsString(be) ? be->valuestring : "",
		         cJSON_IsString(be) ? a : "", cJSON_IsString(be) ? ")" : "");
		cJSON_Delete(j);
		break;
	}
	closedir(d);
}

/* Each directory of upper's dir that lower's dir lacks: one miss, named by
 * name (NULL: the kernel's metadata). */
static int walk(int upper, int lower, const char *prefix, struct cache_misses *m, unsigned *read)
{
	int ud = open_dir(upper, ".");
	if (ud < 0)
		return errno == ENOENT ? 0 : -errno;
	DIR *d = fdopendir(ud);
	if (!d) {
		int rc = -errno;
		close(ud);
		return rc;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (++*read > CACHE_MISSES_WALK_MAX) {
			m->truncated = 1;
			break;
		}
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
		    strncmp(e->d_name, "tmp.", 4) == 0 || !has_dir(dirfd(d), e->d_name) ||
		    has_dir(lower, e->d_name))
			continue;
		m->kernels++;
		if (m->nnames >= CACHE_MISSES_NAMES)
			continue;
		char name[160];
		if (prefix) {
			snprintf(name, sizeof(name), "%s %.40s", prefix, e->d_name);
		} else {
			int kd = open_dir(dirfd(d), e->d_name);
			snprintf(name, sizeof(name), "%.40s", e->d_name);
			if (kd >= 0) {
				kernel_name(kd, e->d_name, name, sizeof(name));
				close(kd);
			}
		}
		add_name(m, name);
	}
	closedir(d);
	return 0;
}

/* upper/<a>/<b>, lower/<a>/<b>: walk() over them. */
static int walk_at(int upper, int lower, const char *a, const char *b, const char *prefix,
                   struct cache_misses *m, unsigned *read)
{
	int fds[4] = {open_dir(upper, a), open_dir(lower, a), -1, -1};
	if (b) {
		fds[2] = open_dir(fds[0], b);
		fds[3] = open_dir(fds[1], b);
	}
	int u = b ? fds[2] : fds[0], l = b ? fds[3] : fds[1];
	int rc = u >= 0 ? walk(u, l, prefix, m, read) : 0;
	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return rc;
}

int cache_misses_count(int upper, int lower, struct cache_misses *out)
{
	unsigned read = 0;
	memset(out, 0, sizeof(*out));
	int rc = walk_at(upper, lower, "io.triton.cache", NULL, NULL, out, &read);
	if (!rc)
		rc = walk_at(upper, lower, "io.vllm.cache", "torch_compile_cache", "vllm", out,
		             &read);
	return rc;
}

int cache_misses_of_volume(const char *root, const char *ns, const char *name, const char *digest,
                           const char *own, struct cache_misses *out)
{
	int lower = -1, rc = 0;
	char *path = NULL;
	if (digest && (rc = cache_view_open_data(root, ns, name, digest, &lower, &path, NULL, 0)))
		return rc;
	free(path);
	int fd = open(own, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	rc = fd < 0 ? -errno : cache_misses_count(fd, lower, out);
	if (fd >= 0)
		close(fd);
	if (lower >= 0)
		close(lower);
	return rc;
}

bool cache_misses_json(const struct cache_misses *m, cJSON *o)
{
	if (!cJSON_AddNumberToObject(o, "misses", m->kernels))
		return false;
	cJSON *names = m->nnames ? cJSON_AddArrayToObject(o, "missedKernels") : NULL;
	if (m->nnames && !names)
		return false;
	for (size_t i = 0; i < m->nnames; i++)
		if (!cJSON_AddItemToArray(names, cJSON_CreateString(m->names[i])))
			return false;
	return true;
}
