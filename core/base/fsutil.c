#include "fsutil.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fsutil_read_file(const char *path, size_t max, char **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsutil_read_fd(fd, max, out, len);
	close(fd);
	return rc;
}

int fsutil_slurp(ssize_t (*rd)(void *ctx, void *buf, size_t len), void *ctx, size_t max,
                 size_t hint, char **out, size_t *len)
{
	int rc = 0;
	size_t cap = hint && hint <= max ? hint + 1 : 8192;
	size_t n = 0;
	char *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	for (;;) {
		if (n + 1 >= cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				rc = -ENOMEM;
				goto out;
			}
			buf = nb;
			cap *= 2;
		}
		/* never more than one byte past max: enough to tell it is too big */
		size_t want = cap - n - 1, room = max - n;
		if (room < SIZE_MAX)
			room++;
		if (want > room)
			want = room;
		ssize_t k = rd(ctx, buf + n, want);
		if (k < 0) {
			rc = (int)k;
			goto out;
		}
		if (k == 0)
			break;
		n += (size_t)k;
		if (n > max) {
			rc = -EFBIG;
			goto out;
		}
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	buf = NULL;
out:
	free(buf);
	return rc;
}

static ssize_t fd_rd(void *ctx, void *buf, size_t len)
{
	for (;;) {
		ssize_t r = read(*(int *)ctx, buf, len);
		if (r >= 0 || errno != EINTR)
			return r < 0 ? -errno : r;
	}
}

int fsutil_read_fd(int fd, size_t max, char **out, size_t *len)
{
	/* streams too (a pipe, /dev/stdin): read until EOF, never past max */
	return fsutil_slurp(fd_rd, &fd, max, 0, out, len);
}

static int fsync_dir_of(const char *path)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = '\0';
	else if (slash)
		*slash = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) == 0 ? 0 : -errno;
	close(fd);
	return rc;
}

int fsutil_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

static int write_replace(const char *path, const void *data, size_t len, mode_t mode, bool durable)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return -errno;
	int rc = fsutil_write_all(fd, data, len);
	if (rc == 0 && durable && fsync(fd) != 0)
		rc = -errno;
	if (close(fd) != 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -errno;
	if (rc != 0) {
		unlink(tmp);
		return rc;
	}
	return durable ? fsync_dir_of(path) : 0;
}

int fsutil_write_atomic(const char *path, const void *data, size_t len, mode_t mode)
{
	return write_replace(path, data, len, mode, true);
}

int fsutil_write_replace(const char *path, const void *data, size_t len, mode_t mode)
{
	return write_replace(path, data, len, mode, false);
}

int fsutil_mkdirs(const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return -ENAMETOOLONG;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) != 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, mode) != 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int fsutil_append_line(const char *path, const char *line)
{
	size_t n = strlen(line);
	char *buf = malloc(n + 1);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, line, n);
	buf[n] = '\n';
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	int rc = 0;
	if (fd < 0)
		rc = -errno;
	else if (write(fd, buf, n + 1) != (ssize_t)(n + 1))
		rc = -EIO;
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}
