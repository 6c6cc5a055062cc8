#include "oci_mirrors.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "oci_ref.h"
#include "toml.h"

#define PATH_MAX_ 1024
#define REGISTRIES_MAX 256

enum { CAP_PULL = 1, CAP_RESOLVE = 2, CAP_PUSH = 4 };
enum { FROM_ALL = 3, FROM_DIGEST = 1, FROM_TAG = 2 };

/* A mirror as configured, before a repository is known. */
struct rule {
	struct oci_endpoint ep; /* repo unused for hosts.toml; for registries.conf
	                           host+repo hold the location */
	unsigned use;           /* hosts.toml: CAP_*; registries.conf: FROM_* */
};

struct conf_registry {
	char prefix[512], location[512];
	bool wildcard, insecure, blocked;
	struct rule mirrors[OCI_MIRRORS_MAX];
	size_t n;
};

struct oci_mirrors {
	char file[PATH_MAX_];
	bool hosts; /* hosts.toml; else registries.conf */
	/* hosts.toml */
	struct rule origin;
	struct rule hosts_rules[OCI_MIRRORS_MAX];
	size_t n_hosts;
	/* registries.conf */
	struct conf_registry *regs;
	size_t n_regs;
};

static const char *registry_name(const char *host)
{
	return strcmp(host, OCI_REF_DOCKER_HUB_API) == 0 ? OCI_REF_DEFAULT_REGISTRY : host;
}

static const char *api_host(const char *name)
{
	return strcmp(name, OCI_REF_DEFAULT_REGISTRY) == 0 ? OCI_REF_DOCKER_HUB_API : name;
}

static bool is_file(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int bad(struct oci_err *err, const char *file, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(struct oci_err *err, const char *file, const char *where, const char *fmt, ...)
{
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	oci_errf(err, "%s: %s%s%s", file, where, where[0] ? ": " : "", what);
	return -EINVAL;
}

/* key must be a string (or absent: def); copied into out. */
static int get_string(const cJSON *t, const char *key, const char *def, char *out, size_t cap,
                      const char *file, const char *where, struct oci_err *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, key);
	if (!v) {
		snprintf(out, cap, "%s", def);
		return 0;
	}
	if (!cJSON_IsString(v))
		return bad(err, file, where, "'%s' must be a string", key);
	if ((size_t)snprintf(out, cap, "%s", v->valuestring) >= cap)
		return bad(err, file, where, "'%s' is longer than %zu bytes", key, cap - 1);
	return 0;
}

static int get_bool(const cJSON *t, const char *key, bool *out, const char *file, const char *where,
                    struct oci_err *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, key);
	if (!v) {
		*out = false;
		return 0;
	}
	if (!cJSON_IsBool(v))
		return bad(err, file, where, "'%s' must be true or false", key);
	*out = cJSON_IsTrue(v);
	return 0;
}

/* Every key of t is in allowed ("a\0b\0\0"); those in ignored are warned about. */
static int only_keys(const cJSON *t, const char *allowed, const char *ignored, const char *file,
                     const char *where, struct oci_err *err)
{
	const cJSON *k;
	cJSON_ArrayForEach(k, t)
	{
		bool ok = false;
		for (const char *a = allowed; *a && !ok; a += strlen(a) + 1)
			ok = strcmp(a, k->string) == 0;
		for (const char *a = ignored; a && *a && !ok; a += strlen(a) + 1)
			if (strcmp(a, k->string) == 0) {
				ok = true;
				log_warn("registry configuration: setting not supported, ignored",
				         "file", file, "table", where, "key", k->string);
			}
		if (!ok)
			return bad(err, file, where, "unknown key '%s'", k->string);
	}
	return 0;
}

/* ---- hosts.toml ------------------------------------------------------ */

