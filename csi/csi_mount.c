#include "csi_mount.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

enum { MAX_STACKED = 16, FTW_FDS = 32 };

/* /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape_mountinfo(char *s)
{
	char *w = s;
	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = '\0';
}

/* Fallback for kernels without STATX_ATTR_MOUNT_ROOT (before 5.8). */
static int mountinfo_has(const char *path)
{
	char *canon = realpath(path, NULL);
	if (!canon)
		return -errno;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f) {
		int e = -errno;
		free(canon);
		return e;
	}
	char *line = NULL;
	size_t cap = 0;
	int found = 0;
	while (!found && getline(&line, &cap, f) > 0) {
		/* id parent major:minor root mountpoint ... */
		char *save = NULL, *tok = strtok_r(line, " ", &save);
		for (int i = 0; tok && i < 4; i++)
			tok = strtok_r(NULL, " ", &save);
		if (!tok)
			continue;
		unescape_mountinfo(tok);
		found = strcmp(tok, canon) == 0;
	}
	free(line);
	fclose(f);
	free(canon);
	return found;
}

int csi_mount_is_mountpoint(const char *path)
{
	struct statx stx;
	if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, STATX_TYPE, &stx) != 0)
		return -errno;
	if (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT)
		return (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) ? 1 : 0;
	return mountinfo_has(path);
}

static int fd_path(char *buf, size_t size, int fd)
{
	int n = snprintf(buf, size, "/proc/self/fd/%d", fd);
	return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

int csi_mount_bind(int src_fd, const char *target, bool read_only)
{
	char src[64];
	int rc = fd_path(src, sizeof(src), src_fd);
	if (rc)
		return rc;
	/* The source is the descriptor's directory itself (the /proc link is
	 * resolved by the kernel), so no path is looked up twice. */
	if (mount(src, target, NULL, MS_BIND, NULL) != 0)
		return -errno;
	/* A bind mount takes its flags only from a remount. */
	unsigned long ro = read_only ? MS_RDONLY : 0;
	if (mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | ro | MS_NOSUID | MS_NODEV, NULL) !=
	    0) {
		rc = -errno;
		if (umount2(target, UMOUNT_NOFOLLOW) != 0)
			umount2(target, MNT_DETACH | UMOUNT_NOFOLLOW);
		return rc;
	}
	return 0;
}

static bool option_safe(const char *s)
{
	return !strpbrk(s, ",:\\=");
}

int csi_mount_overlay(int lower_fd, const char *upper, const char *work, const char *target)
{
	char lower[64], opts[3 * PATH_MAX];
	int rc = fd_path(lower, sizeof(lower), lower_fd);
	if (rc)
		return rc;
	if (!option_safe(upper) || !option_safe(work))
		return -EINVAL;
	/* "volatile" (Linux 5.10+): the upper layer is scratch space thrown away
	 * at unpublish, so overlayfs need not sync it (an unmount would
	 * otherwise sync the whole file system under it). Older kernels refuse
	 * the option: mount again without it. */
	int n = snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s,volatile", lower,
	                 upper, work);
	if (n < 0 || (size_t)n >= sizeof(opts))
		return -ENAMETOOLONG;
	if (mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, opts) == 0)
		return 0;
	if (errno != EINVAL)
		return -errno;
	opts[n - (int)strlen(",volatile")] = '\0';
	if (mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, opts) != 0)
		return -errno;
	return 0;
}

int csi_mount_unmount(const char *target)
{
	for (int i = 0; i < MAX_STACKED; i++) {
		int m = csi_mount_is_mountpoint(target);
		if (m == -ENOENT || m == 0)
			return 0;
		if (m < 0)
			return m;
		if (umount2(target, UMOUNT_NOFOLLOW) == 0)
			continue;
		int e = errno;
		if (e == EBUSY) {
			/* Something still holds it (a process that outlived its
			 * pod): detach now, the kernel finishes when it lets go. */
			log_warn("mount busy, detaching lazily", "target", target);
			if (umount2(target, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
				continue;
			e = errno;
		}
		if (e != EINVAL && e != ENOENT)
			return -e;
	}
	int m = csi_mount_is_mountpoint(target);
	return (m == 0 || m == -ENOENT) ? 0 : -EBUSY;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	int rc = (type == FTW_DP || type == FTW_D) ? rmdir(path) : unlink(path);
	if (rc != 0 && errno != ENOENT)
		return errno;
	return 0;
}

int csi_mount_remove_tree(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlink(path) == 0 ? 0 : -errno;
	/* Overlay work directories hold a mode 000 "work" directory: as root
	 * that is no obstacle; FTW_DEPTH removes children before parents. */
	int rc = nftw(path, remove_entry, FTW_FDS, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
	if (rc > 0)
		return -rc;
	if (rc < 0)
		return errno == ENOENT ? 0 : -errno;
	return 0;
}

/* nftw has no user pointer; each walk runs on one thread. */
static __thread uint64_t walk_bytes, walk_inodes;

static int count_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)path;
	(void)ftw;
	if (type == FTW_NS)
		return 0;
	walk_inodes++;
	walk_bytes += (uint64_t)st->st_blocks * 512u;
	return 0;
}

int csi_mount_tree_usage(const char *path, uint64_t *bytes, uint64_t *inodes)
{
	walk_bytes = walk_inodes = 0;
	errno = 0;
	if (nftw(path, count_entry, FTW_FDS, FTW_PHYS | FTW_MOUNT) != 0)
		return errno ? -errno : -EIO;
	*bytes = walk_bytes;
	*inodes = walk_inodes;
	return 0;
}
