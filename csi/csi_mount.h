/* The mounts the CSI plugin makes: a read-only bind of a store entry, a
 * private overlay with the store entry as its read-only lower layer, or a
 * bind of a private fallback directory. Plus the
 * small file-system helpers publish/unpublish/stats need. All functions
 * return 0 (or the documented value) or -errno, and are thread-safe. */
#ifndef GKM_CSI_MOUNT_H
#define GKM_CSI_MOUNT_H

#include <stdbool.h>
#include <stdint.h>

/* 1 if path is the root of a mount, 0 if not, -ENOENT if it does not exist. */
__attribute__((warn_unused_result)) int csi_mount_is_mountpoint(const char *path);

/* Bind the directory open as src_fd (an O_PATH descriptor is enough) at
 * target, an existing directory, nosuid and nodev, read-only unless
 * read_only is false. On failure nothing stays mounted. */
__attribute__((warn_unused_result)) int csi_mount_bind(int src_fd, const char *target,
                                                       bool read_only);

/* Mount an overlay at target: lower_fd's directory below (never written),
 * upper and work (existing empty directories on one file system) above,
 * nosuid and nodev, never synced (the upper layer is scratch space).
 * -EINVAL when upper or work hold characters the overlay option syntax
 * cannot carry (',' ':' '\\' '='). */
__attribute__((warn_unused_result)) int csi_mount_overlay(int lower_fd, const char *upper,
                                                          const char *work, const char *target);

/* Unmount everything mounted on target (stacked mounts too, bounded), lazily
 * when busy. 0 when nothing is mounted there afterwards, also when target
 * does not exist. Never follows a symlink at target. */
__attribute__((warn_unused_result)) int csi_mount_unmount(const char *target);

/* rm -rf path without following symlinks or crossing into other mounts.
 * 0 when it is gone (also when it never existed). */
__attribute__((warn_unused_result)) int csi_mount_remove_tree(const char *path);

/* Space (allocated bytes) and inodes (every entry, the top directory
 * included) used by the tree at path, not crossing mounts. */
__attribute__((warn_unused_result)) int csi_mount_tree_usage(const char *path, uint64_t *bytes,
                                                             uint64_t *inodes);

#endif
