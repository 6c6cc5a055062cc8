/* The ask for a cache a pod could not get because the agent evicted it
 * from the store (cache_view.h, "wanted"). */
#include "cache_view.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

static int wanted_path(const char *run_dir, const char *ns, const char *name, char *dir, char *path)
{
	int rc = cache_view_dir(dir, PATH_MAX, run_dir, "usage", ns, name);
	if (rc)
		return rc;
	int n = snprintf(path, PATH_MAX, "%s/%s", dir, CACHE_VIEW_WANTED);
	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

int cache_view_want(const char *run_dir, const char *ns, const char *name)
{
	char dir[PATH_MAX], path[PATH_MAX];
	int rc = wanted_path(run_dir, ns, name, dir, path);
	if (rc || (rc = fsutil_mkdirs(dir, 0755)))
		return rc;
	int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	/* an existing file: its time is the ask */
	rc = futimens(fd, NULL) == 0 ? 0 : -errno;
	close(fd);
	return rc;
}

int cache_view_wanted_at(const char *run_dir, const char *ns, const char *name, int64_t *at)
{
	char dir[PATH_MAX], path[PATH_MAX];
	struct stat st;
	int rc = wanted_path(run_dir, ns, name, dir, path);
	if (rc)
		return rc;
	if (lstat(path, &st) != 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	*at = (int64_t)st.st_mtim.tv_sec;
	return 0;
}
