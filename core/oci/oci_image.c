#include "oci_image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

cJSON *oci_json_parse(const char *buf, size_t len, const char *what, struct oci_err *err)
{
	const char *end = NULL;
	cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
	if (!j) {
		size_t at = end && end >= buf ? (size_t)(end - buf) : 0;
		oci_errf(err, "%s is not valid JSON (at byte %zu of %zu)", what, at, len);
		return NULL;
	}
	/* Trailing bytes other than whitespace mean two documents or garbage. */
	for (const char *p = end; p && p < buf + len; p++)
		if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != '\0') {
			cJSON_Delete(j);
			oci_errf(err, "%s has trailing data after the JSON document", what);
			return NULL;
		}
	return j;
}

static const char *jstr(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int dup_str(const char *s, char **out)
{
	*out = NULL;
	if (s && !(*out = strdup(s)))
		return -ENOMEM;
	return 0;
}

enum oci_kind oci_kind_of(const char *mt)
{
	if (!mt)
		return OCI_KIND_UNKNOWN;
	if (strcmp(mt, OCI_MT_MANIFEST) == 0 || strcmp(mt, DOCKER_MT_MANIFEST) == 0)
		return OCI_KIND_MANIFEST;
	if (strcmp(mt, OCI_MT_INDEX) == 0 || strcmp(mt, DOCKER_MT_LIST) == 0)
		return OCI_KIND_INDEX;
	return OCI_KIND_UNKNOWN;
}

/* "application/json; charset=utf-8" -> compare only the type itself. */
static bool mt_is(const char *ct, const char *want)
{
	size_t n = strlen(want);
	return ct && strncmp(ct, want, n) == 0 && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

static enum oci_kind kind_of_ct(const char *ct)
{
	static const char *const m[] = {OCI_MT_MANIFEST, DOCKER_MT_MANIFEST};
	static const char *const i[] = {OCI_MT_INDEX, DOCKER_MT_LIST};
	for (size_t k = 0; k < 2; k++) {
		if (mt_is(ct, m[k]))
			return OCI_KIND_MANIFEST;
		if (mt_is(ct, i[k]))
			return OCI_KIND_INDEX;
	}
	return OCI_KIND_UNKNOWN;
}

enum oci_kind oci_detect_kind(const char *buf, size_t len, const char *content_type)
{
	cJSON *j = cJSON_ParseWithLength(buf, len);
	enum oci_kind k = OCI_KIND_UNKNOWN;
	if (!j)
		return k;
	const char *mt = jstr(j, "mediaType");
	if (mt)
		k = oci_kind_of(mt);
	else if (content_type && kind_of_ct(content_type) != OCI_KIND_UNKNOWN)
		k = kind_of_ct(content_type);
	else if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "manifests")))
		k = OCI_KIND_INDEX;
	else if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "config")))
		k = OCI_KIND_MANIFEST;
	cJSON_Delete(j);
	return k;
}

enum oci_compression oci_layer_compression(const char *mt)
{
	if (!mt)
		return OCI_COMP_UNKNOWN;
	if (strcmp(mt, OCI_MT_LAYER_GZIP) == 0 || strcmp(mt, DOCKER_MT_LAYER_GZIP) == 0)
		return OCI_COMP_GZIP;
	if (strcmp(mt, OCI_MT_LAYER_ZSTD) == 0)
		return OCI_COMP_ZSTD;
	if (strcmp(mt, OCI_MT_LAYER_TAR) == 0 || strcmp(mt, DOCKER_MT_LAYER_TAR) == 0)
		return OCI_COMP_NONE;
	return OCI_COMP_UNKNOWN;
}

void oci_desc_clear(struct oci_desc *d)
{
	if (!d)
		return;
	free(d->media_type);
	free(d->artifact_type);
	cJSON_Delete(d->annotations);
	free(d->platform.os);
	free(d->platform.architecture);
	free(d->platform.variant);
	memset(d, 0, sizeof(*d));
}

