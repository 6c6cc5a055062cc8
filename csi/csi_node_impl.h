/* The CSI node service's parts (private to csi/csi_node*.c): the state they
 * share and the calls one part makes into another. csi_node.h is the
 * service's interface; this is not.
 *
 *   csi_node.c            driver names, replies, the volume table, identity
 *                         and node information, dispatch, start and stop
 *   csi_node_attrs.c      checking a publish request and its volume attributes
 *   csi_node_dirs.c       a volume's own directories (the writable overlay's
 *                         upper and work, the size-limited layer image, the
 *                         fallback directory) and mounting at the target
 *   csi_node_publish.c    NodePublishVolume: the cache's record, the source
 *   csi_node_unpublish.c  NodeUnpublishVolume, the hand-over for capture
 *   csi_node_stats.c      NodeGetVolumeStats */
#ifndef GKM_CSI_NODE_IMPL_H
#define GKM_CSI_NODE_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache_view.h"
#include "csi.pb-c.h"
#include "csi_node.h"
#include "csi_volume.h"
#include "metrics.h"

enum {
	ATTRS_MAX = 64,       /* volume_context entries */
	ATTR_VALUE_MAX = 253, /* the values gkm reads */
	POD_UID_MAX = 64,
	USAGE_CACHE = 64, /* store entries whose size is remembered */
};

struct entry {
	struct csi_volume v;
	bool busy;        /* a call for this volume is in flight */
	bool placeholder; /* reserved by a publish that has not finished */
};

struct tree_size {
	char digest[CACHE_VIEW_DIGEST_LEN + 1];
	uint64_t bytes, inodes;
};

struct csi_node {
	char *node_id, *root, *run_dir, *state_dir, *volumes_dir, *version, *driver;
	uint64_t size_limit; /* the default of the sizeLimit attribute */
	pthread_mutex_t lock;
	struct entry **vols;
	size_t nvols, cap;
	/* Store entries never change once in place, so their size is computed
	 * once per digest (stats are polled every minute per volume). */
	struct tree_size sizes[USAGE_CACHE];
	size_t next_size;
	bool ready;
};

/* gkm_csi_fallback_total{reason} */
extern struct metric *csi_node_m_fallbacks;

/* ---- replies (csi_node.c) ---- */

void csi_node_fail(struct csi_reply *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void csi_node_reply(struct csi_reply *r, const ProtobufCMessage *m);
/* Untrusted text quoted in a message: bounded, control characters replaced. */
const char *csi_node_shown(const char *s, char *buf, size_t size);

/* ---- the volume table (csi_node.c; callers hold n->lock) ---- */

struct entry *csi_node_find_id(struct csi_node *n, const char *id);
struct entry *csi_node_find_target(struct csi_node *n, const char *target);
/* The publication of volume id at target, or NULL; then *other is the
 * volume's one publication elsewhere when it is not shared. */
struct entry *csi_node_published_at(struct csi_node *n, const char *id, const char *target,
                                    struct entry **other);
int csi_node_add_entry(struct csi_node *n, struct entry *e);
void csi_node_drop_entry(struct csi_node *n, struct entry *e);
void csi_node_count_volumes(struct csi_node *n);

/* ---- requests (csi_node_attrs.c) ---- */

int csi_node_check_volume_id(const char *id, struct csi_reply *r);
int csi_node_check_path(const char *field, const char *p, struct csi_reply *r);
/* Validate a publish request into *v (strings borrowed from req: copy before
 * keeping). Fails with INVALID_ARGUMENT or PERMISSION_DENIED. */
int csi_node_parse_publish(const struct csi_node *n, const Csi__V1__NodePublishVolumeRequest *req,
                           struct csi_volume *v, struct csi_reply *r);

/* ---- a volume's directories and mounts (csi_node_dirs.c) ---- */

/* <state>/volumes/<key>[/sub]: the private directories of one publication. */
int csi_node_key_dir(const struct csi_node *n, const char *key, const char *sub, char *buf,
                     size_t size);
int csi_node_overlay_dir(const struct csi_node *n, const struct csi_volume *v, const char *sub,
                         char *buf, size_t size);
/* Writes of this volume go to a size-limited layer (csi_layer.h) mounted at
 * <dir>/layer: its upper, work and fallback directories live there. */
bool csi_node_layered(const struct csi_volume *v);
/* A directory the pod writes to ("upper", "work", "fallback"), in the layer
 * when there is one. */
int csi_node_own_dir(const struct csi_node *n, const struct csi_volume *v, const char *sub,
                     char *buf, size_t size);
/* Remove a volume's directory: its layer unmounted first (the image file
 * goes with the rest). 0 when it is gone. */
int csi_node_clear_dir(const char *vdir);
/* Mount the store entry (or the fallback directory) at the volume's target
 * (which exists). */
int csi_node_mount_volume(struct csi_node *n, const struct csi_volume *v, int fd,
                          struct csi_reply *r);
/* The target directory: created when missing (CSI leaves that to the
 * plugin), refused when it is not a plain directory. */
int csi_node_prepare_target(const char *target, bool *created, struct csi_reply *r);
/* Remove what a failed publish made: the mount, the target it created,
 * the volume's private directories. */
void csi_node_undo_target(struct csi_node *n, const struct csi_volume *v, bool created);

/* ---- the calls (csi_node_publish.c, csi_node_unpublish.c, csi_node_stats.c) ---- */

int csi_node_usage_add(struct csi_node *n, const struct csi_volume *v);
void csi_node_publish(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r);
void csi_node_unpublish(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r);
void csi_node_stats(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r);

#endif
