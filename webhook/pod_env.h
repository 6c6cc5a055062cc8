/* The environment a container needs to read a cache it mounts: one
 * variable per tree the image holds (core/cache/cache_env.h), pointing at
 * that tree under the container's mountPath
 * (TRITON_CACHE_DIR=<mountPath>/io.triton.cache). A container that already
 * sets one to another value keeps it; the conflict is reported, never
 * overwritten. Pure functions, no I/O. */
#ifndef GKM_POD_ENV_H
#define GKM_POD_ENV_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "cache_env.h"

/* A cache volume of the pod and the trees its image holds. */
struct pod_env_volume {
	const char *volume; /* spec.volumes[].name */
	const struct cache_env_tree *trees;
	size_t n;
	/* the containers that get the variables (NULL: every container that
	 * mounts the volume); a list of names, NULL-terminated */
	const char *const *containers;
	bool conflict; /* out: a container sets one of its variables otherwise */
};

/* Append to ops (a JSON array) the operations that give every container
 * and init container of pod (a Pod object) mounting one of vols the
 * variables of its trees. A mount with a subPath gets the trees inside it
 * (a subPath of io.triton.cache: TRITON_CACHE_DIR=<mountPath>); a tree
 * outside it is not visible there and gets nothing. Conflicts (a variable the container already
 * sets to another value) are written, "; "-separated, to warn (may be empty). 0, or -ENOMEM. */
__attribute__((warn_unused_result)) int pod_env_patch(const cJSON *pod, struct pod_env_volume *vols,
                                                      size_t n, cJSON *ops, char *warn,
                                                      size_t warnlen);

#endif
