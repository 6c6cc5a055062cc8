/* Link-safe directory-tree helpers (see fstree.h). */
#include "fstree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int have_openat2 = 1; /* cleared on ENOSYS; a benign race at worst */

static int open_dir_walk(int dirfd, const char *rel)
{
	char comp[256];
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	const char *p = rel;
	while (*p) {
		while (*p == '/')
			p++;
		size_t n = strcspn(p, "/");
		if (n == 0)
			break;
		if (n >= sizeof(comp)) {
			close(fd);
			return -ENAMETOOLONG;
		}
		memcpy(comp, p, n);
		comp[n] = '\0';
		p += n;
		if (strcmp(comp, ".") == 0)
			continue;
		if (strcmp(comp, "..") == 0) {
			close(fd);
			return -EXDEV;
		}
		int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int e = errno;
		close(fd);
		if (next < 0)
			return e == ENOTDIR ? -ENOTDIR : -e;
		fd = next;
	}
	return fd;
}

int fstree_open_dir(int dirfd, const char *rel)
{
	if (rel == NULL || rel[0] == '\0')
		rel = ".";
	if (have_openat2) {
		struct open_how how = {
		    .flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
		    .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
		};
		long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
		if (fd >= 0)
			return (int)fd;
		if (errno != ENOSYS)
			return errno == EAGAIN ? open_dir_walk(dirfd, rel) : -errno;
		have_openat2 = 0;
	}
	return open_dir_walk(dirfd, rel);
}

int fstree_opendir(int fd, DIR **out)
{
	(void)lseek(fd, 0, SEEK_SET);
	int dup_fd = dup(fd);
	if (dup_fd < 0)
		return -errno;
	DIR *d = fdopendir(dup_fd);
	if (d == NULL) {
		int e = errno;
		close(dup_fd);
		return -e;
	}
	*out = d;
	return 0;
}

bool fstree_dot(const char *name)
{
	return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

static int empty_fd(int fd);

int fstree_remove(int dirfd, const char *name)
{
	if (unlinkat(dirfd, name, 0) == 0)
		return 0;
	if (errno == ENOENT)
		return 0;
	if (errno != EISDIR && errno != EPERM)
		return -errno;
	/* A directory (EISDIR on Linux; EPERM elsewhere). Make it searchable
	 * and writable so its entries can go, without following a link. */
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == EACCES) {
		if (fchmodat(dirfd, name, 0700, 0) == 0)
			fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	struct stat st;
	if (fstat(fd, &st) == 0 && (st.st_mode & 0700) != 0700)
		(void)fchmod(fd, (st.st_mode & 07777) | 0700);
	int rc = empty_fd(fd);
	close(fd);
	if (rc < 0)
		return rc;
	if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

/* Empties fd; does not close it. Entries removed while reading may make
 * some filesystems skip others, so passes repeat until one finds nothing. */
static int empty_fd(int fd)
{
	for (;;) {
		DIR *d;
		int rc = fstree_opendir(fd, &d);
		if (rc < 0)
			return rc;
		size_t removed = 0;
		struct dirent *de;
		for (errno = 0; (de = readdir(d)) != NULL; errno = 0) {
			if (fstree_dot(de->d_name))
				continue;
			rc = fstree_remove(fd, de->d_name);
			if (rc < 0)
				break;
			removed++;
		}
		if (rc == 0 && errno != 0)
			rc = -errno;
		closedir(d);
		if (rc < 0 || removed == 0)
			return rc;
	}
}

int fstree_empty(int dirfd)
{
	return empty_fd(dirfd);
}

/* Inode numbers of multiply-linked files already counted. */
struct inoset {
	uint64_t *slot;
	size_t cap, n;
};

static int inoset_add(struct inoset *s, uint64_t ino, bool *added)
{
	if ((s->n + 1) * 2 > s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 256;
		uint64_t *ns = calloc(ncap, sizeof(*ns));
		if (ns == NULL)
			return -ENOMEM;
		for (size_t i = 0; i < s->cap; i++) {
			if (s->slot[i] == 0)
				continue;
			size_t j = (s->slot[i] * 0x9E3779B97F4A7C15ull) & (ncap - 1);
			while (ns[j] != 0)
				j = (j + 1) & (ncap - 1);
			ns[j] = s->slot[i];
		}
		free(s->slot);
		s->slot = ns;
		s->cap = ncap;
	}
	uint64_t key = ino + 1; /* 0 marks a free slot */
	size_t j = (key * 0x9E3779B97F4A7C15ull) & (s->cap - 1);
	while (s->slot[j] != 0) {
		if (s->slot[j] == key) {
			*added = false;
			return 0;
		}
		j = (j + 1) & (s->cap - 1);
	}
	s->slot[j] = key;
	s->n++;
	*added = true;
	return 0;
}

static int walk_fd(int fd, int sync, struct fstree_usage *u, struct inoset *seen, int depth)
{
	if (depth > 4096)
		return -ELOOP;
	DIR *d;
	int rc = fstree_opendir(fd, &d);
	if (rc < 0)
		return rc;
	struct dirent *de;
	for (errno = 0; (de = readdir(d)) != NULL; errno = 0) {
		if (fstree_dot(de->d_name))
			continue;
		struct stat st;
		if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			rc = -errno;
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			u->dirs++;
			int sub =
			    openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0) {
				rc = -errno;
				break;
			}
			rc = walk_fd(sub, sync, u, seen, depth + 1);
			close(sub);
			if (rc < 0)
				break;
		} else if (S_ISLNK(st.st_mode)) {
			u->symlinks++;
		} else if (S_ISREG(st.st_mode)) {
			bool first = true;
			if (st.st_nlink > 1 &&
			    (rc = inoset_add(seen, (uint64_t)st.st_ino, &first)) < 0)
				break;
			if (first) {
				u->files++;
				u->bytes += (uint64_t)st.st_size;
			}
			if (sync && first) {
				int f = openat(fd, de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
				if (f < 0 || fsync(f) < 0) {
					rc = -errno;
					if (f >= 0)
						close(f);
					break;
				}
				close(f);
			}
		}
	}
	if (rc == 0 && errno != 0)
		rc = -errno;
	if (rc == 0 && sync && fsync(fd) < 0)
		rc = -errno;
	closedir(d);
	return rc;
}

int fstree_walk(int dirfd, int sync, struct fstree_usage *out)
{
	struct fstree_usage u = {0};
	struct inoset seen = {0};
	int rc = walk_fd(dirfd, sync, &u, &seen, 0);
	free(seen.slot);
	if (rc == 0)
		*out = u;
	return rc;
}
