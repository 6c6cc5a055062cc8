#include "csi_layer.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "errbuf.h"

#define LOOP_MAJOR 7
#define LAYER_MIN_BYTES (1u << 20) /* mke2fs needs room for its metadata */

/* mke2fs on img: ext4, no journal, no reserved blocks, lazy tables. */
static int format(const char *img, char *err, size_t errlen)
{
	char *argv[] = {"mke2fs",
	                "-q",
	                "-F",
	                "-t",
	                "ext4",
	                "-O",
	                "^has_journal",
	                "-E",
	                "lazy_itable_init=1,nodiscard",
	                "-m",
	                "0",
	                (char *)img,
	                NULL};
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int st = 0;
	extern char **environ;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	int rc = posix_spawnp(&pid, "mke2fs", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc) {
		errbuf_set(err, errlen, "cannot run mke2fs (e2fsprogs): %s", strerror(rc));
		return -rc;
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		errbuf_set(err, errlen, "mke2fs failed on %s (status %d)", img,
		           WIFEXITED(st) ? WEXITSTATUS(st) : -1);
		return -EIO;
	}
	return 0;
}

/* A free loop device attached to backing, released when its file system is
 * unmounted. Its node is made when this /dev lacks it (a container's /dev is
 * a copy taken when it started). */
static int attach(int backing, char *dev, size_t devlen, char *err, size_t errlen)
{
	int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC), rc = 0, fd = -1;
	for (int tries = 0; tries < 8; tries++) {
		int n = ctl >= 0 ? ioctl(ctl, LOOP_CTL_GET_FREE) : -1;
		if (n < 0) {
			rc = -errno;
			errbuf_set(err, errlen, "no free loop device (/dev/loop-control): %s",
			           strerror(errno));
			break;
		}
		snprintf(dev, devlen, "/dev/loop%d", n);
		if (mknod(dev, S_IFBLK | 0660, makedev(LOOP_MAJOR, (unsigned)n)) != 0 &&
		    errno != EEXIST) {
			rc = -errno;
			errbuf_set(err, errlen, "cannot make %s: %s", dev, strerror(errno));
			break;
		}
		if ((fd = open(dev, O_RDWR | O_CLOEXEC)) < 0) {
			rc = -errno;
			errbuf_set(err, errlen, "cannot open %s: %s", dev, strerror(errno));
			break;
		}
		struct loop_config cfg;
		memset(&cfg, 0, sizeof(cfg));
		cfg.fd = (unsigned)backing;
		cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
		if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
			rc = 0;
			break;
		}
		rc = -errno;
		close(fd);
		fd = -1;
		if (rc != -EBUSY) { /* EBUSY: taken meanwhile by someone else */
			errbuf_set(err, errlen, "cannot attach %s: %s", dev, strerror(-rc));
			break;
		}
	}
	if (ctl >= 0)
		close(ctl);
	if (rc == 0 && fd < 0) {
		rc = -EBUSY;
		errbuf_set(err, errlen, "no loop device stayed free");
	}
	return rc ? rc : fd;
}

int csi_layer_mount(const char *img, uint64_t bytes, const char *dir, char *err, size_t errlen)
{
	char dev[32];
	int backing = -1, loop = -1, rc;
	if (bytes < LAYER_MIN_BYTES) {
		errbuf_set(err, errlen, "a size limit below 1Mi leaves no room for a file system");
		return -EINVAL;
	}
	backing = open(img, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (backing < 0 || ftruncate(backing, (off_t)bytes) != 0) {
		rc = -errno;
		errbuf_set(err, errlen, "cannot make %s: %s", img, strerror(errno));
		goto out;
	}
	if ((rc = format(img, err, errlen)))
		goto out;
	if ((rc = loop = attach(backing, dev, sizeof(dev), err, errlen)) < 0)
		goto out;
	rc = 0;
	if (mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "") != 0) {
		rc = -errno;
		errbuf_set(err, errlen, "cannot mount %s at %s: %s", dev, dir, strerror(errno));
		ioctl(loop, LOOP_CLR_FD, 0);
	}
out:
	if (loop >= 0)
		close(loop); /* the mount holds the device; autoclear frees it after */
	if (backing >= 0)
		close(backing);
	if (rc && backing >= 0)
		unlink(img);
	return rc;
}
