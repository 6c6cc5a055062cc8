#include "admission_review.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "errbuf.h"

static int fail(int rc, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(int rc, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	errbuf_vset(err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

static const cJSON *field(const cJSON *o, const char *name)
{
	return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
}

/* A string field: its value, "" when absent or null, NULL when of another type. */
static const char *opt_string(const cJSON *o, const char *name)
{
	const cJSON *v = field(o, name);
	if (!v || cJSON_IsNull(v))
		return "";
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const char *const op_names[] = {"", "CREATE", "UPDATE", "DELETE", "CONNECT"};

const char *admission_op_name(enum admission_op op)
{
	return op >= ADMISSION_CREATE && op <= ADMISSION_CONNECT ? op_names[op] : "?";
}

int admission_review_parse(const char *body, size_t len, struct admission_request *out, char *err,
                           size_t errlen)
{
	struct admission_request r = {0};
	int rc = -EPROTO;
	if (len == 0)
		return fail(-EPROTO, err, errlen, "empty request body (want an AdmissionReview)");
	if (len > ADMISSION_MAX_BYTES)
		return fail(-EPROTO, err, errlen, "request body of %zu bytes exceeds %u", len,
		            ADMISSION_MAX_BYTES);
	const char *end = NULL;
	r.doc = cJSON_ParseWithLengthOpts(body, len, &end, 0);
	if (!r.doc) {
		size_t at = end && end >= body ? (size_t)(end - body) : 0;
		return fail(-EPROTO, err, errlen, "request body is not valid JSON (at byte %zu)",
		            at);
	}
	const char *api = opt_string(r.doc, "apiVersion");
	const char *kind = opt_string(r.doc, "kind");
	if (!cJSON_IsObject(r.doc)) {
		fail(rc, err, errlen, "request body is not a JSON object");
		goto out;
	}
	if (!kind || strcmp(kind, "AdmissionReview") != 0) {
		fail(rc, err, errlen, "kind is '%s', want AdmissionReview", kind ? kind : "?");
		goto out;
	}
	if (!api || strcmp(api, ADMISSION_API_VERSION) != 0) {
		fail(rc, err, errlen, "apiVersion is '%s', want " ADMISSION_API_VERSION,
		     api ? api : "?");
		goto out;
	}
	const cJSON *req = field(r.doc, "request");
	if (!cJSON_IsObject(req)) {
		fail(rc, err, errlen, "AdmissionReview has no request object");
		goto out;
	}
	const char *uid = opt_string(req, "uid");
	if (!uid || !uid[0] || strlen(uid) > ADMISSION_UID_MAX) {
		fail(rc, err, errlen, "request.uid must be a non-empty string of at most %d bytes",
		     ADMISSION_UID_MAX);
		goto out;
	}
	snprintf(r.uid, sizeof(r.uid), "%s", uid);
	const char *op = opt_string(req, "operation");
	for (int i = ADMISSION_CREATE; op && i <= ADMISSION_CONNECT; i++)
		if (strcmp(op, op_names[i]) == 0)
			r.op = (enum admission_op)i;
	if (!r.op) {
		fail(rc, err, errlen,
		     "request.operation '%s' is not CREATE, UPDATE, DELETE or CONNECT",
		     op ? op : "?");
		goto out;
	}
	const cJSON *k = field(req, "kind");
	const char *group = opt_string(k, "group");
	r.kind = opt_string(k, "kind");
	r.namespace_ = opt_string(req, "namespace");
	r.name = opt_string(req, "name");
	const char *sub = opt_string(req, "subResource");
	if (!group || !r.kind || !r.namespace_ || !r.name || !sub) {
		fail(rc, err, errlen,
		     "request.kind, namespace, name and subResource must be strings when present");
		goto out;
	}
	r.dry_run = cJSON_IsTrue(field(req, "dryRun"));
	r.ours = strcmp(group, ADMISSION_GROUP) == 0 &&
	         (strcmp(r.kind, "GKMCache") == 0 || strcmp(r.kind, "ClusterGKMCache") == 0) &&
	         !sub[0] && (r.op == ADMISSION_CREATE || r.op == ADMISSION_UPDATE);
	r.pod = !group[0] && strcmp(r.kind, "Pod") == 0 && !sub[0] && r.op == ADMISSION_CREATE;
	*out = r;
	return 0;
out:
	cJSON_Delete(r.doc);
	return rc;
}

/* metadata.annotations of obj and the digest annotation in it. */
static int read_annotations(const cJSON *obj, const char *which, const cJSON **annotations,
                            const char **digest, bool *has_metadata, char *err, size_t errlen)
{
	const cJSON *md = field(obj, "metadata");
	*annotations = NULL;
	*digest = NULL;
	*has_metadata = cJSON_IsObject(md);
	if (md && !cJSON_IsObject(md))
		return fail(-EINVAL, err, errlen, "%s.metadata is not an object", which);
	const cJSON *an = field(md, "annotations");
	if (!an || cJSON_IsNull(an))
		return 0;
	if (!cJSON_IsObject(an))
		return fail(-EINVAL, err, errlen, "%s.metadata.annotations is not an object",
		            which);
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(an, ADMISSION_ANNOTATION_DIGEST);
	if (d && !cJSON_IsString(d))
		return fail(-EINVAL, err, errlen,
		            "annotation " ADMISSION_ANNOTATION_DIGEST " must be a string");
	*annotations = an;
	*digest = d ? d->valuestring : NULL;
	return 0;
}

/* spec.image of obj: required, a non-empty string of bounded length. */
static int read_image(const cJSON *obj, const char *which, const char **image, char *err,
                      size_t errlen)
{
	const cJSON *spec = field(obj, "spec");
	if (!cJSON_IsObject(spec))
		return fail(-EINVAL, err, errlen, "%s.spec is required (with spec.image)", which);
	const cJSON *img = field(spec, "image");
	if (!img || cJSON_IsNull(img))
		return fail(-EINVAL, err, errlen, "spec.image is required");
	if (!cJSON_IsString(img))
		return fail(-EINVAL, err, errlen, "spec.image must be a string");
	size_t n = strlen(img->valuestring);
	if (n == 0)
		return fail(-EINVAL, err, errlen, "spec.image is empty");
	if (n > ADMISSION_IMAGE_MAX)
		return fail(-EINVAL, err, errlen, "spec.image is longer than %d characters",
		            ADMISSION_IMAGE_MAX);
	*image = img->valuestring;
	return 0;
}

int admission_request_check(struct admission_request *req, char *err, size_t errlen)
{
	const cJSON *rq = field(req->doc, "request");
	const cJSON *obj = field(rq, "object");
	const cJSON *old = field(rq, "oldObject");
	const cJSON *an = NULL, *old_an = NULL;
	const char *image = NULL, *old_image = NULL, *digest = NULL, *old_digest = NULL;
	bool has_md = false, old_md = false;
	int rc;
	if (!cJSON_IsObject(obj))
		return fail(-EINVAL, err, errlen, "request.object is missing or not an object");
	if ((rc = read_annotations(obj, "object", &an, &digest, &has_md, err, errlen)) != 0 ||
	    (rc = read_image(obj, "object", &image, err, errlen)) != 0)
		return rc;
	if (req->op == ADMISSION_UPDATE && old && !cJSON_IsNull(old)) {
		if (!cJSON_IsObject(old))
			return fail(-EINVAL, err, errlen, "request.oldObject is not an object");
		/* an old object without a usable image is treated as having none */
		if (read_annotations(old, "oldObject", &old_an, &old_digest, &old_md, err,
		                     errlen) != 0)
			old_digest = NULL;
		if (read_image(old, "oldObject", &old_image, err, errlen) != 0)
			old_image = NULL;
		err[0] = '\0';
	} else {
		old = NULL;
	}
	req->object = obj;
	req->old_object = old;
	req->image = image;
	req->old_image = old_image;
	req->annotations = an;
	req->digest_annotation = digest;
	req->old_digest_annotation = old_digest;
	req->has_metadata = has_md;
	return 0;
}

void admission_request_clear(struct admission_request *req)
{
	cJSON_Delete(req->doc);
	memset(req, 0, sizeof(*req));
}

int admission_response_build(const struct admission_response *r, char **out, size_t *len)
{
	cJSON *doc = NULL, *resp, *st;
	char *b64 = NULL, *text = NULL, *msg = NULL;
	int rc = -ENOMEM;
	if (!r->uid || !r->uid[0])
		return -EINVAL;
	if (!(doc = cJSON_CreateObject()) ||
	    !cJSON_AddStringToObject(doc, "apiVersion", ADMISSION_API_VERSION) ||
	    !cJSON_AddStringToObject(doc, "kind", "AdmissionReview") ||
	    !(resp = cJSON_AddObjectToObject(doc, "response")) ||
	    !cJSON_AddStringToObject(resp, "uid", r->uid) ||
	    !cJSON_AddBoolToObject(resp, "allowed", r->allowed))
		goto out;
	if (r->allowed && r->patch) {
		if ((rc = base64_encode(r->patch, strlen(r->patch), &b64)) != 0)
			goto out;
		rc = -ENOMEM;
		if (!cJSON_AddStringToObject(resp, "patchType", "JSONPatch") ||
		    !cJSON_AddStringToObject(resp, "patch", b64))
			goto out;
	}
	if (!r->allowed) {
		const char *reason = r->reason && r->reason[0] ? r->reason : "Forbidden";
		const char *m = r->message && r->message[0] ? r->message : "denied by policy";
		if (asprintf(&msg, "%s: %s", reason, m) < 0) {
			msg = NULL;
			goto out;
		}
		if (!(st = cJSON_AddObjectToObject(resp, "status")) ||
		    !cJSON_AddNumberToObject(st, "code", r->code ? r->code : 403) ||
		    !cJSON_AddStringToObject(st, "reason", reason) ||
		    !cJSON_AddStringToObject(st, "message", msg))
			goto out;
	}
	cJSON *w = NULL;
	for (size_t i = 0; i <= r->nwarnings; i++) {
		const char *wt = i == 0 ? r->warning : r->warnings[i - 1];
		if (!wt || !wt[0])
			continue;
		cJSON *s = cJSON_CreateString(wt);
		if (!w)
			w = cJSON_AddArrayToObject(resp, "warnings");
		if (!w || !s || !cJSON_AddItemToArray(w, s)) {
			cJSON_Delete(s);
			goto out;
		}
	}
	if (!(text = cJSON_PrintUnformatted(doc)))
		goto out;
	*len = strlen(text);
	*out = text;
	rc = 0;
out:
	free(msg);
	free(b64);
	cJSON_Delete(doc);
	return rc;
}

/* RFC 6901: '~' is written "~0" and '/' "~1" in a path segment. */
static void pointer_token(const char *key, char *out, size_t len)
{
	size_t o = 0;
	for (; *key && o + 3 < len; key++) {
		if (*key == '/' || *key == '~') {
			out[o++] = '~';
			out[o++] = *key == '/' ? '1' : '0';
		} else
			out[o++] = *key;
	}
	out[o] = '\0';
}

cJSON *admission_patch_op(cJSON *ops, const char *op, const char *path)
{
	cJSON *o = cJSON_CreateObject();
	if (!o || !cJSON_AddItemToArray(ops, o)) {
		cJSON_Delete(o);
		return NULL;
	}
	return cJSON_AddStringToObject(o, "op", op) && cJSON_AddStringToObject(o, "path", path)
	           ? o
	           : NULL;
}

int admission_annotation_ops(cJSON *ops, const cJSON *annotations, bool has_metadata,
                             const struct admission_annotation *a, size_t n)
{
	cJSON *o, *value = NULL;
	for (size_t i = 0; i < n; i++) {
		const cJSON *have = cJSON_GetObjectItemCaseSensitive(annotations, a[i].key);
		if (cJSON_IsString(have) && strcmp(have->valuestring, a[i].value) == 0)
			continue;
		if (annotations) { /* "add" replaces an existing member */
			char path[600] = "/metadata/annotations/";
			pointer_token(a[i].key, path + strlen(path), sizeof(path) - strlen(path));
			if (!(o = admission_patch_op(ops, "add", path)) ||
			    !cJSON_AddStringToObject(o, "value", a[i].value))
				return -ENOMEM;
			continue;
		}
		/* one operation makes the annotations, with every key */
		if (!value &&
		    (!(o = admission_patch_op(
		           ops, "add", has_metadata ? "/metadata/annotations" : "/metadata")) ||
		     !(value = cJSON_AddObjectToObject(o, "value")) ||
		     (!has_metadata && !(value = cJSON_AddObjectToObject(value, "annotations")))))
			return -ENOMEM;
		if (!cJSON_AddStringToObject(value, a[i].key, a[i].value))
			return -ENOMEM;
	}
	return 0;
}

int admission_patch_annotations(const struct admission_request *req,
                                const struct admission_annotation *a, size_t n, char **out)
{
	cJSON *patch = cJSON_CreateArray();
	int rc = patch ? admission_annotation_ops(patch, req->annotations, req->has_metadata, a, n)
	               : -ENOMEM;
	*out = NULL;
	if (rc == 0 && cJSON_GetArraySize(patch) > 0 && !(*out = cJSON_PrintUnformatted(patch)))
		rc = -ENOMEM;
	cJSON_Delete(patch);
	return rc;
}
