/* What a pod compiled itself: the kernels a writable volume's upper layer
 * holds that its cache did not. Each kernel directory under
 * io.triton.cache/ that the shared copy lacks is one miss (Triton makes one
 * per kernel it compiles: <hash>/<kernel>.json beside the binary), and so is
 * each compile hash under io.vllm.cache/torch_compile_cache/ (vLLM compiles
 * a new one for a model, shape or config its cache does not hold). A hit
 * writes nothing (Triton's makedirs of an existing key directory does not
 * copy it up), so the count is exact for Triton; a directory copied up for
 * another file (a launcher library added beside a kept kernel) is no miss.
 *
 * The upper layer is the pod's: it is read through descriptors without
 * following links, each JSON file capped, the walk capped. */
#ifndef GKM_CACHE_MISSES_H
#define GKM_CACHE_MISSES_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define CACHE_MISSES_NAMES 5
#define CACHE_MISSES_WALK_MAX 20000 /* directory entries read at most */

struct cache_misses {
	unsigned kernels; /* kernel directories and vLLM compile hashes the pod added */
	/* the first few, "add_kernel (cuda 90)" or "vllm 1a2b3c4d5e" */
	size_t nnames;
	char names[CACHE_MISSES_NAMES][160];
	int truncated; /* the walk stopped at CACHE_MISSES_WALK_MAX */
};

/* Count into out what upper (a directory: the volume's upper layer, or an
 * onMiss "empty" directory) holds that lower (the cache's tree; -1: none,
 * everything is a miss) does not. Both are directory descriptors. 0, or
 * -errno when upper cannot be read (a missing io.*.cache is 0 misses). */
__attribute__((warn_unused_result)) int cache_misses_count(int upper, int lower,
                                                           struct cache_misses *out);

/* The same for one volume: own (the path of its upper layer or onMiss
 * "empty" directory, opened without following links) against the tree of
 * the cache's view (root, ns, name) at digest; digest NULL: no tree, every
 * kernel is a miss. 0, or -errno when either cannot be opened. */
__attribute__((warn_unused_result)) int cache_misses_of_volume(const char *root, const char *ns,
                                                               const char *name, const char *digest,
                                                               const char *own,
                                                               struct cache_misses *out);

/* Add m to o as misses (a number) and missedKernels (the names, when any),
 * as node reports and usage records write them. false when out of memory. */
bool cache_misses_json(const struct cache_misses *m, cJSON *o);

#endif
