/* A Pod under admission as the placement webhook reads it: its identity,
 * its node affinity, and the volumes that may mount a cache (csi.gkm.io CSI
 * volumes, image volumes (KEP-4639), and claims, which may be a cache's
 * spec.claim). Pure functions, no I/O: every
 * malformed pod is answered with a message, never followed.
 *
 * Every pointer in struct pod_info borrows from the object it was read from. */
#ifndef GKM_POD_VOLUMES_H
#define GKM_POD_VOLUMES_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define POD_CSI_DRIVER "csi.gkm.io"
/* Bounds on what is read (a pod is at most a few MiB; these keep the work
 * per review small whatever it holds). */
#define POD_VOLUMES_MAX 1024
#define POD_CACHE_VOLUMES_MAX 64

enum pod_mount { POD_MOUNT_CSI = 1, POD_MOUNT_IMAGE, POD_MOUNT_CLAIM };

struct pod_volume {
	enum pod_mount mount;
	int index;        /* in spec.volumes */
	const char *name; /* the volume's name */
	/* csi: the cache, with either spelling of the attributes */
	const char *cache_name;
	const char *cache_namespace; /* "" for a ClusterGKMCache */
	const cJSON *attributes;     /* volumeAttributes, or NULL */
	/* image: volumes[].image.reference as written */
	const char *reference;
	/* claim: volumes[].persistentVolumeClaim.claimName */
	const char *claim;
};

struct pod_info {
	const char *namespace_; /* the request's namespace */
	const char *name;       /* "" when the pod has only a generateName */
	const char *generate_name;
	const cJSON *labels, *annotations; /* objects, or NULL */
	bool has_metadata;
	const cJSON *affinity; /* spec.affinity, or NULL */
	struct pod_volume *vols;
	size_t n; /* csi.gkm.io volumes, image volumes with a reference, claims */
};

/* Read object (request.object of a Pod review) in namespace ns. 0, or
 * -EINVAL with a message for the user ("spec.volumes[2].csi.volumeAttributes
 * must be a map of strings"), -ENOMEM. Volumes of other kinds are skipped
 * unread. On success release out with pod_info_clear(). */
__attribute__((warn_unused_result)) int
pod_info_read(const cJSON *object, const char *ns, struct pod_info *out, char *err, size_t errlen);
void pod_info_clear(struct pod_info *p);

/* "ns/name", or "ns/<generateName>*" for a pod not named yet. */
void pod_info_display(const struct pod_info *p, char *buf, size_t len);

#endif
