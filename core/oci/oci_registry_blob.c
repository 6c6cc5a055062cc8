#include "oci_registry_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "progress.h"

/* ---- blobs ----------------------------------------------------------- */

struct stream {
	struct oci_registry *reg;
	struct xfer *x;
	char url[URL_MAX];
	char scope[512];
	char digest[OCI_DIGEST_MAX];
	uint64_t delivered;
	unsigned restarts;
};

static int stream_start(struct stream *s, struct oci_err *e)
{
	char range[64];
	struct req q = {.method = "GET", .stream = true, .follow = true, .up_fd = -1};
	if (s->delivered) {
		snprintf(range, sizeof(range), "bytes=%" PRIu64 "-", s->delivered);
		q.range = range;
	}
	int rc = reg_request(s->reg, &q, s->url, sizeof(s->url), s->scope, &s->x, e);
	if (rc)
		return rc;
	struct xfer *x = s->x;
	if (x->status == 404) {
		oci_errf(e, "not found in %s (HTTP 404)", s->reg->host);
		return -ENOENT;
	}
	if (x->status == 206 && s->delivered) {
		/* "bytes N-M/T": make sure it starts where we stopped */
		const char *p = x->content_range;
		if (strncasecmp(p, "bytes ", 6) == 0)
			p += 6;
		if (strtoull(p, NULL, 10) != s->delivered) {
			oci_errf(e,
			         "registry resumed at the wrong offset (Content-Range '%s', wanted "
			         "%" PRIu64 ")",
			         x->content_range, s->delivered);
			return -EPROTO;
		}
		return 0;
	}
	if (x->status == 200) {
		x->skip = s->delivered; /* no range support: drop what we already have */
		return 0;
	}
	reg_describe_status(x, "GET", s->url, e);
	return reg_status_errno(x->status);
}

static ssize_t stream_read(void *ctx, void *buf, size_t len, struct oci_err *e)
{
	struct stream *s = ctx;
	for (;;) {
		struct xfer *x = s->x;
		if (x && x->s_len > 0) {
			size_t n = len < x->s_len ? len : x->s_len;
			memcpy(buf, x->sbuf + x->s_off, n);
			x->s_off += n;
			x->s_len -= n;
			if (x->s_len == 0)
				x->s_off = 0;
			if (x->paused && STREAM_BUF - x->s_len >= STREAM_RECV) {
				x->paused = false;
				curl_easy_pause(x->h, CURLPAUSE_CONT);
			}
			s->delivered += n;
			return (ssize_t)n;
		}
		if (x && !x->done) {
			reg_xfer_drive(x, true);
			continue;
		}
		if (x && x->cc == CURLE_OK && x->status >= 200 && x->status < 300)
			return 0;
		/* the transfer broke (or never started): resume where we are */
		if (x) {
			bool can = x->cc != CURLE_OK ? reg_cc_retryable(x->cc)
			                             : reg_status_retryable(x->status);
			if (!can || s->restarts >= s->reg->o.resumes) {
				if (x->cc != CURLE_OK)
					reg_describe_cc(s->reg, x, "GET", s->url, e);
				else
					reg_describe_status(x, "GET", s->url, e);
				if (s->delivered)
					oci_err_prefix(
					    e, "transfer cut short after %" PRIu64 " bytes%s",
					    s->delivered,
					    s->restarts ? " (resumed and failed again)" : "");
				return x->cc != CURLE_OK ? reg_cc_errno(x->cc)
				                         : reg_status_errno(x->status);
			}
			char n[24];
			snprintf(n, sizeof(n), "%" PRIu64, s->delivered);
			log_warn("blob transfer interrupted, resuming", "digest", s->digest,
			         "offset", n, "error",
			         x->cc != CURLE_OK ? curl_easy_strerror(x->cc) : "HTTP error");
			reg_backoff(s->reg, s->restarts, x->retry_after);
			s->restarts++;
			reg_xfer_free(x);
			s->x = NULL;
		}
		int rc = stream_start(s, e);
		if (rc)
			return rc;
	}
}