int oci_desc_copy(const struct oci_desc *src, struct oci_desc *dst)
{
	struct oci_desc d = {0};
	memcpy(d.digest, src->digest, sizeof(d.digest));
	d.size = src->size;
	d.has_platform = src->has_platform;
	if (dup_str(src->media_type, &d.media_type) ||
	    dup_str(src->artifact_type, &d.artifact_type) ||
	    dup_str(src->platform.os, &d.platform.os) ||
	    dup_str(src->platform.architecture, &d.platform.architecture) ||
	    dup_str(src->platform.variant, &d.platform.variant))
		goto nomem;
	if (src->annotations && !(d.annotations = cJSON_Duplicate(src->annotations, 1)))
		goto nomem;
	*dst = d;
	return 0;
nomem:
	oci_desc_clear(&d);
	return -ENOMEM;
}

static int annotations_from(const cJSON *o, const char *what, cJSON **out, struct oci_err *err)
{
	*out = NULL;
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "annotations");
	if (!a || cJSON_IsNull(a))
		return 0;
	if (!cJSON_IsObject(a)) {
		oci_errf(err, "%s: annotations is not an object", what);
		return -EINVAL;
	}
	const cJSON *it;
	cJSON_ArrayForEach(it, a)
	{
		if (!cJSON_IsString(it)) {
			oci_errf(err, "%s: annotation '%s' is not a string", what, it->string);
			return -EINVAL;
		}
	}
	if (!(*out = cJSON_Duplicate(a, 1)))
		return -ENOMEM;
	return 0;
}

/* The descriptor array key of j (a manifest's layers, an index's
 * manifests), at most max entries, each named "<item> N" in messages; *n
 * counts those parsed (the caller clears them, also on failure). */
static int desc_array(const cJSON *j, const char *key, const char *doc, const char *item, int max,
                      struct oci_desc **out, size_t *n, struct oci_err *err)
{
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, key), *it;
	if (!cJSON_IsArray(arr)) {
		oci_errf(err, "%s has no %s array", doc, key);
		return -EINVAL;
	}
	int count = cJSON_GetArraySize(arr);
	if (count > max) {
		oci_errf(err, "%s has %d %s (at most %d accepted)", doc, count, key, max);
		return -EINVAL;
	}
	if (count > 0 && !(*out = calloc((size_t)count, sizeof(**out))))
		return -ENOMEM;
	cJSON_ArrayForEach(it, arr)
	{
		char what[48];
		snprintf(what, sizeof(what), "%s %zu", item, *n);
		int rc = oci_desc_from_json(it, what, &(*out)[*n], err);
		if (rc)
			return rc;
		(*n)++;
	}
	return 0;
}

int oci_desc_from_json(const cJSON *j, const char *what, struct oci_desc *out, struct oci_err *err)
{
	struct oci_desc d = {0};
	int rc = -EINVAL;
	if (!cJSON_IsObject(j)) {
		oci_errf(err, "%s is not a JSON object", what);
		return -EINVAL;
	}
	const char *mt = jstr(j, "mediaType");
	const char *dg = jstr(j, "digest");
	const cJSON *sz = cJSON_GetObjectItemCaseSensitive(j, "size");
	if (!mt || !*mt) {
		oci_errf(err, "%s has no mediaType", what);
		goto out;
	}
	if (!dg || !oci_digest_valid(dg)) {
		oci_errf(err, "%s has an invalid digest '%s'", what, dg ? dg : "(none)");
		goto out;
	}
	/* sizes are JSON numbers (doubles): integral, non-negative, below 2^53 */
	if (!cJSON_IsNumber(sz) || sz->valuedouble < 0 || sz->valuedouble > 9007199254740992.0 ||
	    (double)(int64_t)sz->valuedouble != sz->valuedouble) {
		oci_errf(err, "%s (%s) has an invalid size", what, dg);
		goto out;
	}
	d.size = (int64_t)sz->valuedouble;
	snprintf(d.digest, sizeof(d.digest), "%s", dg);
	rc = -ENOMEM;
	if (dup_str(mt, &d.media_type) || dup_str(jstr(j, "artifactType"), &d.artifact_type))
		goto out;
	if ((rc = annotations_from(j, what, &d.annotations, err)))
		goto out;
	const cJSON *pf = cJSON_GetObjectItemCaseSensitive(j, "platform");
	if (cJSON_IsObject(pf)) {
		d.has_platform = true;
		rc = -ENOMEM;
		if (dup_str(jstr(pf, "os"), &d.platform.os) ||
		    dup_str(jstr(pf, "architecture"), &d.platform.architecture) ||
		    dup_str(jstr(pf, "variant"), &d.platform.variant))
			goto out;
	}
	*out = d;
	memset(&d, 0, sizeof(d));
	rc = 0;
out:
	oci_desc_clear(&d);
	return rc;
}

