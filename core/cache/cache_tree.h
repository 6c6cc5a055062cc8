/* Uniting cache trees: what `gkm cache merge` does with caches built for
 * different GPUs, and what a capture does to give a command a writable
 * copy of a base cache when it cannot mount an overlay.
 *
 * Trees here are gkm's own extractions (the safe extractor wrote them), so
 * symlinks that stay inside are copied as links; anything but regular
 * files, directories and such links is refused. */
#ifndef GKM_CACHE_TREE_H
#define GKM_CACHE_TREE_H

#include "oci_err.h"

/* Copy every entry of src into dst (a directory that exists). A file dst
 * already holds with the same bytes is left alone; one with other bytes is
 * -EEXIST, err naming the path (relative to the trees) and src_name, so two
 * caches never merge silently into one that holds only one of them. Modes
 * and modification times are kept. */
__attribute__((warn_unused_result)) int cache_tree_unite(const char *src, const char *dst,
                                                         const char *src_name, struct oci_err *err);

/* Copy an overlay's upper layer src into dst (an empty directory on another
 * file system) as it is: as cache_tree_unite, and every kind of entry
 * (whiteouts: what the writer deleted from the layer below; devices, FIFOs),
 * set-id bits and hard links kept, so that what judges the copy (a capture)
 * sees what the writer left. Holes stay holes, here as in cache_tree_unite. */
__attribute__((warn_unused_result)) int cache_tree_copy_layer(const char *src, const char *dst,
                                                              struct oci_err *err);

#endif
