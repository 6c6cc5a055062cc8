#include "jsonfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int jsonfile_parse(const char *name, const char *buf, size_t len, cJSON **out, char *err,
                   size_t errlen)
{
	const char *end = NULL;
	cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
	if (!j) {
		size_t off = end && end >= buf ? (size_t)(end - buf) : 0, line = 1, col = 1;
		for (size_t i = 0; i < off && i < len; i++) {
			if (buf[i] == '\n') {
				line++;
				col = 1;
			} else {
				col++;
			}
		}
		snprintf(err, errlen, "%s: invalid JSON at line %zu, column %zu", name, line, col);
		return -EINVAL;
	}
	*out = j;
	return 0;
}

int jsonfile_read(const char *path, cJSON **out, char *err, size_t errlen)
{
	int fd = strcmp(path, "-") == 0 ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int rc = 0;
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		return rc;
	}
	for (;;) {
		if (len == cap) {
			if (cap >= JSONFILE_MAX) {
				rc = -EFBIG;
				snprintf(err, errlen, "%s: larger than %u bytes", path,
				         JSONFILE_MAX);
				goto out;
			}
			cap = cap ? cap * 2 : 65536;
			char *nb = realloc(buf, cap);
			if (!nb) {
				rc = -ENOMEM;
				snprintf(err, errlen, "%s: out of memory", path);
				goto out;
			}
			buf = nb;
		}
		ssize_t r = read(fd, buf + len, cap - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = -errno;
			snprintf(err, errlen, "%s: read failed: %s", path, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	rc = jsonfile_parse(path, buf ? buf : "", len, out, err, errlen);
out:
	free(buf);
	if (fd != STDIN_FILENO)
		close(fd);
	return rc;
}
