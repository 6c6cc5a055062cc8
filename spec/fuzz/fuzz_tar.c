/* Fuzz target: a whole layer (any bytes) through the extractor into a
 * fresh directory, plus the path and symlink rules on the first line of the
 * input. Whatever the input, nothing may be written outside the directory
 * and the process must not crash or leak. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "extract.h"
#include "fstree.h"

struct src {
	const uint8_t *p;
	size_t len, pos;
};

static ssize_t rd(void *ctx, void *buf, size_t len)
{
	struct src *s = ctx;
	size_t n = s->len - s->pos;
	if (n > len)
		n = len;
	if (n > 4096) /* uneven chunks reach more decoder states */
		n = 4096;
	memcpy(buf, s->p + s->pos, n);
	s->pos += n;
	return (ssize_t)n;
}

static void path_rules(const uint8_t *data, size_t size)
{
	char line[8192], out[4096];
	size_t n = size < sizeof(line) - 1 ? size : sizeof(line) - 1;
	memcpy(line, data, n);
	line[n] = '\0';
	char *target = strchr(line, '\n');
	if (target)
		*target++ = '\0';
	const char *rule;
	if (extract_clean_path(line, out, sizeof(out), &rule) == 0) {
		if (strstr(out, "..") == out || out[0] == '/')
			abort(); /* a clean path never starts by leaving the tree */
		if (target)
			(void)extract_symlink_inside(out, target);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	path_rules(data, size);
	static char base[256];
	if (!base[0]) {
		snprintf(base, sizeof(base), "%s/gkm-fuzz-tar.XXXXXX",
		         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
		if (mkdtemp(base) == NULL)
			abort();
	}
	int bfd = open(base, O_RDONLY | O_DIRECTORY);
	if (bfd < 0)
		abort();
	(void)fstree_remove(bfd, "d");
	if (mkdirat(bfd, "d", 0700) < 0)
		abort();
	int dfd = openat(bfd, "d", O_RDONLY | O_DIRECTORY);
	struct extract_limits lim;
	extract_limits_default(&lim);
	lim.max_total_bytes = 64 << 20;
	lim.max_entries = 10000;
	struct extract *x;
	if (extract_new(dfd, &lim, &x) == 0) {
		struct src s = {data, size, 0};
		if (extract_layer(x, rd, &s) == 0)
			(void)extract_finish(x);
		extract_free(x);
	}
	close(dfd);
	/* only "d" may exist next to it */
	DIR *dir = fdopendir(bfd);
	struct dirent *de;
	while ((de = readdir(dir)) != NULL)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, "d"))
			abort();
	closedir(dir);
	return 0;
}
