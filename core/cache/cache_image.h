/* Kernel cache images in the MCV/TCV format (see DESIGN.md, section 6):
 * reading what a Triton or vLLM cache directory holds, packaging it into
 * an image (one squashed tar+gzip layer with io.<fmt>.cache/ and
 * io.<fmt>.manifest/manifest.json, config labels cache.<fmt>.image/...),
 * and reading the same facts back out of a layer.
 *
 * Everything the labels say is computed from the cache's own JSON:
 * Triton kernel metadata (<hash dir>/<kernel>.json with target{backend,
 * arch, warp_size}, ptx_version, num_warps...), vLLM cache_key_factors.json
 * (VLLM_TARGET_DEVICE, VLLM_MAIN_CUDA_VERSION, the save format) and the
 * Triton caches vLLM keeps under torch_compile_cache/<hash>/rank_N/.
 *
 * Triton group files (__grp__<kernel>.json) written by older Triton hold
 * absolute paths of the build host, so such a cache only hits when mounted
 * at that same path: the scan counts them, and packaging can rewrite them
 * to the bare file names newer Triton writes (and resolves in its cache dir). */
#ifndef GKM_CACHE_IMAGE_H
#define GKM_CACHE_IMAGE_H

#include <stdbool.h>
#include <stdint.h>

#include <cJSON.h>

#include "oci_blob.h"
#include "oci_err.h"
#include "oci_repo.h"

enum cache_format { CACHE_AUTO = 0, CACHE_TRITON, CACHE_VLLM };

#define CACHE_JSON_MAX (1u << 20) /* metadata files larger than this are not parsed */

/* What a cache holds, accumulated file by file. */
struct cache_meta {
	enum cache_format format;
	cJSON *
	    targets; /* array of unique {backend, arch, warp_size[, ptx_version][, cuda_version]} */
	cJSON *kernels;           /* array of manifest entries, one per kernel metadata file */
	cJSON *vllm;              /* vLLM: object hash -> manifest entry */
	uint64_t entries;         /* the entry-count label: Triton kernels, or vLLM hash dirs */
	uint64_t files;           /* regular files */
	uint64_t bytes;           /* their bytes: the cache-size-bytes label */
	uint64_t groups;          /* __grp__*.json files */
	uint64_t abs_groups;      /* ... of which name absolute paths */
	char abs_group_root[512]; /* the build-host cache dir the first of them names */
	char vllm_format[16];     /* "binary", "unpacked" or "triton" */
	/* Untrusted walks: a mix of every file's path, size and modification
	 * time. Two walks of a tree with equal stamps saw the same files. */
	uint64_t stamp;
};

/* Initialise (allocates the JSON containers). Release with cache_meta_clear(). */
__attribute__((warn_unused_result)) int cache_meta_init(struct cache_meta *m, enum cache_format f);
void cache_meta_clear(struct cache_meta *m);
/* Account one regular file at relpath (relative to the cache root). data
 * (may be NULL) is its content when it is a small .json file. */
void cache_meta_add(struct cache_meta *m, const char *relpath, uint64_t size, const char *data,
                    size_t len);

/* "auto" guess for a directory: vllm when it has torch_compile_cache/. */
enum cache_format cache_detect_format(const char *dir);
const char *cache_format_name(enum cache_format f); /* "triton", "vllm" */

/* How a directory is walked. NULL rules (gkm cache build) trust the tree:
 * symlinks that stay inside it are packaged, nothing is capped. Untrusted
 * rules (captures: files a command or a pod wrote) take only regular files
 * and directories, each opened beneath the root without following links:
 *   - symlinks, devices, FIFOs, sockets, overlay whiteouts (files deleted
 *     from a base), set-id bits and files with several names are refused,
 *     the message naming the path and the rule;
 *   - more than max_files entries (counted while directories are read, so a
 *     million files stop the walk at the cap) or more than max_bytes of file
 *     sizes (a sparse file counts its size) is -E2BIG / -EFBIG, before any
 *     of it is read;
 *   - a file whose size or modification time changes while it is read (a
 *     writer still at work) is -EAGAIN.
 * unchanged_from (may be NULL): files identical, path and bytes, to the file
 * at the same path under this directory are left out (a capture on top of
 * a copied base). */
struct cache_walk_rules {
	bool untrusted;
	uint64_t max_files; /* 0: no cap */
	uint64_t max_bytes; /* 0: no cap */
	const char *unchanged_from;
};

/* Walk dir (no symlinks followed) and fill m. -EINVAL + err for a
 * directory that holds no recognisable cache of format f, or entries that
 * cannot be packaged (sockets, devices, links leaving the tree). With
 * allow_empty a tree without kernel metadata is fine (the files a capture
 * added to a base may be support files only). */