cJSON *oci_desc_to_json(const struct oci_desc *d)
{
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return NULL;
	if (!cJSON_AddStringToObject(o, "mediaType", d->media_type ? d->media_type : ""))
		goto fail;
	if (d->artifact_type && !cJSON_AddStringToObject(o, "artifactType", d->artifact_type))
		goto fail;
	if (!cJSON_AddStringToObject(o, "digest", d->digest) ||
	    !cJSON_AddNumberToObject(o, "size", (double)d->size))
		goto fail;
	if (d->annotations && cJSON_GetArraySize(d->annotations) > 0) {
		cJSON *a = cJSON_Duplicate(d->annotations, 1);
		if (!a || !cJSON_AddItemToObject(o, "annotations", a)) {
			cJSON_Delete(a);
			goto fail;
		}
	}
	if (d->has_platform) {
		cJSON *p = cJSON_AddObjectToObject(o, "platform");
		if (!p)
			goto fail;
		if (d->platform.architecture &&
		    !cJSON_AddStringToObject(p, "architecture", d->platform.architecture))
			goto fail;
		if (d->platform.os && !cJSON_AddStringToObject(p, "os", d->platform.os))
			goto fail;
		if (d->platform.variant &&
		    !cJSON_AddStringToObject(p, "variant", d->platform.variant))
			goto fail;
	}
	return o;
fail:
	cJSON_Delete(o);
	return NULL;
}

int oci_desc_for_bytes(const char *media_type, const void *buf, size_t len, struct oci_desc *d)
{
	struct oci_desc n = {0};
	int rc = oci_digest_buf(buf, len, n.digest);
	if (rc)
		return rc;
	if (!(n.media_type = strdup(media_type)))
		return -ENOMEM;
	n.size = (int64_t)len;
	*d = n;
	return 0;
}

const char *oci_desc_annotation(const struct oci_desc *d, const char *key)
{
	return d->annotations ? jstr(d->annotations, key) : NULL;
}

static int check_schema(const cJSON *j, const char *what, struct oci_err *err)
{
	const cJSON *sv = cJSON_GetObjectItemCaseSensitive(j, "schemaVersion");
	if (!cJSON_IsNumber(sv) || sv->valuedouble != 2) {
		oci_errf(err, "%s: schemaVersion is not 2", what);
		return -EINVAL;
	}
	return 0;
}

static int subject_from(const cJSON *j, const char *what, struct oci_desc **out,
                        struct oci_err *err)
{
	*out = NULL;
	const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "subject");
	if (!s || cJSON_IsNull(s))
		return 0;
	struct oci_desc *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	char w[96];
	snprintf(w, sizeof(w), "%s subject", what);
	int rc = oci_desc_from_json(s, w, d, err);
	if (rc) {
		free(d);
		return rc;
	}
	*out = d;
	return 0;
}

