/* AdmissionReview v1 (admission.k8s.io/v1) as the gkm webhook speaks it: the
 * request the API server sends, the response it expects back, and the
 * JSONPatch that records the resolved digest. Pure functions, no I/O, so
 * every malformed input can be tested without a server.
 *
 * Parsing is in two stages so that the caller knows how to answer:
 *  - admission_review_parse() checks the envelope (apiVersion, kind,
 *    request.uid, operation). Without a valid envelope there is no uid to
 *    answer to: the caller replies HTTP 400 with the message.
 *  - admission_request_check() checks the object of a review for our kinds
 *    (metadata, annotations, spec.image). A failure there is answered with a
 *    denial that carries the message, so the user sees why. */
#ifndef GKM_ADMISSION_REVIEW_H
#define GKM_ADMISSION_REVIEW_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define ADMISSION_API_VERSION "admission.k8s.io/v1"
#define ADMISSION_GROUP "gkm.io"
#define ADMISSION_ANNOTATION_DIGEST "gkm.io/resolvedDigest"
/* Kubernetes caps a request at 3 MiB; a review wraps object and oldObject. */
#define ADMISSION_MAX_BYTES (6u << 20)
#define ADMISSION_UID_MAX 128
#define ADMISSION_IMAGE_MAX 4096

enum admission_op { ADMISSION_CREATE = 1, ADMISSION_UPDATE, ADMISSION_DELETE, ADMISSION_CONNECT };

struct admission_request {
	cJSON *doc; /* the whole review, owned; every pointer below borrows from it */
	char uid[ADMISSION_UID_MAX + 1];
	enum admission_op op;
	const char *kind; /* request.kind.kind ("GKMCache"), "" when absent */
	/* group gkm.io, kind GKMCache or ClusterGKMCache, the main resource (not
	 * a subresource such as status), CREATE or UPDATE: the reviews the
	 * webhook decides. Others are allowed unchanged. */
	bool ours;
	/* group "", kind Pod, the main resource, CREATE: the reviews /mutate-pods
	 * decides (a pod's volumes and affinity cannot change afterwards). */
	bool pod;
	const char *namespace_; /* "" for cluster-scoped objects */
	const char *name;       /* "" when the object has only a generateName */
	bool dry_run;
	/* Filled by admission_request_check(): */
	const cJSON *object, *old_object;
	const char *image, *old_image;     /* spec.image; old_image NULL on CREATE */
	const cJSON *annotations;          /* object metadata.annotations, NULL if none */
	const char *digest_annotation;     /* object's gkm.io/resolvedDigest, or NULL */
	const char *old_digest_annotation; /* oldObject's, or NULL */
	bool has_metadata;                 /* object has a metadata object */
};

/* Parse a request body. 0, or -EPROTO with err saying what is wrong with the
 * envelope (not JSON, not an AdmissionReview v1, no uid, unknown operation);
 * -ENOMEM. On success the caller releases out with admission_request_clear(). */
__attribute__((warn_unused_result)) int admission_review_parse(const char *body, size_t len,
                                                               struct admission_request *out,
                                                               char *err, size_t errlen);

/* Check the object of one of our reviews and fill the fields above. 0, or
 * -EINVAL with a message for the user ("spec.image is required"). */
__attribute__((warn_unused_result)) int admission_request_check(struct admission_request *req,
                                                                char *err, size_t errlen);

void admission_request_clear(struct admission_request *req);

const char *admission_op_name(enum admission_op op);

struct admission_response {
	const char *uid;
	bool allowed;
	/* denials: a CamelCase reason (kept in status.reason and in front of the
	 * message) and the message for the user */
	const char *reason;
	const char *message;
	int code;                    /* denials: status code, 403 when 0 */
	const char *patch;           /* allowed: JSONPatch text (base64-encoded here), or NULL */
	const char *warning;         /* optional; kubectl shows it to the user */
	const char *const *warnings; /* more of them (nwarnings), after warning */
	size_t nwarnings;
};

/* The AdmissionReview v1 response document. *out is NUL-terminated, caller
 * frees with free(). 0, -EINVAL (no uid), -ENOMEM. */
__attribute__((warn_unused_result)) int admission_response_build(const struct admission_response *r,
                                                                 char **out, size_t *len);

/* Append {op, path} to ops (a JSONPatch array): the new operation, for
 * its value, or NULL when out of memory. */
cJSON *admission_patch_op(cJSON *ops, const char *op, const char *path);

struct admission_annotation {
	const char *key, *value;
};
/* Append to ops (a JSONPatch array) the operations that make an object's
 * annotations (its metadata.annotations, NULL when it has none;
 * has_metadata: it has a metadata object) hold a[0..n): one "add" per key
 * whose value differs, or one that makes the annotations with every key.
 * 0 or -ENOMEM. */
__attribute__((warn_unused_result)) int
admission_annotation_ops(cJSON *ops, const cJSON *annotations, bool has_metadata,
                         const struct admission_annotation *a, size_t n);
/* The JSONPatch that makes the object's annotations a[0..n) have their
 * values (gkm.io/resolvedDigest, gkm.io/runtime-env): creates
 * metadata.annotations when the object has none, else adds or replaces each
 * key. *out is NULL when every annotation already has its value (nothing
 * to patch), else a string the caller frees. req must have passed
 * admission_request_check(). 0 or -ENOMEM. */
__attribute__((warn_unused_result)) int
admission_patch_annotations(const struct admission_request *req,
                            const struct admission_annotation *a, size_t n, char **out);

#endif