/* "https://host[:port][/path]" (scheme optional: https) into ep. */
static int parse_url(const char *url, bool override_path, struct oci_endpoint *ep, const char *file,
                     const char *where, struct oci_err *err)
{
	const char *p = url;
	if (strncmp(p, "https://", 8) == 0) {
		p += 8;
	} else if (strncmp(p, "http://", 7) == 0) {
		p += 7;
		ep->plain_http = true;
	} else if (strstr(p, "://")) {
		return bad(err, file, where, "'%s': only http and https URLs", url);
	}
	size_t hl = strcspn(p, "/?#");
	if (hl == 0 || hl >= sizeof(ep->host))
		return bad(err, file, where, "'%s' names no host", url);
	if (p[hl] == '?' || p[hl] == '#')
		return bad(err, file, where, "'%s': no query or fragment allowed", url);
	memcpy(ep->host, p, hl);
	ep->host[hl] = '\0';
	char path[256];
	snprintf(path, sizeof(path), "%s", p + hl);
	size_t n = strlen(path);
	while (n && path[n - 1] == '/')
		path[--n] = '\0';
	int w;
	if (override_path || (n >= 3 && strcmp(path + n - 3, "/v2") == 0))
		w = snprintf(ep->path, sizeof(ep->path), "%s", path);
	else
		w = snprintf(ep->path, sizeof(ep->path), "%s/v2", path);
	if (w < 0 || (size_t)w >= sizeof(ep->path))
		return bad(err, file, where, "'%s': path too long", url);
	return 0;
}

static int host_settings(const cJSON *t, const char *url, const char *dir, struct rule *r,
                         const char *file, const char *where, struct oci_err *err)
{
	bool override = false;
	int rc;
	if ((rc = get_bool(t, "override_path", &override, file, where, err)) ||
	    (rc = get_bool(t, "skip_verify", &r->ep.skip_verify, file, where, err)) ||
	    (rc = parse_url(url, override, &r->ep, file, where, err)))
		return rc;
	const cJSON *caps = cJSON_GetObjectItemCaseSensitive(t, "capabilities");
	if (!caps) {
		r->use = CAP_PULL | CAP_RESOLVE | CAP_PUSH;
	} else if (!cJSON_IsArray(caps)) {
		return bad(err, file, where, "'capabilities' must be a list");
	} else {
		const cJSON *c;
		r->use = 0;
		cJSON_ArrayForEach(c, caps)
		{
			const char *s = cJSON_IsString(c) ? c->valuestring : "";
			unsigned bit = !strcmp(s, "pull")      ? CAP_PULL
			               : !strcmp(s, "resolve") ? CAP_RESOLVE
			               : !strcmp(s, "push")    ? CAP_PUSH
			                                       : 0;
			if (!bit)
				return bad(err, file, where,
				           "capability '%s' is not pull, resolve or push", s);
			r->use |= bit;
		}
	}
	const cJSON *ca = cJSON_GetObjectItemCaseSensitive(t, "ca");
	size_t nca = 0;
	if (ca && !cJSON_IsString(ca) && !cJSON_IsArray(ca))
		return bad(err, file, where, "'ca' must be a file name or a list of them");
	const cJSON *one = cJSON_IsString(ca) ? ca : ca ? ca->child : NULL;
	for (; one; one = cJSON_IsString(ca) ? NULL : one->next) {
		if (!cJSON_IsString(one) || !one->valuestring[0])
			return bad(err, file, where, "'ca' entries must be file names");
		if (nca >= OCI_MIRRORS_CA_MAX)
			return bad(err, file, where, "at most %d 'ca' files", OCI_MIRRORS_CA_MAX);
		const char *v = one->valuestring;
		int w = v[0] == '/' ? snprintf(r->ep.ca[nca], sizeof(r->ep.ca[0]), "%s", v)
		                    : snprintf(r->ep.ca[nca], sizeof(r->ep.ca[0]), "%s/%s", dir, v);
		if (w < 0 || (size_t)w >= sizeof(r->ep.ca[0]))
			return bad(err, file, where, "'ca' path too long");
		nca++;
	}
	return 0;
}

