/* A size-limited layer for what a pod writes into its volume (a writable
 * overlay's upper and work directories, an onMiss "empty" directory): a
 * sparse image file of the limit's size beside the volume's other state,
 * formatted ext4 (no journal: the layer is scratch space, discarded or
 * handed over at unpublish) and mounted through a loop device that is
 * released with the unmount. A pod that writes past the limit gets ENOSPC
 * from the kernel, at once; the node's disk, the store and every other
 * volume are untouched, and the node holds only the blocks written.
 *
 * Why a loop file system and not a project quota: quotas need the node's
 * file system mounted with them (XFS pquota, ext4 prjquota and a kernel
 * with CONFIG_QUOTA), which most nodes are not; a loop device and mke2fs
 * are on every node. Why not the plugin's own accounting: it sees a pod
 * over its limit only after the fact, and can only make the volume
 * read-only (EROFS), not refuse the write that goes over.
 *
 * All functions return 0 or -errno; they need CAP_SYS_ADMIN (the CSI
 * container is privileged). */
#ifndef GKM_CSI_LAYER_H
#define GKM_CSI_LAYER_H

#include <stddef.h>
#include <stdint.h>

/* Make the image file img (must not exist) of bytes, format it, and mount
 * it at dir (an existing empty directory), nosuid, nodev. On failure
 * nothing is left mounted or attached, img is removed, and err says which
 * step failed. */
__attribute__((warn_unused_result)) int csi_layer_mount(const char *img, uint64_t bytes,
                                                        const char *dir, char *err, size_t errlen);

#endif
