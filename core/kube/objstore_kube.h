/* The object store of the daemons (objstore.h) on a Kubernetes API server:
 * watches are informers (list+watch threads whose changes are delivered on
 * the loop thread), apply is server-side apply with the caller's field
 * manager and force (each writer owns its fields: no conflict retries), get
 * and remove are direct requests, events are core/v1 Events. */
#ifndef GKM_OBJSTORE_KUBE_H
#define GKM_OBJSTORE_KUBE_H

#include "kube_client.h"
#include "objstore.h"

/* Connect with a kubeconfig (path NULL: in-cluster when running in a pod,
 * else $KUBECONFIG or ~/.kube/config; context NULL: the current one).
 * component names the reporter of Events ("gkm-agent"); host the node (may
 * be NULL). On failure err says why. Caller frees with s->ops->free(s). */
__attribute__((warn_unused_result)) int objstore_kube_new(const char *kubeconfig,
                                                          const char *context, struct loop *l,
                                                          const char *component, const char *host,
                                                          struct objstore **out, char *err,
                                                          size_t errlen);

/* The client the store uses (for verbs the interface does not have, such as
 * leader election). Borrowed: lives as long as the store. */
struct kube_client *objstore_kube_client(struct objstore *s);

#endif