/* m->file as TOML into *t. */
static int parse_file(const struct oci_mirrors *m, cJSON **t, struct oci_err *err)
{
	char e[768];
	int rc = toml_parse_file(m->file, t, e, sizeof(e));
	if (rc)
		oci_errf(err, "%s", e);
	return rc;
}

static int load_hosts(struct oci_mirrors *m, const char *name, const char *dir, bool own,
                      struct oci_err *err)
{
	cJSON *t = NULL;
	int rc = parse_file(m, &t, err);
	if (rc)
		return rc;
	const char *f = m->file;
	static const char top[] = "server\0capabilities\0ca\0skip_verify\0override_path\0host\0";
	static const char host_keys[] = "capabilities\0ca\0skip_verify\0override_path\0";
	static const char unused[] = "client\0header\0";
	if ((rc = only_keys(t, top, unused, f, "", err)))
		goto out;
	char server[512], origin[600];
	if ((rc = get_string(t, "server", "", server, sizeof(server), f, "", err)))
		goto out;
	/* _default's server would send every registry to one place: its
	 * origin stays the registry itself */
	if (server[0] && own)
		snprintf(origin, sizeof(origin), "%s", server);
	else
		snprintf(origin, sizeof(origin), "https://%s", api_host(name));
	if ((rc = host_settings(t, origin, dir, &m->origin, f, "server", err)))
		goto out;
	const cJSON *hosts = cJSON_GetObjectItemCaseSensitive(t, "host");
	if (hosts && !cJSON_IsObject(hosts)) {
		rc = bad(err, f, "", "'host' must be a table of [host.\"URL\"] tables");
		goto out;
	}
	const cJSON *h;
	cJSON_ArrayForEach(h, hosts)
	{
		char where[600];
		snprintf(where, sizeof(where), "[host.\"%s\"]", h->string);
		if (!cJSON_IsObject(h)) {
			rc = bad(err, f, where, "must be a table");
			goto out;
		}
		if (m->n_hosts >= OCI_MIRRORS_MAX) {
			rc = bad(err, f, where, "more than %d hosts", OCI_MIRRORS_MAX);
			goto out;
		}
		struct rule *r = &m->hosts_rules[m->n_hosts];
		if ((rc = only_keys(h, host_keys, unused, f, where, err)) ||
		    (rc = host_settings(h, h->string, dir, r, f, where, err)))
			goto out;
		r->ep.mirror = true;
		m->n_hosts++;
	}
out:
	cJSON_Delete(t);
	return rc;
}

/* ---- registries.conf ------------------------------------------------- */

static int conf_mirror(const cJSON *t, struct conf_registry *cr, bool digest_only, const char *f,
                       const char *where, struct oci_err *err)
{
	static const char keys[] = "location\0insecure\0pull-from-mirror\0";
	char from[32];
	int rc;
	if (!cJSON_IsObject(t))
		return bad(err, f, where, "[[registry.mirror]] must be a table");
	if (cr->n >= OCI_MIRRORS_MAX)
		return bad(err, f, where, "more than %d mirrors", OCI_MIRRORS_MAX);
	struct rule *r = &cr->mirrors[cr->n];
	if ((rc = only_keys(t, keys, NULL, f, where, err)) ||
	    (rc = get_string(t, "location", "", r->ep.host, sizeof(r->ep.host), f, where, err)) ||
	    (rc = get_bool(t, "insecure", &r->ep.insecure, f, where, err)) ||
	    (rc = get_string(t, "pull-from-mirror", "", from, sizeof(from), f, where, err)))
		return rc;
	if (!r->ep.host[0])
		return bad(err, f, where, "a mirror needs a 'location'");
	if (from[0] && digest_only)
		return bad(err, f, where,
		           "'pull-from-mirror' cannot be used with 'mirror-by-digest-only'");
	r->use = !from[0] || !strcmp(from, "all") ? (digest_only ? FROM_DIGEST : FROM_ALL)
	         : !strcmp(from, "digest-only")   ? FROM_DIGEST
	         : !strcmp(from, "tag-only")      ? FROM_TAG
	                                          : 0;
	if (!r->use)
		return bad(err, f, where,
		           "'pull-from-mirror' is '%s', not all, digest-only or tag-only", from);
	r->ep.mirror = true;
	cr->n++;
	return 0;
}