__attribute__((warn_unused_result)) int cache_scan_dir(const char *dir, enum cache_format f,
                                                       const struct cache_walk_rules *rules,
                                                       bool allow_empty, struct cache_meta *m,
                                                       struct oci_err *err);

/* What cache_scan_dir() refuses without allow_empty, for a tree it scanned
 * with it: 0, or -EINVAL + err. */
__attribute__((warn_unused_result)) int
cache_scan_check_found(const char *dir, const struct cache_meta *m, struct oci_err *err);

/* The summary label value ({"targets":[...]}); caller frees. */
char *cache_summary_json(const struct cache_meta *m);
/* The identity label value: the runtime versions the cache was compiled by,
 * as its own files say ({"triton":["3.4.0"],"vllmCodeHash":[...],
 * "vllmCompilerHash":[...]}, keys only where found); NULL when none (or out
 * of memory). A cache hits only under the same runtime. Caller frees. */
char *cache_identity_json(const struct cache_meta *m);
/* The io.<fmt>.manifest/manifest.json document; caller frees. */
char *cache_manifest_json(const struct cache_meta *m);
/* Set the cache.<fmt>.image/... labels on labels (a JSON object). */
__attribute__((warn_unused_result)) int cache_set_labels(const struct cache_meta *m, cJSON *labels);

struct cache_build_opts {
	enum cache_format format;
	bool rewrite_group_paths;
	int64_t source_date_epoch; /* <0: each file's own mtime; image "created" = newest mtime */
	int level;                 /* gzip effort 0..3 (isa-l levels); default 1 */
	const char *platform;      /* os/arch for the config; NULL: linux/<this machine> */
	cJSON *extra_labels;       /* borrowed; copied into the config */
	const struct cache_walk_rules *rules; /* borrowed; NULL: a trusted directory */
	/* Layer on top of an image (borrowed; NULL: a one-layer image): its
	 * layers come first, copied from base_repo into the target repository
	 * when it lacks them (the same repository or registry sends nothing),
	 * its config is kept with the new layer added, and the labels and the
	 * layer's manifest.json describe image_meta, the whole tree as a
	 * container runtime unpacks it. */
	const struct oci_image *base;
	struct oci_repo *base_repo;
	const struct cache_meta *image_meta;
	/* List the first list_files regular files the layer holds, in the
	 * walk's (sorted) order, with their digests, in res->files: what the
	 * layer itself read, so nobody has to open the tree again. */
	size_t list_files;
};
void cache_build_opts_init(struct cache_build_opts *o);

struct cache_build_result {
	char digest[OCI_DIGEST_MAX]; /* the manifest */
	char layer_digest[OCI_DIGEST_MAX];
	char diff_id[OCI_DIGEST_MAX];
	uint64_t layer_size, tar_size;
	int64_t created;
	char *layer_path;       /* the layer, written but not stored yet */
	struct cache_meta meta; /* what the new layer holds */
	cJSON *files; /* [{path ("io.triton.cache/..."), digest}] (opts.list_files), owned */
};
/* Remove the layer file and release meta and files. */
void cache_build_result_clear(struct cache_build_result *res);

/* Package dir into an image and store it in repo under tag: the layer is
 * written (cache_build_layer), then blobs are stored and the manifest last
 * (cache_build_push), so a failure leaves no manifest naming missing blobs.
 * Release res with cache_build_result_clear(). */
__attribute__((warn_unused_result)) int
cache_build(const char *dir, const struct cache_build_opts *o, struct oci_repo *repo,
            const char *tag, struct cache_build_result *res, struct oci_err *err);
/* The two halves, for callers that check the layer's content (res->meta)
 * before anything leaves the machine. */
__attribute__((warn_unused_result)) int cache_build_layer(const char *dir,
                                                          const struct cache_build_opts *o,
                                                          struct cache_build_result *res,
                                                          struct oci_err *err);
__attribute__((warn_unused_result)) int cache_build_push(const struct cache_build_opts *o,
                                                         struct cache_build_result *res,
                                                         struct oci_repo *repo, const char *tag,
                                                         struct oci_err *err);

/* Read a cache layer (tar, tar+gzip or tar+zstd) from r to its verified end
 * and fill m from the files under io.triton.cache/ or io.vllm.cache/
 * (format from the paths when m->format is CACHE_AUTO). manifest_out (may
 * be NULL) receives io.<fmt>.manifest/manifest.json when present (caller
 * frees). The reader is consumed, not closed. */
__attribute__((warn_unused_result)) int cache_scan_layer(struct oci_blob_reader *r,
                                                         struct cache_meta *m, char **manifest_out,
                                                         struct oci_err *err);

#endif
