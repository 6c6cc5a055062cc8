#include "pod_volumes.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "kube_client.h"
#include "objstore.h"
#include "oci_ref.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	errbuf_vset(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* A member that is absent or null reads as NULL. */
static const cJSON *member(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	return cJSON_IsNull(v) ? NULL : v;
}

/* An optional object member: 0 with *out NULL when absent, -EINVAL when of
 * another type. */
static int opt_object(const cJSON *o, const char *name, const char *where, const cJSON **out,
                      char *err, size_t errlen)
{
	const cJSON *v = member(o, name);
	if (v && !cJSON_IsObject(v))
		return fail(err, errlen, "%s%s must be an object", where, name);
	*out = v;
	return 0;
}

static int opt_string(const cJSON *o, const char *name, const char *where, const char **out,
                      char *err, size_t errlen)
{
	const cJSON *v = member(o, name);
	if (v && !cJSON_IsString(v))
		return fail(err, errlen, "%s%s must be a string", where, name);
	*out = v ? v->valuestring : "";
	return 0;
}

/* volumeAttributes of a csi.gkm.io volume: the cache it names. */
static int read_csi(const cJSON *csi, const char *where, const char *pod_ns, struct pod_volume *v,
                    char *err, size_t errlen)
{
	char w[112];
	const cJSON *attrs = NULL, *a;
	const char *name = NULL, *ns = NULL;
	snprintf(w, sizeof(w), "%scsi.", where);
	if (opt_object(csi, "volumeAttributes", w, &attrs, err, errlen))
		return -EINVAL;
	cJSON_ArrayForEach(a, attrs)
	{
		const char **slot = NULL;
		if (!cJSON_IsString(a))
			return fail(err, errlen, "%scsi.volumeAttributes must be a map of strings",
			            where);
		if (!strcmp(a->string, "cacheName") || !strcmp(a->string, "csi.gkm.io/GKMCache"))
			slot = &name;
		else if (!strcmp(a->string, "cacheNamespace") ||
		         !strcmp(a->string, "csi.gkm.io/namespace"))
			slot = &ns;
		if (!slot)
			continue;
		if (*slot && strcmp(*slot, a->valuestring) != 0)
			return fail(
			    err, errlen,
			    "%sthe cache is named twice, differently (cacheName and "
			    "csi.gkm.io/GKMCache, or cacheNamespace and csi.gkm.io/namespace)",
			    where);
		*slot = a->valuestring;
	}
	if (!name || !name[0])
		return fail(err, errlen,
		            "%sa " POD_CSI_DRIVER " volume needs volumeAttributes.cacheName",
		            where);
	if (!kube_valid_subdomain(name))
		return fail(err, errlen,
		            "%scacheName '%.64s' is not a cache name (lower-case DNS-1123 "
		            "subdomain)",
		            where, name);
	if (ns && ns[0] && !obj_valid_label(ns))
		return fail(err, errlen,
		            "%scacheNamespace '%.64s' is not a namespace (lower-case DNS-1123 "
		            "label)",
		            where, ns);
	if (ns && ns[0] && strcmp(ns, pod_ns) != 0)
		return fail(err, errlen,
		            "%sGKMCache %s/%s is in another namespace; a pod may mount only a "
		            "GKMCache of its own namespace (%s) or a ClusterGKMCache",
		            where, ns, name, pod_ns);
	v->mount = POD_MOUNT_CSI;
	v->cache_name = name;
	v->cache_namespace = ns ? ns : "";
	v->attributes = attrs;
	return 0;
}

/* One entry of spec.volumes: 1 when it may mount a cache (filled into v),
 * 0 when not, -EINVAL when malformed. */