static int conf_registry(const cJSON *t, struct conf_registry *cr, const char *f, size_t idx,
                         struct oci_err *err)
{
	static const char keys[] =
	    "prefix\0location\0insecure\0blocked\0mirror-by-digest-only\0mirror\0";
	char where[64];
	bool digest_only = false;
	int rc;
	snprintf(where, sizeof(where), "[[registry]] #%zu", idx + 1);
	if (!cJSON_IsObject(t))
		return bad(err, f, where, "must be a table");
	if ((rc = only_keys(t, keys, NULL, f, where, err)) ||
	    (rc = get_string(t, "location", "", cr->location, sizeof(cr->location), f, where,
	                     err)) ||
	    (rc = get_string(t, "prefix", cr->location, cr->prefix, sizeof(cr->prefix), f, where,
	                     err)) ||
	    (rc = get_bool(t, "insecure", &cr->insecure, f, where, err)) ||
	    (rc = get_bool(t, "blocked", &cr->blocked, f, where, err)) ||
	    (rc = get_bool(t, "mirror-by-digest-only", &digest_only, f, where, err)))
		return rc;
	if (!cr->prefix[0])
		return bad(err, f, where, "needs a 'location' or a 'prefix'");
	cr->wildcard = strncmp(cr->prefix, "*.", 2) == 0;
	if (cr->wildcard && (strchr(cr->prefix, '/') || cr->location[0]))
		return bad(err, f, where,
		           "a wildcard prefix names hosts only and takes no 'location'");
	if (!cr->wildcard && strchr(cr->prefix, '*'))
		return bad(err, f, where, "'*' is only allowed as '*.' at the start of a prefix");
	const cJSON *mirrors = cJSON_GetObjectItemCaseSensitive(t, "mirror");
	if (mirrors && !cJSON_IsArray(mirrors))
		return bad(err, f, where, "'mirror' must be written [[registry.mirror]]");
	const cJSON *mm;
	size_t i = 0;
	cJSON_ArrayForEach(mm, mirrors)
	{
		char w[96];
		snprintf(w, sizeof(w), "%s, mirror #%zu", where, ++i);
		if ((rc = conf_mirror(mm, cr, digest_only, f, w, err)))
			return rc;
	}
	return 0;
}

static int load_conf(struct oci_mirrors *m, struct oci_err *err)
{
	cJSON *t = NULL;
	int rc = parse_file(m, &t, err);
	if (rc)
		return rc;
	const char *f = m->file;
	static const char top[] =
	    "unqualified-search-registries\0short-name-mode\0credential-helpers\0"
	    "additional-layer-store-auth-helper\0registry\0aliases\0";
	if (cJSON_GetObjectItemCaseSensitive(t, "registries")) {
		rc = bad(err, f, "",
		         "the version 1 format ([registries.search]) is not supported; "
		         "write [[registry]] tables");
		goto out;
	}
	if ((rc = only_keys(t, top, NULL, f, "", err)))
		goto out;
	const cJSON *regs = cJSON_GetObjectItemCaseSensitive(t, "registry");
	if (regs && !cJSON_IsArray(regs)) {
		rc = bad(err, f, "", "'registry' must be written [[registry]]");
		goto out;
	}
	size_t n = (size_t)cJSON_GetArraySize(regs);
	if (n > REGISTRIES_MAX) {
		rc = bad(err, f, "", "more than %d [[registry]] tables", REGISTRIES_MAX);
		goto out;
	}
	if (n && !(m->regs = calloc(n, sizeof(*m->regs)))) {
		rc = -ENOMEM;
		goto out;
	}
	const cJSON *r;
	cJSON_ArrayForEach(r, regs)
	{
		if ((rc = conf_registry(r, &m->regs[m->n_regs], f, m->n_regs, err)))
			goto out;
		m->n_regs++;
	}
out:
	cJSON_Delete(t);
	return rc;
}