void oci_manifest_clear(struct oci_manifest *m)
{
	if (!m)
		return;
	free(m->media_type);
	free(m->artifact_type);
	oci_desc_clear(&m->config);
	for (size_t i = 0; i < m->n_layers; i++)
		oci_desc_clear(&m->layers[i]);
	free(m->layers);
	if (m->subject)
		oci_desc_clear(m->subject);
	free(m->subject);
	cJSON_Delete(m->annotations);
	memset(m, 0, sizeof(*m));
}

int oci_manifest_parse(const char *buf, size_t len, const char *content_type,
                       struct oci_manifest *out, struct oci_err *err)
{
	struct oci_manifest m = {0};
	int rc = -EINVAL;
	cJSON *j = oci_json_parse(buf, len, "manifest", err);
	if (!j)
		return -EINVAL;
	if (!cJSON_IsObject(j)) {
		oci_errf(err, "manifest is not a JSON object");
		goto out;
	}
	if ((rc = check_schema(j, "manifest", err)))
		goto out;
	rc = -EINVAL;
	const char *mt = jstr(j, "mediaType");
	if (!mt && content_type && kind_of_ct(content_type) == OCI_KIND_MANIFEST)
		mt = mt_is(content_type, DOCKER_MT_MANIFEST) ? DOCKER_MT_MANIFEST : OCI_MT_MANIFEST;
	if (!mt)
		mt = OCI_MT_MANIFEST; /* OCI allows the field to be absent */
	if (oci_kind_of(mt) != OCI_KIND_MANIFEST) {
		oci_errf(err, "unsupported manifest media type '%s'", mt);
		goto out;
	}
	rc = -ENOMEM;
	if (dup_str(mt, &m.media_type) || dup_str(jstr(j, "artifactType"), &m.artifact_type))
		goto out;
	if ((rc = oci_desc_from_json(cJSON_GetObjectItemCaseSensitive(j, "config"),
	                             "manifest config", &m.config, err)))
		goto out;
	if ((rc = desc_array(j, "layers", "manifest", "layer", OCI_MAX_LAYERS, &m.layers,
	                     &m.n_layers, err)))
		goto out;
	if ((rc = subject_from(j, "manifest", &m.subject, err)))
		goto out;
	if ((rc = annotations_from(j, "manifest", &m.annotations, err)))
		goto out;
	*out = m;
	memset(&m, 0, sizeof(m));
	rc = 0;
out:
	oci_manifest_clear(&m);
	cJSON_Delete(j);
	return rc;
}

void oci_index_clear(struct oci_index *ix)
{
	if (!ix)
		return;
	free(ix->media_type);
	free(ix->artifact_type);
	for (size_t i = 0; i < ix->n_manifests; i++)
		oci_desc_clear(&ix->manifests[i]);
	free(ix->manifests);
	if (ix->subject)
		oci_desc_clear(ix->subject);
	free(ix->subject);
	cJSON_Delete(ix->annotations);
	memset(ix, 0, sizeof(*ix));
}