static int read_volume(const cJSON *vol, int i, const char *pod_ns, struct pod_volume *v, char *err,
                       size_t errlen)
{
	char where[96], csi_where[112], image_where[112];
	const cJSON *csi = NULL, *image = NULL, *pvc = NULL;
	const char *driver = NULL, *ref = NULL, *claim = NULL;
	if (!cJSON_IsObject(vol))
		return fail(err, errlen, "spec.volumes[%d] must be an object", i);
	const cJSON *n = member(vol, "name");
	if (!cJSON_IsString(n) || !n->valuestring[0])
		return fail(err, errlen, "spec.volumes[%d].name must be a non-empty string", i);
	snprintf(where, sizeof(where), "spec.volumes[%d] (%.63s): ", i, n->valuestring);
	snprintf(csi_where, sizeof(csi_where), "%scsi.", where);
	snprintf(image_where, sizeof(image_where), "%simage.", where);
	if (opt_object(vol, "csi", where, &csi, err, errlen) ||
	    opt_object(vol, "image", where, &image, err, errlen) ||
	    opt_string(csi, "driver", csi_where, &driver, err, errlen) ||
	    opt_string(image, "reference", image_where, &ref, err, errlen) ||
	    opt_object(vol, "persistentVolumeClaim", where, &pvc, err, errlen) ||
	    opt_string(pvc, "claimName", where, &claim, err, errlen))
		return -EINVAL;
	memset(v, 0, sizeof(*v));
	v->index = i;
	v->name = n->valuestring;
	if (csi && strcmp(driver, POD_CSI_DRIVER) == 0)
		return read_csi(csi, where, pod_ns, v, err, errlen) ? -EINVAL : 1;
	if (pvc && !csi && !image) { /* a cache's claim, or not: the catalog tells */
		if (!claim[0])
			return 0;
		v->mount = POD_MOUNT_CLAIM;
		v->claim = claim;
		return 1;
	}
	/* without a reference the API server refuses the pod; nothing to mount */
	if (csi || !image || !ref[0])
		return 0;
	if (strlen(ref) > OCI_REF_MAX)
		return fail(err, errlen, "%simage.reference is longer than %d characters", where,
		            OCI_REF_MAX);
	v->mount = POD_MOUNT_IMAGE;
	v->reference = ref;
	return 1;
}

int pod_info_read(const cJSON *object, const char *ns, struct pod_info *out, char *err,
                  size_t errlen)
{
	struct pod_info p = {0};
	const cJSON *md = NULL, *spec = NULL, *vols = NULL;
	if (!cJSON_IsObject(object))
		return fail(err, errlen, "request.object must be a Pod object");
	if (!ns || !ns[0])
		return fail(err, errlen, "a Pod review needs request.namespace");
	p.namespace_ = ns;
	if (opt_object(object, "metadata", "", &md, err, errlen) ||
	    opt_string(md, "name", "metadata.", &p.name, err, errlen) ||
	    opt_string(md, "generateName", "metadata.", &p.generate_name, err, errlen) ||
	    opt_object(md, "labels", "metadata.", &p.labels, err, errlen) ||
	    opt_object(md, "annotations", "metadata.", &p.annotations, err, errlen) ||
	    opt_object(object, "spec", "", &spec, err, errlen) ||
	    opt_object(spec, "affinity", "spec.", &p.affinity, err, errlen))
		return -EINVAL;
	p.has_metadata = md != NULL;
	if (!spec)
		return fail(err, errlen, "a Pod needs a spec");
	vols = member(spec, "volumes");
	if (vols && !cJSON_IsArray(vols))
		return fail(err, errlen, "spec.volumes must be a list");
	int nvols = cJSON_GetArraySize(vols);
	if (nvols > POD_VOLUMES_MAX)
		return fail(err, errlen, "spec.volumes has %d entries; at most %d are reviewed",
		            nvols, POD_VOLUMES_MAX);
	const cJSON *v;
	int i = 0;
	cJSON_ArrayForEach(v, vols)
	{
		struct pod_volume pv;
		int rc = read_volume(v, i++, ns, &pv, err, errlen);
		if (rc < 0)
			goto fail;
		if (rc == 0)
			continue;
		if (p.n == POD_CACHE_VOLUMES_MAX) {
			fail(err, errlen, "more than %d volumes mount caches or images",
			     POD_CACHE_VOLUMES_MAX);
			goto fail;
		}
		if (!p.vols && !(p.vols = calloc(POD_CACHE_VOLUMES_MAX, sizeof(*p.vols))))
			return -ENOMEM;
		p.vols[p.n++] = pv;
	}
	*out = p;
	return 0;
fail:
	free(p.vols);
	return -EINVAL;
}

void pod_info_clear(struct pod_info *p)
{
	free(p->vols);
	memset(p, 0, sizeof(*p));
}

void pod_info_display(const struct pod_info *p, char *buf, size_t len)
{
	if (p->name[0])
		snprintf(buf, len, "%s/%s", p->namespace_, p->name);
	else
		snprintf(buf, len, "%s/%s*", p->namespace_,
		         p->generate_name[0] ? p->generate_name : "(unnamed)");
}
