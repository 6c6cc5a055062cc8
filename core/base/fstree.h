/* Directory-tree helpers that never follow a symlink: everything is done
 * relative to a directory fd, with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW, and
 * paths are resolved with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS. Shared by the
 * extractor and the content store. */
#ifndef GKM_FSTREE_H
#define GKM_FSTREE_H

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Open directory rel (a relative path, "" or "." for dirfd itself) beneath
 * dirfd, refusing any symlink on the way (-ELOOP) and any escape (-EXDEV).
 * Returns the new fd (O_RDONLY|O_DIRECTORY|O_CLOEXEC, caller closes) or
 * -errno. Falls back to a component walk where openat2 is missing. */
__attribute__((warn_unused_result)) int fstree_open_dir(int dirfd, const char *rel);

/* Remove name under dirfd, recursively if it is a directory, never leaving
 * the tree through a link (symlinks are unlinked, not followed). Directories
 * without write permission are made writable first. 0 if removed or absent,
 * else -errno. Recursion depth is bounded by the tree's depth. */
__attribute__((warn_unused_result)) int fstree_remove(int dirfd, const char *name);

/* Remove every entry inside directory fd dirfd (the directory stays). */
__attribute__((warn_unused_result)) int fstree_empty(int dirfd);

/* A DIR stream over a duplicate of directory fd (rewound to the start);
 * caller closes it with closedir() (fd itself stays open). */
__attribute__((warn_unused_result)) int fstree_opendir(int fd, DIR **out);

/* "." or "..". */
bool fstree_dot(const char *name);

struct fstree_usage {
	uint64_t bytes; /* regular-file sizes; hard-linked files count once */
	uint64_t files;
	uint64_t dirs; /* not counting the top */
	uint64_t symlinks;
};

/* Walk the tree under directory fd dirfd, adding up usage into *out and, if
 * sync is non-zero, fsync(2)ing every regular file and directory (the top
 * included). 0 or -errno. */
__attribute__((warn_unused_result)) int fstree_walk(int dirfd, int sync, struct fstree_usage *out);

#endif