int oci_index_parse(const char *buf, size_t len, const char *content_type, struct oci_index *out,
                    struct oci_err *err)
{
	struct oci_index ix = {0};
	int rc = -EINVAL;
	cJSON *j = oci_json_parse(buf, len, "index", err);
	if (!j)
		return -EINVAL;
	if (!cJSON_IsObject(j)) {
		oci_errf(err, "index is not a JSON object");
		goto out;
	}
	if ((rc = check_schema(j, "index", err)))
		goto out;
	rc = -EINVAL;
	const char *mt = jstr(j, "mediaType");
	if (!mt && content_type && kind_of_ct(content_type) == OCI_KIND_INDEX)
		mt = mt_is(content_type, DOCKER_MT_LIST) ? DOCKER_MT_LIST : OCI_MT_INDEX;
	if (!mt)
		mt = OCI_MT_INDEX;
	if (oci_kind_of(mt) != OCI_KIND_INDEX) {
		oci_errf(err, "unsupported index media type '%s'", mt);
		goto out;
	}
	rc = -ENOMEM;
	if (dup_str(mt, &ix.media_type) || dup_str(jstr(j, "artifactType"), &ix.artifact_type))
		goto out;
	rc = -EINVAL;
	if ((rc = desc_array(j, "manifests", "index", "index entry", OCI_MAX_INDEX_ENTRIES,
	                     &ix.manifests, &ix.n_manifests, err)))
		goto out;
	if ((rc = subject_from(j, "index", &ix.subject, err)))
		goto out;
	if ((rc = annotations_from(j, "index", &ix.annotations, err)))
		goto out;
	*out = ix;
	memset(&ix, 0, sizeof(ix));
	rc = 0;
out:
	oci_index_clear(&ix);
	cJSON_Delete(j);
	return rc;
}

int oci_config_parse(const char *buf, size_t len, struct oci_config *out, struct oci_err *err)
{
	cJSON *j = oci_json_parse(buf, len, "image config", err);
	if (!j)
		return -EINVAL;
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		oci_errf(err, "image config is not a JSON object");
		return -EINVAL;
	}
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config");
	const cJSON *l = c ? cJSON_GetObjectItemCaseSensitive(c, "Labels") : NULL;
	if (l && !cJSON_IsNull(l)) {
		const cJSON *it;
		bool ok = cJSON_IsObject(l);
		if (ok)
			cJSON_ArrayForEach(it, l) ok = ok && cJSON_IsString(it);
		if (!ok) {
			cJSON_Delete(j);
			oci_errf(err, "image config: config.Labels is not an object of strings");
			return -EINVAL;
		}
	}
	out->root = j;
	return 0;
}

void oci_config_clear(struct oci_config *c)
{
	if (c) {
		cJSON_Delete(c->root);
		c->root = NULL;
	}
}

const cJSON *oci_config_labels(const struct oci_config *c)
{
	const cJSON *cfg = c->root ? cJSON_GetObjectItemCaseSensitive(c->root, "config") : NULL;
	const cJSON *l = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "Labels") : NULL;
	return cJSON_IsObject(l) ? l : NULL;
}

const char *oci_config_label(const struct oci_config *c, const char *key)
{
	const cJSON *l = oci_config_labels(c);
	return l ? jstr(l, key) : NULL;
}

const char *oci_host_arch(void)
{
	static const struct {
		const char *uname, *go;
	} map[] = {{"x86_64", "amd64"},   {"aarch64", "arm64"}, {"ppc64le", "ppc64le"},
	           {"s390x", "s390x"},    {"i686", "386"},      {"armv7l", "arm"},
	           {"riscv64", "riscv64"}};
	struct utsname u;
	if (uname(&u) == 0)
		for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
			if (strcmp(u.machine, map[i].uname) == 0)
				return map[i].go;
	return "amd64";
}

int oci_index_select(const struct oci_index *ix, const char *os, const char *arch,
                     const char *variant, size_t *which, struct oci_err *err)
{
	size_t unplatformed = 0, unplatformed_at = 0;
	for (size_t i = 0; i < ix->n_manifests; i++) {
		const struct oci_desc *d = &ix->manifests[i];
		if (oci_kind_of(d->media_type) != OCI_KIND_MANIFEST)
			continue;
		if (!d->has_platform) {
			unplatformed++;
			unplatformed_at = i;
			continue;
		}
		const struct oci_platform *p = &d->platform;
		if (!p->os || !p->architecture || strcmp(p->os, os) ||
		    strcmp(p->architecture, arch))
			continue;
		if (variant && p->variant && strcmp(variant, p->variant))
			continue;
		*which = i;
		return 0;
	}
	if (unplatformed == 1) {
		*which = unplatformed_at;
		return 0;
	}
	char have[512] = "";
	size_t off = 0;
	for (size_t i = 0; i < ix->n_manifests && off < sizeof(have) - 1; i++) {
		const struct oci_platform *p = &ix->manifests[i].platform;
		int n = snprintf(have + off, sizeof(have) - off, "%s%s/%s%s%s", off ? ", " : "",
		                 p->os ? p->os : "?", p->architecture ? p->architecture : "?",
		                 p->variant ? "/" : "", p->variant ? p->variant : "");
		if (n < 0)
			break;
		off += (size_t)n;
	}
	oci_errf(err, "index has no image for platform %s/%s%s%s (it has: %s)", os, arch,
	         variant ? "/" : "", variant ? variant : "", off ? have : "nothing");
	return -ENOENT;
}