int oci_mirrors_load(const char *hosts_dir, const char *registries_conf, const char *host,
                     struct oci_mirrors **out, struct oci_err *err)
{
	const char *name = registry_name(host);
	struct oci_mirrors *m = calloc(1, sizeof(*m));
	char dir[PATH_MAX_];
	int rc = 0;
	if (!m)
		return -ENOMEM;
	*out = NULL;
	if (hosts_dir && hosts_dir[0]) {
		const char *dirs[] = {name, "_default"};
		for (size_t i = 0; i < 2 && !m->hosts; i++) {
			int w = snprintf(dir, sizeof(dir), "%s/%s", hosts_dir, dirs[i]);
			int v = snprintf(m->file, sizeof(m->file), "%.*s/hosts.toml",
			                 (int)(sizeof(m->file) - 16), dir);
			if (w < 0 || (size_t)w >= sizeof(dir) - 16 || v < 0) {
				oci_errf(err, "%s: directory name too long", hosts_dir);
				rc = -ENAMETOOLONG;
				goto fail;
			}
			if (!is_file(m->file))
				continue;
			m->hosts = true;
			if ((rc = load_hosts(m, name, dir, i == 0, err)))
				goto fail;
		}
	}
	if (!m->hosts && registries_conf && registries_conf[0] && is_file(registries_conf)) {
		snprintf(m->file, sizeof(m->file), "%s", registries_conf);
		if ((rc = load_conf(m, err)))
			goto fail;
		if (m->n_regs == 0)
			goto none;
	} else if (!m->hosts) {
		goto none;
	}
	*out = m;
	return 0;
fail:
	oci_mirrors_free(m);
	return rc;
none:
	oci_mirrors_free(m);
	return 0;
}

int oci_mirrors_check(const char *hosts_dir, const char *registries_conf, struct oci_err *err)
{
	struct oci_mirrors *m = NULL;
	int rc = oci_mirrors_load(NULL, registries_conf, "localhost", &m, err);
	oci_mirrors_free(m);
	DIR *d = rc == 0 && hosts_dir ? opendir(hosts_dir) : NULL;
	for (struct dirent *de; d && rc == 0 && (de = readdir(d));) {
		if (de->d_name[0] == '.')
			continue;
		m = NULL;
		/* "_default" is read as itself: its server is then not ignored,
		 * which changes nothing that is checked */
		rc = oci_mirrors_load(hosts_dir, NULL, de->d_name, &m, err);
		oci_mirrors_free(m);
	}
	if (d)
		closedir(d);
	return rc;
}

void oci_mirrors_free(struct oci_mirrors *m)
{
	if (!m)
		return;
	free(m->regs);
	free(m);
}

const char *oci_mirrors_file(const struct oci_mirrors *m)
{
	return m ? m->file : "";
}

/* ---- routes ---------------------------------------------------------- */

/* "location" + rest into an endpoint: host, then the repository. */
static int rewrite(const char *location, const char *rest, struct oci_endpoint *ep,
                   struct oci_err *err)
{
	char full[1024];
	if ((size_t)snprintf(full, sizeof(full), "%s%s", location, rest) >= sizeof(full)) {
		oci_errf(err, "rewritten reference '%s%s' too long", location, rest);
		return -ENAMETOOLONG;
	}
	char *slash = strchr(full, '/');
	if (!slash || !slash[1] || (size_t)(slash - full) >= sizeof(ep->host)) {
		oci_errf(err, "'%s' (from the mirror location '%s') names no repository", full,
		         location);
		return -EINVAL;
	}
	*slash = '\0';
	int w = snprintf(ep->host, sizeof(ep->host), "%s", api_host(full));
	int v = snprintf(ep->repo, sizeof(ep->repo), "%s", slash + 1);
	if (w < 0 || (size_t)w >= sizeof(ep->host) || v < 0 || (size_t)v >= sizeof(ep->repo)) {
		oci_errf(err, "rewritten reference '%s/%s' too long", full, slash + 1);
		return -ENAMETOOLONG;
	}
	if (!ep->path[0])
		snprintf(ep->path, sizeof(ep->path), "/v2");
	return 0;
}