static void stream_close(void *ctx)
{
	struct stream *s = ctx;
	reg_xfer_free(s->x);
	free(s);
}

/* A mirror's blob that failed: passed over for this digest from now on. */
static int stream_failed(void *ctx, int rc, struct oci_err *e)
{
	struct stream *s = ctx;
	if (!s->reg->mirror || rc == -ECANCELED)
		return rc;
	reg_refuse(s->reg->front, s->reg->host, s->digest, oci_err_str(e, rc));
	oci_err_prefix(e, "mirror %s (passed over from now on)", s->reg->host);
	return -ESTALE;
}

static const struct oci_blob_source stream_source = {stream_read, stream_close, stream_failed};

int reg_blob_open_at(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                     const char *what, struct oci_blob_reader **out, struct oci_err *err)
{
	struct stream *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->reg = r;
	snprintf(s->digest, sizeof(s->digest), "%s", d->digest);
	reg_pull_scope(s->scope, sizeof(s->scope), repo);
	int rc = reg_build_url(r, s->url, sizeof(s->url), "/%s/blobs/%s", repo, d->digest);
	if (rc == 0)
		rc = stream_start(s, err);
	if (rc) {
		oci_err_prefix(err, "%s %s", what ? what : "blob", d->digest);
		stream_close(s);
		return rc;
	}
	return oci_blob_reader_new(&stream_source, s, d->digest, d->size, what, out);
}

