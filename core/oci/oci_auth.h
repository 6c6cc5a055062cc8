/* Registry authentication pieces that need no network: parsing
 * WWW-Authenticate challenges, finding credentials for a host in a
 * dockerconfigjson document (a file such as ~/.docker/config.json or
 * $REGISTRY_AUTH_FILE, or the data of a kubernetes.io/dockerconfigjson
 * Secret). */
#ifndef GKM_OCI_AUTH_H
#define GKM_OCI_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "oci_err.h"

enum oci_auth_scheme { OCI_AUTH_NONE = 0, OCI_AUTH_BASIC, OCI_AUTH_BEARER };

struct oci_challenge {
	enum oci_auth_scheme scheme;
	char *realm, *service, *scope, *error; /* NULL when absent */
};

/* Parse the value of a WWW-Authenticate header. When it offers several
 * challenges, Bearer wins over Basic. -EINVAL + err when no Basic or
 * Bearer challenge can be read (or Bearer lacks a realm). Release with
 * oci_challenge_clear(). */
__attribute__((warn_unused_result)) int
oci_challenge_parse(const char *hdr, struct oci_challenge *out, struct oci_err *err);
void oci_challenge_clear(struct oci_challenge *c);

struct oci_creds {
	char *username, *password;
	char *identity_token; /* an OAuth2 refresh token (docker login to some registries) */
};
void oci_creds_clear(struct oci_creds *c);

/* Look host up ("quay.io", "127.0.0.1:5000"; docker.io also matches the
 * historical "https://index.docker.io/v1/" key) in a dockerconfigjson
 * document. Accepts {"auths":{...}}, the older {"host":{"auth":...}}
 * .dockercfg shape, or a whole Secret object (JSON) whose data holds
 * ".dockerconfigjson"/".dockercfg" in base64 (or stringData in clear).
 * 0 and *out filled; -ENOENT when the host has no entry; -EINVAL + err
 * when the document or the entry is malformed. */
__attribute__((warn_unused_result)) int oci_creds_lookup(const char *json, size_t len,
                                                         const char *host, struct oci_creds *out,
                                                         struct oci_err *err);

/* Same, reading the document from a file (capped at 4 MiB). */
__attribute__((warn_unused_result)) int oci_creds_lookup_file(const char *path, const char *host,
                                                              struct oci_creds *out,
                                                              struct oci_err *err);

#endif
