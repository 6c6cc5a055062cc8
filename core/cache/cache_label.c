#include "cache_label.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kube_client.h"
#include "objstore.h"
#include "oci_digest.h"

/* The sha256 hex digits kept, and the characters of the name kept in front
 * of them: 46 + '-' + 16 = 63. */
#define HASH_DIGITS 16
#define KEPT (CACHE_LABEL_NAME_MAX - 1 - HASH_DIGITS)

int cache_label_key(const char *ns, const char *name, char *out, size_t cap)
{
	char part[CACHE_LABEL_NAME_MAX + 1];
	bool cluster = !ns || !ns[0];
	if (cap < CACHE_LABEL_KEY_MAX)
		return -ENOSPC;
	if (!name || !kube_valid_subdomain(name) || (!cluster && !obj_valid_label(ns)))
		return -EINVAL;
	size_t n = strlen(name);
	if (n <= CACHE_LABEL_NAME_MAX) {
		memcpy(part, name, n + 1);
	} else {
		char digest[OCI_DIGEST_MAX];
		if (oci_digest_buf(name, n, digest) != 0)
			return -ENOMEM;
		size_t k = KEPT;
		/* a DNS subdomain starts with an alphanumeric: k never reaches 0 */
		while (k > 1 && (name[k - 1] == '-' || name[k - 1] == '.'))
			k--;
		memcpy(part, name, k);
		snprintf(part + k, sizeof(part) - k, "-%.*s", HASH_DIGITS,
		         digest + strlen("sha256:"));
	}
	if (cluster)
		snprintf(out, cap, "clustergkmcache.gkm.io/%s", part);
	else
		snprintf(out, cap, "%s.gkmcache.gkm.io/%s", ns, part);
	return 0;
}