/* How much of full ("registry/repo") cr's prefix matches; 0: none. */
static size_t match(const struct conf_registry *cr, const char *full)
{
	size_t hl = strcspn(full, "/");
	if (cr->wildcard) {
		size_t sl = strlen(cr->prefix + 1); /* ".example.com" */
		return hl > sl && strncmp(full + hl - sl, cr->prefix + 1, sl) == 0 ? hl : 0;
	}
	size_t pl = strlen(cr->prefix);
	if (strncmp(full, cr->prefix, pl) != 0 || (full[pl] && full[pl] != '/'))
		return 0;
	return pl;
}

static int add(struct oci_route *out, const struct oci_endpoint *ep)
{
	if (out->n >= OCI_MIRRORS_MAX + 1)
		return -E2BIG;
	out->ep[out->n++] = *ep;
	return 0;
}

int oci_mirrors_route(const struct oci_mirrors *m, const char *host, const char *repo,
                      bool by_digest, struct oci_route *out, struct oci_err *err)
{
	struct oci_route rt;
	struct oci_endpoint ep;
	int rc;
	memset(&rt, 0, sizeof(rt));
	memset(&ep, 0, sizeof(ep));
	if (m && m->hosts) {
		unsigned need = by_digest ? CAP_PULL : CAP_RESOLVE;
		for (size_t i = 0; i < m->n_hosts; i++) {
			if (!(m->hosts_rules[i].use & need))
				continue;
			ep = m->hosts_rules[i].ep;
			snprintf(ep.repo, sizeof(ep.repo), "%s", repo);
			(void)add(&rt, &ep);
		}
		ep = m->origin.ep;
		snprintf(ep.repo, sizeof(ep.repo), "%s", repo);
		(void)add(&rt, &ep);
		*out = rt;
		return 0;
	}
	char full[1024];
	snprintf(full, sizeof(full), "%s/%s", registry_name(host), repo);
	const struct conf_registry *best = NULL;
	size_t best_len = 0, best_plen = 0;
	for (size_t i = 0; m && i < m->n_regs; i++) {
		size_t l = match(&m->regs[i], full), pl = strlen(m->regs[i].prefix);
		if (l && pl > best_plen) {
			best = &m->regs[i];
			best_len = l;
			best_plen = pl;
		}
	}
	if (!best) {
		snprintf(ep.host, sizeof(ep.host), "%s", host);
		snprintf(ep.path, sizeof(ep.path), "/v2");
		snprintf(ep.repo, sizeof(ep.repo), "%s", repo);
		(void)add(&rt, &ep);
		*out = rt;
		return 0;
	}
	if (best->blocked) {
		oci_errf(err, "registry %s is blocked by %s (prefix %s)", registry_name(host),
		         m->file, best->prefix);
		return -EACCES;
	}
	const char *rest = full + best_len;
	char matched[1024];
	snprintf(matched, sizeof(matched), "%.*s", (int)best_len, full);
	unsigned need = by_digest ? FROM_DIGEST : FROM_TAG;
	for (size_t i = 0; i < best->n; i++) {
		const struct rule *r = &best->mirrors[i];
		if (!(r->use & need))
			continue;
		ep = r->ep;
		ep.host[0] = '\0';
		if ((rc = rewrite(r->ep.host, rest, &ep, err)))
			return rc;
		(void)add(&rt, &ep);
	}
	memset(&ep, 0, sizeof(ep));
	ep.insecure = best->insecure;
	if ((rc = rewrite(best->location[0] ? best->location : matched, rest, &ep, err)))
		return rc;
	(void)add(&rt, &ep);
	*out = rt;
	return 0;
}
