/* Image references: the grammar of the distribution project
 * ([host[:port]/]path[:tag][@digest]) with Docker Hub's defaults, plus
 * OCI image-layout directories written "oci:DIR[:TAG]" or "oci:DIR@DIGEST"
 * (the spelling skopeo uses), so every command also works with no registry.
 *
 *   ubuntu                      -> docker.io/library/ubuntu:latest
 *   quay.io/org/cache:v1        -> registry quay.io, repository org/cache, tag v1
 *   127.0.0.1:5000/c@sha256:... -> by digest, no tag
 *   [::1]:5000/c:t@sha256:...   -> both (the digest wins when pulling)
 *   docker://quay.io/x          -> the skopeo transport prefix is accepted
 *   oci:./out:v1                -> layout directory ./out, tag v1
 */
#ifndef GKM_OCI_REF_H
#define GKM_OCI_REF_H

#include "oci_err.h"

#define OCI_REF_DEFAULT_REGISTRY "docker.io"
#define OCI_REF_DOCKER_HUB_API "registry-1.docker.io"
#define OCI_REF_DEFAULT_TAG "latest"
#define OCI_REF_MAX 4096

enum oci_ref_kind { OCI_REF_REGISTRY = 0, OCI_REF_LAYOUT };

struct oci_ref {
	enum oci_ref_kind kind;
	char *registry; /* registry refs: "docker.io", "quay.io", "127.0.0.1:5000", "[::1]:5000" */
	char *repository; /* registry refs: "library/ubuntu" */
	char *dir;        /* layout refs: the directory as written */
	char *tag;        /* NULL when none was given and a digest was */
	char *digest;     /* "algo:hex", or NULL */
};

/* Parse s into out (all fields heap strings owned by out; release with
 * oci_ref_clear()). A registry reference with neither tag nor digest gets
 * tag "latest". -EINVAL with the reason in err for anything malformed;
 * out is untouched on failure. */
__attribute__((warn_unused_result)) int oci_ref_parse(const char *s, struct oci_ref *out,
                                                      struct oci_err *err);
void oci_ref_clear(struct oci_ref *r);
/* Deep copy; dst is written only on success. */
__attribute__((warn_unused_result)) int oci_ref_copy(const struct oci_ref *src,
                                                     struct oci_ref *dst);
/* Replace the digest (a copy of digest; NULL removes it). 0 or -ENOMEM. */
__attribute__((warn_unused_result)) int oci_ref_set_digest(struct oci_ref *r, const char *digest);
__attribute__((warn_unused_result)) int oci_ref_set_tag(struct oci_ref *r, const char *tag);

/* Parse s and pin it to digest (no tag: a pull by digest only). As
 * oci_ref_parse; out is written only on success. */
__attribute__((warn_unused_result)) int oci_ref_pin(const char *s, const char *digest,
                                                    struct oci_ref *out, struct oci_err *err);

/* Canonical text: "docker.io/library/ubuntu:latest", "oci:DIR:TAG", with
 * "@digest" when there is one. Caller frees. NULL on ENOMEM. */
char *oci_ref_format(const struct oci_ref *r);
/* "registry/repository" (no tag, no digest), e.g. for a cosign identity.
 * Caller frees. */
char *oci_ref_name(const struct oci_ref *r);
/* The host to speak the API to: registry-1.docker.io for docker.io. Borrowed. */
const char *oci_ref_api_host(const struct oci_ref *r);
/* What to ask the registry for: the digest when there is one, else the tag. */
const char *oci_ref_reference(const struct oci_ref *r);

/* Tag grammar: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}. */
int oci_ref_tag_valid(const char *tag);

#endif
