#include "oci_blob.h"

#include "fsutil.h"
#include "progress.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct oci_blob_reader {
	const struct oci_blob_source *src;
	void *ctx;
	struct oci_hasher h;
	char want[OCI_DIGEST_MAX];
	int64_t size;
	char what[128];
	int rc; /* sticky: 0 while reading, 1 once verified, <0 on error */
	struct oci_err err;
};

int oci_blob_reader_new(const struct oci_blob_source *src, void *ctx, const char *digest,
                        int64_t expect_size, const char *what, struct oci_blob_reader **out)
{
	struct oci_blob_reader *r = calloc(1, sizeof(*r));
	if (!r) {
		src->close(ctx);
		return -ENOMEM;
	}
	int rc = oci_hasher_init(&r->h, digest);
	if (rc) {
		src->close(ctx);
		free(r);
		return rc;
	}
	r->src = src;
	r->ctx = ctx;
	snprintf(r->want, sizeof(r->want), "%s", digest);
	r->size = expect_size;
	snprintf(r->what, sizeof(r->what), "%s", what ? what : "blob");
	*out = r;
	return 0;
}

static ssize_t fail(struct oci_blob_reader *r, int rc)
{
	if (r->src->failed)
		rc = r->src->failed(r->ctx, rc, &r->err);
	r->rc = rc;
	return rc;
}

ssize_t oci_blob_read(struct oci_blob_reader *r, void *buf, size_t len)
{
	if (r->rc < 0)
		return r->rc;
	if (r->rc == 1)
		return 0;
	ssize_t n = r->src->read(r->ctx, buf, len, &r->err);
	if (n < 0) {
		oci_err_prefix(&r->err, "%s %s", r->what, r->want);
		return fail(r, (int)n);
	}
	if (n > 0) {
		if (r->size >= 0 && r->h.bytes + (uint64_t)n > (uint64_t)r->size) {
			oci_errf(&r->err,
			         "%s %s is longer than the %" PRId64 " bytes its descriptor says",
			         r->what, r->want, r->size);
			return fail(r, -EFBIG);
		}
		oci_hasher_update(&r->h, buf, (size_t)n);
		progress_add(PROGRESS_READ, (uint64_t)n, 0);
		return n;
	}
	if (r->size >= 0 && r->h.bytes != (uint64_t)r->size) {
		oci_errf(&r->err, "%s %s is truncated: got %" PRIu64 " of %" PRId64 " bytes",
		         r->what, r->want, r->h.bytes, r->size);
		return fail(r, -EPIPE);
	}
	char got[OCI_DIGEST_MAX];
	if (oci_hasher_final(&r->h, got)) {
		oci_errf(&r->err, "%s %s: hashing failed", r->what, r->want);
		return fail(r, -EIO);
	}
	if (strcmp(got, r->want) != 0) {
		oci_errf(&r->err, "%s digest mismatch: expected %s, content is %s", r->what,
		         r->want, got);
		return fail(r, -EBADMSG);
	}
	r->rc = 1;
	return 0;
}

int oci_blob_drain(struct oci_blob_reader *r)
{
	char buf[65536];
	for (;;) {
		ssize_t n = oci_blob_read(r, buf, sizeof(buf));
		if (n <= 0)
			return (int)n;
	}
}

const char *oci_blob_error(const struct oci_blob_reader *r)
{
	return oci_err_str(&r->err, r->rc < 0 ? r->rc : -EIO);
}

uint64_t oci_blob_bytes(const struct oci_blob_reader *r)
{
	return r->h.bytes;
}

void oci_blob_close(struct oci_blob_reader *r)
{
	if (!r)
		return;
	r->src->close(r->ctx);
	oci_hasher_free(&r->h);
	free(r);
}

static ssize_t reader_rd(void *ctx, void *buf, size_t len)
{
	return oci_blob_read(ctx, buf, len);
}

int oci_blob_slurp(struct oci_blob_reader *r, size_t max, char **out, size_t *len,
                   struct oci_err *err)
{
	int rc;
	if (r->size >= 0 && (uint64_t)r->size > max) {
		oci_errf(err, "%s %s is %" PRId64 " bytes, more than the %zu accepted", r->what,
		         r->want, r->size, max);
		rc = -EFBIG;
	} else {
		rc = fsutil_slurp(reader_rd, r, max, r->size >= 0 ? (size_t)r->size : 0, out, len);
		if (rc == -EFBIG)
			oci_errf(err, "%s %s is more than the %zu bytes accepted", r->what, r->want,
			         max);
		else if (rc < 0)
			oci_errf(err, "%s", oci_blob_error(r));
	}
	oci_blob_close(r);
	return rc;
}

ssize_t oci_fd_read(void *ctx, void *buf, size_t len)
{
	int fd = (int)(intptr_t)ctx;
	for (;;) {
		ssize_t n = read(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		return n < 0 ? -errno : n;
	}
}

static ssize_t fd_read(void *ctx, void *buf, size_t len, struct oci_err *e)
{
	ssize_t n = oci_fd_read(ctx, buf, len);
	if (n < 0)
		oci_errf(e, "read: %s", strerror((int)-n));
	return n;
}

static void fd_close(void *ctx)
{
	close((int)(intptr_t)ctx);
}

const struct oci_blob_source oci_blob_fd_source = {fd_read, fd_close, NULL};
