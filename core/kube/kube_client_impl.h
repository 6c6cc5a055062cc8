/* The Kubernetes client's parts (private to core/kube/kube_client.c,
 * kube_error.c, kube_resource.c and kube_verbs.c): the helpers one part
 * uses from another (named kc_*). kube_client.h is the interface; this is
 * not.
 *
 *   kube_error.c    reasons, Status bodies, errnos
 *   kube_resource.c built-in kinds, API paths, query strings
 *   kube_client.c   the client: connections, requests, streams, discovery
 *   kube_verbs.c    get, list, create, replace, apply, delete; Events */
#ifndef GKM_KUBE_CLIENT_IMPL_H
#define GKM_KUBE_CLIENT_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include <cJSON.h>

#include "kube_client.h"

#define PATH_MAX_LEN 4096

/* kube_error.c */
void kc_copy_str(char *dst, size_t len, const char *src);
const char *kc_jstr(const cJSON *o, const char *key);

/* kube_resource.c */
int kc_split_api_version(const char *av, struct kube_resource *r);
bool kc_path_segment_ok(const char *s);

#endif
