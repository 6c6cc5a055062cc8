#include "oci_ref.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oci_digest.h"

#define NAME_MAX_LEN 255

static bool is_lower_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

int oci_ref_tag_valid(const char *tag)
{
	size_t n = strlen(tag);
	if (n == 0 || n > 128)
		return 0;
	if (!(isalnum((unsigned char)tag[0]) || tag[0] == '_'))
		return 0;
	for (size_t i = 1; i < n; i++) {
		char c = tag[i];
		if (!(isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

/* path-component := [a-z0-9]+ ( ( [_.] | __ | -+ ) [a-z0-9]+ )* */
static bool component_valid(const char *s, size_t n)
{
	size_t i = 0;
	if (n == 0 || !is_lower_alnum(s[0]))
		return false;
	while (i < n) {
		while (i < n && is_lower_alnum(s[i]))
			i++;
		if (i == n)
			return true;
		size_t sep = i;
		if (s[i] == '.' || s[i] == '_') {
			i++;
			if (s[sep] == '_' && i < n && s[i] == '_')
				i++;
		} else if (s[i] == '-') {
			while (i < n && s[i] == '-')
				i++;
		} else {
			return false;
		}
		if (i == n || !is_lower_alnum(s[i]))
			return false;
	}
	return true;
}

static int path_check(const char *path, struct oci_err *err)
{
	size_t n = strlen(path);
	if (n == 0) {
		oci_errf(err, "empty repository name");
		return -EINVAL;
	}
	const char *p = path;
	while (*p) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);
		if (!component_valid(p, len)) {
			for (size_t i = 0; i < len; i++)
				if (isupper((unsigned char)p[i])) {
					oci_errf(err, "repository name '%s' must be lowercase",
					         path);
					return -EINVAL;
				}
			oci_errf(err,
			         "invalid repository path component '%.*s' in '%s' (want lowercase "
			         "letters and digits separated by '.', '_', '__' or '-')",
			         (int)len, p, path);
			return -EINVAL;
		}
		if (!slash)
			break;
		p = slash + 1;
		if (!*p) {
			oci_errf(err, "repository name '%s' ends with '/'", path);
			return -EINVAL;
		}
	}
	return 0;
}

/* host[:port], host a DNS name, IPv4 address or [IPv6]. */
static int domain_check(const char *d, struct oci_err *err)
{
	const char *p = d;
	const char *port = NULL;
	if (*p == '[') {
		const char *close = strchr(p, ']');
		if (!close || close == p + 1) {
			oci_errf(err, "invalid registry host '%s' (unbalanced '[')", d);
			return -EINVAL;
		}
		for (const char *q = p + 1; q < close; q++)
			if (!(isxdigit((unsigned char)*q) || *q == ':' || *q == '.')) {
				oci_errf(err, "invalid IPv6 address in registry host '%s'", d);
				return -EINVAL;
			}
		if (close[1] == ':')
			port = close + 2;
		else if (close[1]) {
			oci_errf(err, "invalid registry host '%s'", d);
			return -EINVAL;
		}
	} else {
		const char *colon = strchr(p, ':');
		size_t hlen = colon ? (size_t)(colon - p) : strlen(p);
		if (colon)
			port = colon + 1;
		/* domain-component := [A-Za-z0-9] | [A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9], dot-joined
		 */
		size_t i = 0;
		while (i < hlen) {
			size_t start = i;
			while (i < hlen && p[i] != '.')
				i++;
			size_t clen = i - start;
			if (clen == 0 || !isalnum((unsigned char)p[start]) ||
			    !isalnum((unsigned char)p[i - 1])) {
				oci_errf(err, "invalid registry host '%.*s'", (int)hlen, p);
				return -EINVAL;
			}
			for (size_t k = start; k < i; k++)
				if (!(isalnum((unsigned char)p[k]) || p[k] == '-')) {
					oci_errf(err,
					         "invalid character '%c' in registry host '%.*s'",
					         p[k], (int)hlen, p);
					return -EINVAL;
				}
			if (i < hlen)
				i++; /* the dot */
			if (i == hlen && p[hlen - 1] == '.') {
				oci_errf(err, "invalid registry host '%.*s'", (int)hlen, p);
				return -EINVAL;
			}
		}
		if (hlen == 0) {
			oci_errf(err, "empty registry host in '%s'", d);
			return -EINVAL;
		}
	}
	if (port) {
		size_t plen = strlen(port);
		bool digits = plen > 0 && plen <= 5;
		for (size_t i = 0; digits && i < plen; i++)
			digits = isdigit((unsigned char)port[i]);
		if (!digits || strtoul(port, NULL, 10) > 65535) {
			oci_errf(err, "invalid port '%s' in registry host '%s'", port, d);
			return -EINVAL;
		}
	}
	return 0;
}

/* algorithm ":" hex, with the algorithms we can verify. */
static int digest_check(const char *dg, struct oci_err *err)
{
	if (oci_digest_valid(dg))
		return 0;
	const char *colon = strchr(dg, ':');
	if (!colon)
		oci_errf(err, "invalid digest '%s' (want algorithm:hex, e.g. sha256:<64 hex>)", dg);
	else if (strncmp(dg, "sha256:", 7) != 0 && strncmp(dg, "sha512:", 7) != 0)
		oci_errf(err, "unsupported digest algorithm '%.*s' in '%s' (sha256 and sha512 are)",
		         (int)(colon - dg), dg, dg);
	else
		oci_errf(err, "invalid digest '%s' (wrong length or not lowercase hex)", dg);
	return -EINVAL;
}

void oci_ref_clear(struct oci_ref *r)
{
	if (!r)
		return;
	free(r->registry);
	free(r->repository);
	free(r->dir);
	free(r->tag);
	free(r->digest);
	memset(r, 0, sizeof(*r));
}

/* Default the tag, then move r into out. */
static int hand_over(struct oci_ref *r, struct oci_ref *out)
{
	if (!r->tag && !r->digest && !(r->tag = strdup(OCI_REF_DEFAULT_TAG)))
		return -ENOMEM;
	*out = *r;
	memset(r, 0, sizeof(*r));
	return 0;
}

/* Cut "@digest" off buf (in place) into r->digest. */
static int take_digest(char *buf, struct oci_ref *r, struct oci_err *err)
{
	char *at = strchr(buf, '@');
	if (!at)
		return 0;
	*at = '\0';
	int rc = digest_check(at + 1, err);
	if (rc)
		return rc;
	return (r->digest = strdup(at + 1)) ? 0 : -ENOMEM;
}

/* Cut ":tag" at colon (in place) into r->tag. */
static int take_tag(char *colon, struct oci_ref *r, struct oci_err *err)
{
	*colon = '\0';
	if (!oci_ref_tag_valid(colon + 1)) {
		oci_errf(err, "invalid tag '%s' (want [A-Za-z0-9_][A-Za-z0-9_.-]{0,127})",
		         colon + 1);
		return -EINVAL;
	}
	return (r->tag = strdup(colon + 1)) ? 0 : -ENOMEM;
}

static int parse_layout(const char *s, struct oci_ref *out, struct oci_err *err)
{
	struct oci_ref r = {.kind = OCI_REF_LAYOUT};
	int rc = -EINVAL;
	char *buf = strdup(s);
	if (!buf)
		return -ENOMEM;
	if ((rc = take_digest(buf, &r, err)))
		goto out;
	/* Like skopeo, DIR ends at the first ':' (so DIR itself has none). */
	char *colon = strchr(buf, ':');
	if (colon && (rc = take_tag(colon, &r, err))) {
		oci_err_prefix(err, "layout reference 'oci:%s'", s);
		goto out;
	}
	if (!buf[0]) {
		oci_errf(err, "layout reference 'oci:%s' names no directory", s);
		rc = -EINVAL;
		goto out;
	}
	rc = -ENOMEM;
	if (!(r.dir = strdup(buf)))
		goto out;
	rc = hand_over(&r, out);
out:
	oci_ref_clear(&r);
	free(buf);
	return rc;
}

int oci_ref_parse(const char *s, struct oci_ref *out, struct oci_err *err)
{
	struct oci_ref r = {.kind = OCI_REF_REGISTRY};
	char *buf = NULL;
	int rc = -EINVAL;
	if (!s || !*s) {
		oci_errf(err, "empty image reference");
		return -EINVAL;
	}
	if (strlen(s) > OCI_REF_MAX) {
		oci_errf(err, "image reference longer than %d characters", OCI_REF_MAX);
		return -EINVAL;
	}
	if (strncmp(s, "oci:", 4) == 0)
		return parse_layout(s + 4, out, err);
	if (strncmp(s, "docker://", 9) == 0)
		s += 9;
	for (const char *p = s; *p; p++)
		if (isspace((unsigned char)*p) || iscntrl((unsigned char)*p)) {
			oci_errf(err,
			         "image reference '%s' contains whitespace or control characters",
			         s);
			return -EINVAL;
		}
	if (strstr(s, "://")) {
		oci_errf(err, "image reference '%s' has a URL scheme (write host/path:tag)", s);
		return -EINVAL;
	}
	if (!(buf = strdup(s)))
		return -ENOMEM;

	if ((rc = take_digest(buf, &r, err)))
		goto out;
	/* A tag follows the last ':' that comes after the last '/' (a colon
	 * before a '/' is a port). */
	char *slash = strrchr(buf, '/');
	char *colon = strrchr(slash ? slash : buf, ':');
	if (colon && (!slash || colon > slash) && (rc = take_tag(colon, &r, err)))
		goto out;
	char *name = buf;
	char *first_slash = strchr(name, '/');
	const char *domain = OCI_REF_DEFAULT_REGISTRY;
	char *path = name;
	if (first_slash) {
		*first_slash = '\0';
		bool has_upper = false;
		for (const char *p = name; *p; p++)
			has_upper |= isupper((unsigned char)*p) != 0;
		if (strchr(name, '.') || strchr(name, ':') || name[0] == '[' ||
		    strcmp(name, "localhost") == 0 || has_upper) {
			if ((rc = domain_check(name, err)))
				goto out;
			domain = name;
			path = first_slash + 1;
		} else {
			*first_slash = '/';
		}
	}
	if (strcmp(domain, "index.docker.io") == 0 || strcmp(domain, "registry-1.docker.io") == 0)
		domain = OCI_REF_DEFAULT_REGISTRY;
	if ((rc = path_check(path, err)))
		goto out;
	rc = -ENOMEM;
	if (!(r.registry = strdup(domain)))
		goto out;
	if (strcmp(domain, OCI_REF_DEFAULT_REGISTRY) == 0 && !strchr(path, '/')) {
		size_t n = strlen(path) + sizeof("library/");
		if (!(r.repository = malloc(n)))
			goto out;
		snprintf(r.repository, n, "library/%s", path);
	} else if (!(r.repository = strdup(path))) {
		goto out;
	}
	if (strlen(r.registry) + 1 + strlen(r.repository) > NAME_MAX_LEN) {
		oci_errf(err, "image name '%s/%s' longer than %d characters", r.registry,
		         r.repository, NAME_MAX_LEN);
		rc = -EINVAL;
		goto out;
	}
	rc = hand_over(&r, out);
out:
	oci_ref_clear(&r);
	free(buf);
	return rc;
}

static int dup_opt(const char *s, char **out)
{
	*out = NULL;
	if (s && !(*out = strdup(s)))
		return -ENOMEM;
	return 0;
}

int oci_ref_copy(const struct oci_ref *src, struct oci_ref *dst)
{
	struct oci_ref r = {.kind = src->kind};
	if (dup_opt(src->registry, &r.registry) || dup_opt(src->repository, &r.repository) ||
	    dup_opt(src->dir, &r.dir) || dup_opt(src->tag, &r.tag) ||
	    dup_opt(src->digest, &r.digest)) {
		oci_ref_clear(&r);
		return -ENOMEM;
	}
	*dst = r;
	return 0;
}

static int replace(char **field, const char *v)
{
	char *n = NULL;
	if (dup_opt(v, &n))
		return -ENOMEM;
	free(*field);
	*field = n;
	return 0;
}

int oci_ref_set_digest(struct oci_ref *r, const char *digest)
{
	return replace(&r->digest, digest);
}

int oci_ref_set_tag(struct oci_ref *r, const char *tag)
{
	return replace(&r->tag, tag);
}

int oci_ref_pin(const char *s, const char *digest, struct oci_ref *out, struct oci_err *err)
{
	struct oci_ref r = {0};
	int rc = oci_ref_parse(s, &r, err);
	if (rc)
		return rc;
	if (oci_ref_set_tag(&r, NULL) || oci_ref_set_digest(&r, digest)) {
		oci_ref_clear(&r);
		oci_errf(err, "out of memory");
		return -ENOMEM;
	}
	*out = r;
	return 0;
}

char *oci_ref_name(const struct oci_ref *r)
{
	char *s = NULL;
	if (r->kind == OCI_REF_LAYOUT) {
		if (asprintf(&s, "oci:%s", r->dir) < 0)
			return NULL;
	} else if (asprintf(&s, "%s/%s", r->registry, r->repository) < 0) {
		return NULL;
	}
	return s;
}

char *oci_ref_format(const struct oci_ref *r)
{
	char *name = oci_ref_name(r);
	char *s = NULL;
	if (!name)
		return NULL;
	if (asprintf(&s, "%s%s%s%s%s", name, r->tag ? ":" : "", r->tag ? r->tag : "",
	             r->digest ? "@" : "", r->digest ? r->digest : "") < 0)
		s = NULL;
	free(name);
	return s;
}

const char *oci_ref_api_host(const struct oci_ref *r)
{
	if (r->registry && strcmp(r->registry, OCI_REF_DEFAULT_REGISTRY) == 0)
		return OCI_REF_DOCKER_HUB_API;
	return r->registry;
}

const char *oci_ref_reference(const struct oci_ref *r)
{
	return r->digest ? r->digest : r->tag;
}
