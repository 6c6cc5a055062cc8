#include "oci_registry_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

void oci_registry_opts_init(struct oci_registry_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->connect_timeout_s = 10;
	o->stall_timeout_s = 30;
	o->request_timeout_s = 120;
	o->retries = 4;
	o->resumes = 4;
	o->backoff_ms = 250;
	o->max_manifest_bytes = 4u << 20;
}

static bool host_is_loopback(const char *host)
{
	char h[256];
	if (host[0] == '[') {
		const char *close = strchr(host, ']');
		if (!close || (size_t)(close - host - 1) >= sizeof(h))
			return false;
		memcpy(h, host + 1, (size_t)(close - host - 1));
		h[close - host - 1] = '\0';
	} else {
		snprintf(h, sizeof(h), "%s", host);
		char *colon = strchr(h, ':');
		if (colon)
			*colon = '\0';
	}
	if (strcmp(h, "localhost") == 0 || strcmp(h, "::1") == 0)
		return true;
	struct in_addr a;
	return inet_pton(AF_INET, h, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

static bool host_listed(const char *list, const char *host)
{
	if (!list)
		return false;
	size_t hl = strlen(host);
	for (const char *p = list; *p;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		while (n && *p == ' ')
			p++, n--;
		if ((n == 1 && *p == '*') || (n == hl && strncmp(p, host, n) == 0))
			return true;
		if (!comma)
			break;
		p = comma + 1;
	}
	return false;
}

static void load_creds(struct oci_registry *r, const struct oci_registry_opts *o,
                       struct oci_err *err)
{
	struct oci_err e = {{0}};
	int rc = -ENOENT;
	/* docker.io credentials are stored under docker.io, not the API host */
	const char *key = strcmp(r->host, "registry-1.docker.io") == 0 ? "docker.io" : r->host;
	if (o->username && o->password) {
		if ((r->creds.username = strdup(o->username)) &&
		    (r->creds.password = strdup(o->password)))
			rc = 0;
		snprintf(r->creds_source, sizeof(r->creds_source), "explicit credentials");
	} else if (o->auth_json) {
		rc = oci_creds_lookup(o->auth_json, strlen(o->auth_json), key, &r->creds, &e);
		snprintf(r->creds_source, sizeof(r->creds_source), "%s",
		         o->auth_source ? o->auth_source : "the pull secret");
		r->creds_named = true;
	} else if (o->no_default_auth_files && !o->auth_file && o->auth_source) {
		/* none on purpose: say why in messages */
		snprintf(r->creds_source, sizeof(r->creds_source), "%s", o->auth_source);
		r->creds_why_none = true;
	} else {
		const char *files[4] = {o->auth_file, NULL, NULL, NULL};
		char xdg[512] = "", dock[512] = "";
		size_t nf = 1;
		if (!o->auth_file && !o->no_default_auth_files) {
			const char *env = getenv("REGISTRY_AUTH_FILE");
			const char *run = getenv("XDG_RUNTIME_DIR");
			const char *dc = getenv("DOCKER_CONFIG");
			const char *home = getenv("HOME");
			files[0] = env;
			if (run)
				snprintf(xdg, sizeof(xdg), "%s/containers/auth.json", run);
			if (dc)
				snprintf(dock, sizeof(dock), "%s/config.json", dc);
			else if (home)
				snprintf(dock, sizeof(dock), "%s/.docker/config.json", home);
			files[1] = xdg[0] ? xdg : NULL;
			files[2] = dock[0] ? dock : NULL;
			nf = 3;
		}
		for (size_t i = 0; i < nf && rc == -ENOENT; i++) {
			if (!files[i])
				continue;
			if (access(files[i], R_OK) != 0 && files[i] != o->auth_file)
				continue;
			rc = oci_creds_lookup_file(files[i], key, &r->creds, &e);
			snprintf(r->creds_source, sizeof(r->creds_source), "%s", files[i]);
		}
	}
	if (rc == 0) {
		r->have_creds = true;
	} else if (rc != -ENOENT) {
		/* a broken credentials source is reported, then we go on anonymously */
		log_warn("registry credentials unusable", "host", r->host, "error", e.msg);
		if (err)
			oci_errf(err, "%s", e.msg);
		oci_creds_clear(&r->creds);
	} else {
		oci_creds_clear(&r->creds);
	}
}

int oci_registry_new(const char *host, const struct oci_registry_opts *opts,
                     struct oci_registry **out, struct oci_err *err)
{
	pthread_once(&curl_once, curl_init_once);
	struct oci_registry_opts defaults;
	if (!opts) {
		oci_registry_opts_init(&defaults);
		opts = &defaults;
	}
	struct oci_registry *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->o = *opts;
	/* only keep the numbers and flags; strings we need are copied */
	r->o.username = r->o.password = r->o.auth_json = r->o.auth_file = r->o.plain_http = NULL;
	r->o.auth_source = NULL;
	r->o.ca_file = r->o.hosts_dir = r->o.registries_conf = NULL;
	snprintf(r->api_path, sizeof(r->api_path), "/v2");
	if (!(r->host = strdup(host)) || !(r->multi = curl_multi_init()) ||
	    (opts->ca_file && !(r->ca_file = strdup(opts->ca_file)))) {
		oci_registry_free(r);
		return -ENOMEM;
	}
	int rc = oci_mirrors_load(opts->hosts_dir, opts->registries_conf, host, &r->mirrors, err);
	if (rc) {
		oci_registry_free(r);
		return rc;
	}
	/* endpoint clients look their credentials up in the same places */
	if (r->mirrors && ((opts->auth_json && !(r->auth_json = strdup(opts->auth_json))) ||
	                   (opts->auth_file && !(r->auth_file = strdup(opts->auth_file))) ||
	                   (opts->username && !(r->username = strdup(opts->username))) ||
	                   (opts->password && !(r->password = strdup(opts->password))) ||
	                   (opts->auth_source && !(r->auth_source = strdup(opts->auth_source))))) {
		oci_registry_free(r);
		return -ENOMEM;
	}
	if (host_listed(opts->plain_http, host)) {
		r->plain_http = true;
		r->scheme_known = true;
	} else {
		r->scheme_known = !host_is_loopback(host);
	}
	curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, 8L);
	load_creds(r, opts, NULL);
	*out = r;
	return 0;
}

void oci_registry_free(struct oci_registry *r)
{
	if (!r)
		return;
	for (struct token *t = r->tokens, *n; t; t = n) {
		n = t->next;
		free(t->scope);
		if (t->value)
			explicit_bzero(t->value, strlen(t->value));
		free(t->value);
		free(t);
	}
	oci_creds_clear(&r->creds);
	for (size_t i = 0; i < r->n_eps; i++)
		oci_registry_free(r->eps[i].reg);
	oci_mirrors_free(r->mirrors);
	char *secrets[] = {r->auth_json, r->auth_file, r->username, r->password, r->auth_source};
	for (size_t i = 0; i < 5; i++) {
		if (secrets[i])
			explicit_bzero(secrets[i], strlen(secrets[i]));
		free(secrets[i]);
	}
	free(r->ca_pem);
	if (r->multi)
		curl_multi_cleanup(r->multi);
	free(r->realm);
	free(r->service);
	free(r->ca_file);
	free(r->host);
	free(r);
}

const char *oci_registry_scheme(const struct oci_registry *r)
{
	return r->plain_http ? "http" : "https";
}

void oci_fetched_clear(struct oci_fetched *f)
{
	if (!f)
		return;
	free(f->data);
	free(f->media_type);
	memset(f, 0, sizeof(*f));
}

/* ---- mirrors ---------------------------------------------------------- */

unsigned oci_registry_mirror_refusals(const struct oci_registry *r)
{
	return r->n_refused;
}

void reg_refuse(struct oci_registry *front, const char *host, const char *digest, const char *why)
{
	log_warn("mirror passed over for a blob: the next source is used", "mirror", host,
	         "registry", front->host, "digest", digest, "error", why);
	struct refusal *f = &front->refused[front->n_refused++ % MIRROR_REFUSALS_MAX];
	snprintf(f->host, sizeof(f->host), "%s", host);
	snprintf(f->digest, sizeof(f->digest), "%s", digest);
}

static bool refused(const struct oci_registry *front, const char *host, const char *digest)
{
	unsigned n =
	    front->n_refused < MIRROR_REFUSALS_MAX ? front->n_refused : MIRROR_REFUSALS_MAX;
	for (unsigned i = 0; i < n; i++)
		if (!strcmp(front->refused[i].host, host) &&
		    !strcmp(front->refused[i].digest, digest))
			return true;
	return false;
}

static int read_cas(struct oci_registry *c, const struct oci_endpoint *ep, struct oci_err *err)
{
	for (size_t i = 0; i < OCI_MIRRORS_CA_MAX && ep->ca[i][0]; i++) {
		char *pem = NULL;
		size_t len = 0;
		int rc = fsutil_read_file(ep->ca[i], 1u << 20, &pem, &len);
		if (rc) {
			oci_errf(err, "CA file %s of %s: %s", ep->ca[i], ep->host, strerror(-rc));
			return rc;
		}
		char *all = realloc(c->ca_pem, c->ca_len + len + 2);
		if (!all) {
			free(pem);
			return -ENOMEM;
		}
		memcpy(all + c->ca_len, pem, len);
		all[c->ca_len + len] = '\n';
		c->ca_len += len + 1;
		all[c->ca_len] = '\0';
		c->ca_pem = all;
		free(pem);
	}
	return 0;
}

/* The client that speaks to ep: the front itself for its own host as is,
 * else one made on first use and kept with the front. */
static int endpoint_client(struct oci_registry *r, const struct oci_endpoint *ep,
                           struct oci_registry **out, struct oci_err *err)
{
	if (!ep->mirror && !strcmp(ep->host, r->host) && !strcmp(ep->path, "/v2") &&
	    !ep->ca[0][0] && !ep->skip_verify && !ep->insecure && !ep->plain_http) {
		*out = r;
		return 0;
	}
	char key[sizeof(r->eps[0].key)];
	snprintf(key, sizeof(key), "%s|%s|%d%d%d%d|%s", ep->host, ep->path, ep->mirror,
	         ep->plain_http, ep->insecure, ep->skip_verify, ep->ca[0]);
	for (size_t i = 0; i < r->n_eps; i++)
		if (!strcmp(r->eps[i].key, key)) {
			*out = r->eps[i].reg;
			return 0;
		}
	if (r->n_eps >= MIRROR_CLIENTS_MAX) {
		oci_errf(err, "too many mirror endpoints for %s", r->host);
		return -E2BIG;
	}
	struct oci_registry_opts o = r->o;
	o.auth_json = r->auth_json;
	o.auth_file = r->auth_file;
	o.username = r->username;
	o.password = r->password;
	o.auth_source = r->auth_source;
	o.plain_http = ep->plain_http ? ep->host : NULL;
	o.ca_file = r->ca_file;
	o.tls_no_verify = r->o.tls_no_verify || ep->skip_verify || ep->insecure;
	o.hosts_dir = o.registries_conf = NULL;
	struct oci_registry *c = NULL;
	int rc = oci_registry_new(ep->host, &o, &c, err);
	if (rc)
		return rc;
	c->front = r;
	c->mirror = ep->mirror;
	snprintf(c->api_path, sizeof(c->api_path), "%s", ep->path);
	if (ep->insecure && !ep->plain_http)
		c->scheme_known = false; /* HTTPS, else HTTP */
	if ((rc = read_cas(c, ep, err))) {
		oci_registry_free(c);
		return rc;
	}
	snprintf(r->eps[r->n_eps].key, sizeof(key), "%s", key);
	r->eps[r->n_eps++].reg = c;
	*out = c;
	return 0;
}

/* A small blob read whole, handed out from memory. */
struct mem_blob {
	char *data;
	size_t len, off;
};

static ssize_t mem_read(void *ctx, void *buf, size_t len, struct oci_err *e)
{
	struct mem_blob *m = ctx;
	(void)e;
	size_t n = m->len - m->off < len ? m->len - m->off : len;
	memcpy(buf, m->data + m->off, n);
	m->off += n;
	return (ssize_t)n;
}

static void mem_close(void *ctx)
{
	struct mem_blob *m = ctx;
	free(m->data);
	free(m);
}

static const struct oci_blob_source mem_source = {mem_read, mem_close, NULL};

/* From a mirror: small blobs are checked before anyone sees them. */
static int mirror_blob_open(struct oci_registry *c, const char *repo, const struct oci_desc *d,
                            const char *what, struct oci_blob_reader **out, struct oci_err *err)
{
	struct oci_blob_reader *rd = NULL;
	int rc = reg_blob_open_at(c, repo, d, what, &rd, err);
	if (rc || d->size < 0 || d->size > (int64_t)MIRROR_WHOLE_MAX) {
		*out = rd;
		return rc;
	}
	struct mem_blob *m = calloc(1, sizeof(*m));
	if (!m) {
		oci_blob_close(rd);
		return -ENOMEM;
	}
	if ((rc = oci_blob_slurp(rd, MIRROR_WHOLE_MAX, &m->data, &m->len, err))) {
		free(m);
		return rc;
	}
	return oci_blob_reader_new(&mem_source, m, d->digest, d->size, what, out);
}

enum op { OP_RESOLVE, OP_MANIFEST, OP_BLOB, OP_BLOB_READABLE, OP_REFERRERS };

struct call {
	enum op op;
	const char *reference; /* tag or digest; the blob's or subject's digest */
	const struct oci_desc *desc;
	const char *what, *artifact_type;
	void *out;
};

static int call_at(struct oci_registry *c, const char *repo, const struct call *k,
                   struct oci_err *err)
{
	switch (k->op) {
	case OP_RESOLVE:
		return reg_resolve_at(c, repo, k->reference, k->out, err);
	case OP_MANIFEST:
		return reg_get_manifest_at(c, repo, k->reference, k->out, err);
	case OP_BLOB:
		return c->mirror ? mirror_blob_open(c, repo, k->desc, k->what, k->out, err)
		                 : reg_blob_open_at(c, repo, k->desc, k->what, k->out, err);
	case OP_BLOB_READABLE:
		return reg_blob_readable_at(c, repo, k->desc, err);
	case OP_REFERRERS: {
		struct oci_index *ix = k->out;
		int rc = reg_referrers_at(c, repo, k->reference, k->artifact_type, ix, err);
		if (rc == 0 && c->mirror && ix->n_manifests == 0) {
			/* a mirror may lack what was attached later */
			oci_errf(err, "no referrers of %s on %s", k->reference, c->host);
			return -ENOENT;
		}
		return rc;
	}
	}
	return -EINVAL;
}

static bool down(int rc)
{
	return rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
	       rc == -ECONNRESET || rc == -EAGAIN || rc == -ENETUNREACH;
}

/* Ask each source of the route in turn until one answers. */
static int routed(struct oci_registry *r, const char *repo, const struct call *k,
                  struct oci_err *err)
{
	struct oci_route rt;
	bool blob = k->op == OP_BLOB || k->op == OP_BLOB_READABLE;
	bool by_digest = blob || k->op == OP_REFERRERS || reg_is_digest_ref(k->reference);
	int rc = oci_mirrors_route(r->mirrors, r->host, repo, by_digest, &rt, err);
	if (rc)
		return rc;
	char passed[512] = "";
	size_t n_mirrors = 0;
	bool all_down = true;
	int mirror_said = 0; /* a mirror's "not there" */
	for (size_t i = 0; i < rt.n; i++) {
		const struct oci_endpoint *ep = &rt.ep[i];
		const char *digest = blob ? k->desc->digest : NULL;
		if (ep->mirror && digest && refused(r, ep->host, digest))
			continue;
		struct oci_registry *c = NULL;
		struct oci_err e;
		memset(&e, 0, sizeof(e));
		if ((rc = endpoint_client(r, ep, &c, &e)) == 0 &&
		    (rc = call_at(c, ep->repo, k, &e)) == 0)
			return 0;
		if (rc == -ECANCELED || !ep->mirror) {
			oci_errf(err, "%s", oci_err_str(&e, rc));
			if (mirror_said && down(rc)) {
				/* the origin cannot be asked (an air-gapped node):
				 * what the mirrors say is the answer */
				oci_err_prefix(err, "not on the mirrors (%s), origin unreachable",
				               passed);
				return mirror_said;
			}
			if (n_mirrors && all_down && down(rc)) {
				oci_err_prefix(err, "no mirror (%s) nor the origin answered",
				               passed);
				return -ENETUNREACH;
			}
			if (n_mirrors)
				oci_err_prefix(err, "mirrors passed over (%s), then", passed);
			return rc;
		}
		n_mirrors++;
		all_down = all_down && down(rc);
		if (rc == -ENOENT || (k->op == OP_REFERRERS && rc == -EOPNOTSUPP))
			mirror_said = k->op == OP_REFERRERS ? -EOPNOTSUPP : -ENOENT;
		size_t used = strlen(passed);
		snprintf(passed + used, sizeof(passed) - used, "%s%s", used ? ", " : "", ep->host);
		log_kv(rc == -ENOENT ? LOG_DEBUG : LOG_WARN,
		       "mirror did not serve, trying the next", "mirror", ep->host, "registry",
		       r->host, "error", oci_err_str(&e, rc), (char *)0);
	}
	oci_errf(err, "no source left for %s of %s/%s", k->reference, r->host, repo);
	return -ENOENT;
}

int oci_registry_blob_readable(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                               struct oci_err *err)
{
	struct call k = {.op = OP_BLOB_READABLE, .reference = d->digest, .desc = d};
	return routed(r, repo, &k, err);
}

int oci_registry_resolve(struct oci_registry *r, const char *repo, const char *reference,
                         struct oci_desc *out, struct oci_err *err)
{
	struct call k = {.op = OP_RESOLVE, .reference = reference, .out = out};
	return routed(r, repo, &k, err);
}

int oci_registry_get_manifest(struct oci_registry *r, const char *repo, const char *reference,
                              struct oci_fetched *out, struct oci_err *err)
{
	struct call k = {.op = OP_MANIFEST, .reference = reference, .out = out};
	return routed(r, repo, &k, err);
}

int oci_registry_blob_open(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                           const char *what, struct oci_blob_reader **out, struct oci_err *err)
{
	struct call k = {
	    .op = OP_BLOB, .reference = d->digest, .desc = d, .what = what, .out = out};
	return routed(r, repo, &k, err);
}

int oci_registry_referrers(struct oci_registry *r, const char *repo, const char *digest,
                           const char *artifact_type, struct oci_index *out, struct oci_err *err)
{
	struct call k = {
	    .op = OP_REFERRERS, .reference = digest, .artifact_type = artifact_type, .out = out};
	return routed(r, repo, &k, err);
}
