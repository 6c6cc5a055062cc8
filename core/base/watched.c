#include "watched.h"

#include <dirent.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsutil.h"

void watched_files_clear(struct watched_files *w)
{
	for (size_t i = 0; i < w->n; i++)
		free(w->f[i].data);
	free(w->f);
	w->f = NULL;
	w->n = 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct watched_file *)a)->name,
	              ((const struct watched_file *)b)->name);
}

static int add_file(struct watched_files *w, const char *path, const char *name, char *err,
                    size_t errlen)
{
	struct watched_file *f = &w->f[w->n];
	int rc = fsutil_read_file(path, WATCHED_MAX_FILE, &f->data, &f->len);
	if (rc == -EFBIG)
		snprintf(err, errlen, "%s: larger than %u bytes", path, WATCHED_MAX_FILE);
	else if (rc != 0)
		snprintf(err, errlen, "%s: %s", path, strerror(-rc));
	if (rc != 0)
		return rc;
	snprintf(f->name, sizeof(f->name), "%s", name);
	w->n++;
	return 0;
}

/* sha256 over parts, as hex into out. */
static int hash_parts(const void *const *parts, const size_t *lens, size_t n, char out[65])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char md[32];
	unsigned int mdlen = 0;
	if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
		EVP_MD_CTX_free(ctx);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		EVP_DigestUpdate(ctx, parts[i], lens[i]);
	EVP_DigestFinal_ex(ctx, md, &mdlen);
	EVP_MD_CTX_free(ctx);
	for (unsigned i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	return 0;
}

int watched_hash(const void *buf, size_t len, char out[65])
{
	return hash_parts(&buf, &len, 1, out);
}

static int hash_files(struct watched_files *w)
{
	/* name and length delimit each file, so no two sets hash alike */
	size_t n = 2 * w->n;
	const void **parts = calloc(n + 1, sizeof(*parts));
	size_t *lens = calloc(n + 1, sizeof(*lens));
	char(*heads)[300] = calloc(w->n + 1, sizeof(*heads));
	int rc = -ENOMEM;
	if (parts && lens && heads) {
		for (size_t i = 0; i < w->n; i++) {
			int hl = snprintf(heads[i], sizeof(heads[i]), "%s\n%zu\n", w->f[i].name,
			                  w->f[i].len);
			parts[2 * i] = heads[i];
			lens[2 * i] = (size_t)hl;
			parts[2 * i + 1] = w->f[i].data;
			lens[2 * i + 1] = w->f[i].len;
		}
		rc = hash_parts(parts, lens, n, w->digest);
	}
	free(parts);
	free(lens);
	free(heads);
	return rc;
}

int watched_read(const char *path, struct watched_files *out, char *err, size_t errlen)
{
	struct watched_files w = {0};
	struct stat st;
	DIR *d = NULL;
	int rc;
	if (stat(path, &st) != 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	w.f = calloc(S_ISDIR(st.st_mode) ? WATCHED_MAX_FILES : 1, sizeof(*w.f));
	if (!w.f)
		return -ENOMEM;
	if (!S_ISDIR(st.st_mode)) {
		const char *base = strrchr(path, '/');
		if ((rc = add_file(&w, path, base ? base + 1 : path, err, errlen)) != 0)
			goto fail;
	} else {
		if (!(d = opendir(path))) {
			rc = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(errno));
			goto fail;
		}
		struct dirent *de;
		while ((de = readdir(d))) {
			char p[4096];
			struct stat fst;
			if (de->d_name[0] == '.')
				continue;
			if ((size_t)snprintf(p, sizeof(p), "%s/%s", path, de->d_name) >=
			        sizeof(p) ||
			    stat(p, &fst) != 0 || !S_ISREG(fst.st_mode))
				continue;
			if (w.n == WATCHED_MAX_FILES) {
				rc = -E2BIG;
				snprintf(err, errlen, "%s: more than %d files", path,
				         WATCHED_MAX_FILES);
				goto fail;
			}
			if ((rc = add_file(&w, p, de->d_name, err, errlen)) != 0)
				goto fail;
		}
		closedir(d);
		d = NULL;
		qsort(w.f, w.n, sizeof(*w.f), by_name);
	}
	if ((rc = hash_files(&w)) != 0)
		goto fail;
	*out = w;
	return 0;
fail:
	if (d)
		closedir(d);
	watched_files_clear(&w);
	return rc;
}

int watched_digest(const char *path, char out[65], char *err, size_t errlen)
{
	struct watched_files w;
	int rc = watched_read(path, &w, err, errlen);
	if (rc != 0)
		return rc;
	memcpy(out, w.digest, 65);
	watched_files_clear(&w);
	return 0;
}
