#include "bundle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "embedded.h"

#define BUNDLE_MAX_FILE (1u << 20)
#define BUNDLE_MAX_FILES 256

static bool valid_file_name(const char *name)
{
	size_t n = strlen(name);
	if (n < 5 || n > 68 || strcmp(name + n - 4, ".lua") != 0 || name[0] == '.')
		return false;
	for (size_t i = 0; i < n - 4; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return false;
	}
	return strstr(name, "..") == NULL;
}

static int cmp_files(const void *a, const void *b)
{
	return strcmp(((const struct bundle_file *)a)->name, ((const struct bundle_file *)b)->name);
}

const struct bundle_file *bundle_get(const struct bundle *b, const char *name)
{
	if (b->count == 0)
		return NULL;
	struct bundle_file key = {.name = (char *)name};
	return bsearch(&key, b->files, b->count, sizeof(key), cmp_files);
}

int bundle_put(struct bundle *b, const char *name, const char *source, size_t size, char *err,
               size_t errlen)
{
	if (!valid_file_name(name)) {
		snprintf(err, errlen,
		         "%s: not a valid policy file name (want NAME.lua, letters, digits, "
		         "'_', '-', '.')",
		         name);
		return -EINVAL;
	}
	if (size > BUNDLE_MAX_FILE) {
		snprintf(err, errlen, "%s: larger than %u bytes", name, BUNDLE_MAX_FILE);
		return -EFBIG;
	}
	if (memchr(source, '\0', size)) {
		snprintf(err, errlen, "%s: contains a NUL byte (binary content is not allowed)",
		         name);
		return -EINVAL;
	}
	char *src = malloc(size + 1);
	if (!src) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(src, source, size);
	src[size] = '\0';
	struct bundle_file *existing = (struct bundle_file *)bundle_get(b, name);
	if (existing) {
		free(existing->source);
		existing->source = src;
		existing->size = size;
		return 0;
	}
	if (b->count >= BUNDLE_MAX_FILES) {
		free(src);
		snprintf(err, errlen, "more than %d policy files", BUNDLE_MAX_FILES);
		return -E2BIG;
	}
	struct bundle_file *files = realloc(b->files, (b->count + 1) * sizeof(*files));
	char *nm = strdup(name);
	if (!files || !nm) {
		if (files)
			b->files = files;
		free(nm);
		free(src);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	b->files = files;
	b->files[b->count++] = (struct bundle_file){.name = nm, .source = src, .size = size};
	qsort(b->files, b->count, sizeof(*b->files), cmp_files);
	return 0;
}

void bundle_seal(struct bundle *b)
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
	for (size_t i = 0; i < b->count; i++) {
		char hdr[96];
		int n = snprintf(hdr, sizeof(hdr), "%s\n%zu\n", b->files[i].name, b->files[i].size);
		EVP_DigestUpdate(ctx, hdr, (size_t)n);
		EVP_DigestUpdate(ctx, b->files[i].source, b->files[i].size);
	}
	EVP_DigestFinal_ex(ctx, md, &mdlen);
	EVP_MD_CTX_free(ctx);
	int off = snprintf(b->digest, sizeof(b->digest), "sha256:");
	for (unsigned i = 0; i < mdlen && off + 2 < (int)sizeof(b->digest); i++)
		off += snprintf(b->digest + off, sizeof(b->digest) - (size_t)off, "%02x", md[i]);
}

void bundle_free(struct bundle *b)
{
	if (!b)
		return;
	for (size_t i = 0; i < b->count; i++) {
		free(b->files[i].name);
		free(b->files[i].source);
	}
	free(b->files);
	free(b);
}

int bundle_builtin(struct bundle **out)
{
	struct bundle *b = calloc(1, sizeof(*b));
	char err[256];
	if (!b)
		return -ENOMEM;
	for (const struct embedded_file *f = gkm_embedded; f->name; f++) {
		if (strncmp(f->name, "policies/", 9) != 0 || strchr(f->name + 9, '/'))
			continue;
		int rc = bundle_put(b, f->name + 9, f->data, f->size, err, sizeof(err));
		if (rc != 0) {
			bundle_free(b);
			return rc;
		}
	}
	bundle_seal(b);
	*out = b;
	return 0;
}

struct bundle *bundle_copy(const struct bundle *src)
{
	struct bundle *b = calloc(1, sizeof(*b));
	char err[256];
	if (!b)
		return NULL;
	for (size_t i = 0; i < src->count; i++) {
		if (bundle_put(b, src->files[i].name, src->files[i].source, src->files[i].size, err,
		               sizeof(err)) != 0) {
			bundle_free(b);
			return NULL;
		}
	}
	memcpy(b->digest, src->digest, sizeof(b->digest));
	return b;
}

static int read_file(int dirfd, const char *name, char **out, size_t *len, char *err, size_t errlen)
{
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	char *buf = NULL;
	int rc;
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", name, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > BUNDLE_MAX_FILE) {
		rc = -EINVAL;
		snprintf(err, errlen, "%s: not a regular file of at most %u bytes", name,
		         BUNDLE_MAX_FILE);
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (buf && got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			snprintf(err, errlen, "%s: read failed", name);
			goto out;
		}
		got += (size_t)r;
	}
	if (!buf) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	*out = buf;
	*len = got;
	buf = NULL;
	rc = 0;
out:
	free(buf);
	if (fd >= 0)
		close(fd);
	return rc;
}

int bundle_from_dir(const char *dir, struct bundle **out, char *err, size_t errlen)
{
	struct bundle *b = NULL;
	DIR *d = opendir(dir);
	int rc;
	if (!d) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot open policy directory: %s", dir, strerror(errno));
		return rc;
	}
	rc = bundle_builtin(&b);
	if (rc != 0) {
		snprintf(err, errlen, "cannot load the built-in policies");
		goto out;
	}
	size_t found = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		size_t n = strlen(de->d_name);
		if (n < 5 || strcmp(de->d_name + n - 4, ".lua") != 0)
			continue;
		char *src = NULL;
		size_t len = 0;
		rc = read_file(dirfd(d), de->d_name, &src, &len, err, errlen);
		if (rc == 0) {
			rc = bundle_put(b, de->d_name, src, len, err, errlen);
			free(src);
		}
		if (rc != 0)
			goto out;
		found++;
	}
	if (found == 0) {
		rc = -ENOENT;
		snprintf(err, errlen, "%s: no *.lua policy files", dir);
		goto out;
	}
	bundle_seal(b);
	*out = b;
	b = NULL;
out:
	bundle_free(b);
	closedir(d);
	return rc;
}

int bundle_from_map(const cJSON *data, struct bundle **out, char *err, size_t errlen)
{
	struct bundle *b = NULL;
	if (!cJSON_IsObject(data)) {
		snprintf(err, errlen, "policy data must be an object of file name to source");
		return -EINVAL;
	}
	int rc = bundle_builtin(&b);
	if (rc != 0) {
		snprintf(err, errlen, "cannot load the built-in policies");
		return rc;
	}
	const cJSON *f;
	cJSON_ArrayForEach(f, data)
	{
		size_t n = strlen(f->string);
		if (n < 5 || strcmp(f->string + n - 4, ".lua") != 0)
			continue;
		if (!cJSON_IsString(f)) {
			snprintf(err, errlen, "%s: value must be a string", f->string);
			bundle_free(b);
			return -EINVAL;
		}
		rc = bundle_put(b, f->string, f->valuestring, strlen(f->valuestring), err, errlen);
		if (rc != 0) {
			bundle_free(b);
			return rc;
		}
	}
	bundle_seal(b);
	*out = b;
	return 0;
}