/* HEAD a blob with the scope of a pull or of a push. */
static int blob_head(struct oci_registry *r, const char *repo, const char *digest, bool push,
                     bool *exists, struct oci_err *err)
{
	char url[URL_MAX], scope[512];
	struct xfer *x = NULL;
	(push ? reg_push_scope : reg_pull_scope)(scope, sizeof(scope), repo);
	int rc = reg_build_url(r, url, sizeof(url), "/%s/blobs/%s", repo, digest);
	if (rc)
		return rc;
	struct req q = {.method = "HEAD", .total_timeout = true, .up_fd = -1};
	if ((rc = reg_request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	/* a registry that sends the blob on to storage knows it and serves it */
	if (x->status == 200 || (!push && x->status >= 300 && x->status < 400))
		*exists = true;
	else if (x->status == 404)
		*exists = false;
	else {
		reg_describe_status(x, "HEAD", url, err);
		rc = reg_status_errno(x->status);
	}
	reg_xfer_free(x);
	return rc;
}

int oci_registry_blob_exists(struct oci_registry *r, const char *repo, const char *digest,
                             bool *exists, struct oci_err *err)
{
	return blob_head(r, repo, digest, true, exists, err);
}

/* The source c serves the blob to these credentials: 0, or -ENOENT. */
int reg_blob_readable_at(struct oci_registry *c, const char *repo, const struct oci_desc *d,
                         struct oci_err *err)
{
	bool exists = false;
	int rc = blob_head(c, repo, d->digest, false, &exists, err);
	if (rc == 0 && !exists) {
		oci_errf(err, "blob %s not found in %s/%s", d->digest, c->host, repo);
		rc = -ENOENT;
	}
	return rc;
}

/* Location headers may be relative; make them absolute. */
static int absolute_location(const struct oci_registry *r, const char *loc, char *out, size_t cap)
{
	if (strncmp(loc, "http://", 7) == 0 || strncmp(loc, "https://", 8) == 0) {
		if ((size_t)snprintf(out, cap, "%s", loc) >= cap)
			return -ENAMETOOLONG;
		return 0;
	}
	if (loc[0] != '/')
		return -EPROTO;
	return reg_build_url(r, out, cap, "%s", loc);
}

static int upload_once(struct oci_registry *r, const char *repo, int fd, const void *mem,
                       const struct oci_desc *d, bool chunked, struct oci_err *err)
{
	char url[URL_MAX], scope[512], loc[URL_MAX];
	struct xfer *x = NULL;
	reg_push_scope(scope, sizeof(scope), repo);
	int rc = reg_build_url(r, url, sizeof(url), "/%s/blobs/uploads/", repo);
	if (rc)
		return rc;
	struct req q = {.method = "POST", .total_timeout = true, .up_fd = -1};
	if ((rc = reg_request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	if (x->status != 202 || !x->location[0]) {
		reg_describe_status(x, "POST", url, err);
		oci_err_prefix(err, "cannot start blob upload");
		rc = x->status == 202 ? -EPROTO : reg_status_errno(x->status);
		goto out;
	}
	if ((rc = absolute_location(r, x->location, loc, sizeof(loc)))) {
		oci_errf(err, "registry gave an unusable upload location '%s'", x->location);
		goto out;
	}
	reg_xfer_free(x);
	x = NULL;
	uint64_t size = (uint64_t)d->size;
	uint64_t chunk = chunked ? (r->o.chunk_size ? r->o.chunk_size : (16u << 20)) : size;
	uint64_t off = 0;
	while (chunked && off < size) {
		uint64_t n = size - off < chunk ? size - off : chunk;
		char cr[64];
		snprintf(cr, sizeof(cr), "%" PRIu64 "-%" PRIu64, off, off + n - 1);
		struct req p = {.method = "PATCH",
		                .content_type = "application/octet-stream",
		                .content_range = cr,
		                .up_fd = fd,
		                .up_mem = mem,
		                .up_off = off,
		                .up_len = n};
		if ((rc = reg_request(r, &p, loc, sizeof(loc), scope, &x, err)))
			goto out;
		if (x->status != 202 || !x->location[0]) {
			reg_describe_status(x, "PATCH", loc, err);
			oci_err_prefix(err, "chunk at offset %" PRIu64 " refused", off);
			rc = reg_status_errno(x->status);
			goto out;
		}
		char next[URL_MAX];
		if ((rc = absolute_location(r, x->location, next, sizeof(next)))) {
			oci_errf(err, "registry gave an unusable upload location '%s'",
			         x->location);
			goto out;
		}
		memcpy(loc, next, sizeof(loc));
		reg_xfer_free(x);
		x = NULL;
		off += n;
	}
	char put[URL_MAX];
	if ((size_t)snprintf(put, sizeof(put), "%s%sdigest=%s", loc, strchr(loc, '?') ? "&" : "?",
	                     d->digest) >= sizeof(put)) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	struct req p = {.method = "PUT",
	                .content_type = "application/octet-stream",
	                .up_fd = fd,
	                .up_mem = mem,
	                .up_len = chunked ? 0 : size};
	if ((rc = reg_request(r, &p, put, sizeof(put), scope, &x, err)))
		goto out;
	if (x->status == 413 && !chunked) {
		rc = -EFBIG; /* the caller switches to chunks */
		goto out;
	}
	if (x->status != 201) {
		reg_describe_status(x, "PUT", put, err);
		oci_err_prefix(err, "blob upload of %s refused", d->digest);
		rc = reg_status_errno(x->status);
		goto out;
	}
	if (x->docker_digest[0] && strcmp(x->docker_digest, d->digest) != 0) {
		oci_errf(err, "registry stored blob %s as %s", d->digest, x->docker_digest);
		rc = -EBADMSG;
	}
out:
	reg_xfer_free(x);
	return rc;
}

int oci_registry_push_blob(struct oci_registry *r, const char *repo, int fd, const void *mem,
                           const struct oci_desc *d, struct oci_err *err)
{
	bool exists = false;
	int rc = oci_registry_blob_exists(r, repo, d->digest, &exists, err);
	if (rc)
		return rc;
	if (exists) {
		progress_add(PROGRESS_PRESENT, (uint64_t)d->size, 0);
		return 0;
	}
	bool chunked = r->o.chunk_size > 0 && (uint64_t)d->size > r->o.chunk_size;
	rc = upload_once(r, repo, fd, mem, d, chunked, err);
	if (rc == -EFBIG && !chunked) {
		log_info("registry refused a monolithic upload, sending chunks", "digest",
		         d->digest);
		rc = upload_once(r, repo, fd, mem, d, true, err);
	}
	return rc;
}