static int add_common(cJSON *o, const char *mt, const char *artifact_type)
{
	if (!cJSON_AddNumberToObject(o, "schemaVersion", 2))
		return -ENOMEM;
	if (mt && !cJSON_AddStringToObject(o, "mediaType", mt))
		return -ENOMEM;
	if (artifact_type && !cJSON_AddStringToObject(o, "artifactType", artifact_type))
		return -ENOMEM;
	return 0;
}

static int add_desc(cJSON *parent, const char *key, const struct oci_desc *d)
{
	cJSON *o = oci_desc_to_json(d);
	if (!o)
		return -ENOMEM;
	bool ok = key ? cJSON_AddItemToObject(parent, key, o) : cJSON_AddItemToArray(parent, o);
	if (!ok) {
		cJSON_Delete(o);
		return -ENOMEM;
	}
	return 0;
}

static int add_tail(cJSON *o, const struct oci_desc *subject, const cJSON *annotations)
{
	if (subject && add_desc(o, "subject", subject))
		return -ENOMEM;
	if (annotations && cJSON_GetArraySize(annotations) > 0) {
		cJSON *a = cJSON_Duplicate(annotations, 1);
		if (!a || !cJSON_AddItemToObject(o, "annotations", a)) {
			cJSON_Delete(a);
			return -ENOMEM;
		}
	}
	return 0;
}

static int print_json(cJSON *o, char **out, size_t *len)
{
	char *s = cJSON_PrintUnformatted(o);
	if (!s)
		return -ENOMEM;
	*out = s;
	*len = strlen(s);
	return 0;
}

int oci_manifest_build(const struct oci_manifest *m, char **out, size_t *len)
{
	int rc = -ENOMEM;
	cJSON *o = cJSON_CreateObject();
	cJSON *layers = NULL;
	if (!o || add_common(o, m->media_type ? m->media_type : OCI_MT_MANIFEST, m->artifact_type))
		goto out;
	if (add_desc(o, "config", &m->config))
		goto out;
	if (!(layers = cJSON_AddArrayToObject(o, "layers")))
		goto out;
	for (size_t i = 0; i < m->n_layers; i++)
		if (add_desc(layers, NULL, &m->layers[i]))
			goto out;
	if (add_tail(o, m->subject, m->annotations))
		goto out;
	rc = print_json(o, out, len);
out:
	cJSON_Delete(o);
	return rc;
}

int oci_index_build(const struct oci_index *ix, char **out, size_t *len)
{
	int rc = -ENOMEM;
	cJSON *o = cJSON_CreateObject();
	cJSON *ms = NULL;
	if (!o || add_common(o, ix->media_type ? ix->media_type : OCI_MT_INDEX, ix->artifact_type))
		goto out;
	if (!(ms = cJSON_AddArrayToObject(o, "manifests")))
		goto out;
	for (size_t i = 0; i < ix->n_manifests; i++)
		if (add_desc(ms, NULL, &ix->manifests[i]))
			goto out;
	if (add_tail(o, ix->subject, ix->annotations))
		goto out;
	rc = print_json(o, out, len);
out:
	cJSON_Delete(o);
	return rc;
}
