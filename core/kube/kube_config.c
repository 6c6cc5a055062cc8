/* kubeconfig and in-cluster configuration (see kube_config.h). */
#include "base64.h"
#include "fsutil.h"
#include "errbuf.h"
#include "kube_config.h"
#include "yamljson.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "loop.h"

#define CONFIG_MAX_BYTES (1u << 20) /* kubeconfig, token, CA and key files */
#define TOKEN_RECHECK_MS 1000ull    /* stat() the token file at most this often */
#define TOKEN_REREAD_MS 60000ull    /* and read it at least this often */

/* Read a whole small file. *out is NUL-terminated (the NUL is not counted). */

/* ---- YAML -> cJSON ---- */

int kube_config_yaml_to_json(const char *text, size_t len, cJSON **out, char *err, size_t errlen)
{
	cJSON *docs = NULL;
	if (len > CONFIG_MAX_BYTES) {
		errbuf_set(err, errlen, "yaml: document larger than %u bytes", CONFIG_MAX_BYTES);
		return -EINVAL;
	}
	int rc = yamljson_parse(text, len, &docs, err, errlen);
	if (rc)
		return rc == -ENOMEM ? rc : -EINVAL;
	cJSON *first = cJSON_DetachItemFromArray(docs, 0);
	cJSON_Delete(docs);
	if (!first) {
		errbuf_set(err, errlen, "yaml: empty document");
		return -EINVAL;
	}
	*out = first;
	return 0;
}

/* ---- helpers over the parsed kubeconfig ---- */

static const char *jstr(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Find the entry of list `section` whose name is `name`, return its `field`. */
static const cJSON *named(const cJSON *root, const char *section, const char *field,
                          const char *name)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, section);
	const cJSON *it;
	cJSON_ArrayForEach(it, list)
	{
		const char *n = jstr(it, "name");
		if (n && !strcmp(n, name))
			return cJSON_GetObjectItemCaseSensitive(it, field);
	}
	return NULL;
}

/* Read as kubectl reads it (client-go: encoding/json's []byte, Go's
 * StdEncoding): line breaks ignored, padding required, nothing else. */
static int b64decode(const char *in, struct kube_blob *out)
{
	unsigned char *buf = NULL;
	size_t len = 0;
	int rc = base64_decode(in, strlen(in), BASE64_STD, &buf, &len, NULL);
	if (rc < 0)
		return rc;
	out->data = buf; /* NUL-terminated for PEM consumers; not counted */
	out->len = len;
	return 0;
}

static char *xstrdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* Resolve a path from the kubeconfig against its directory. */
static char *resolve_path(const char *dir, const char *p)
{
	if (!p || !*p)
		return NULL;
	if (p[0] == '/' || !dir)
		return strdup(p);
	char *r = NULL;
	if (asprintf(&r, "%s/%s", dir, p) < 0)
		return NULL;
	return r;
}

static struct kube_config *config_alloc(void)
{
	struct kube_config *c = calloc(1, sizeof(*c));
	if (c)
		pthread_mutex_init(&c->token_lock, NULL);
	return c;
}

void kube_config_free(struct kube_config *c)
{
	if (!c)
		return;
	free(c->server);
	free(c->namespace);
	free(c->context);
	free(c->tls_server_name);
	free(c->ca_file);
	free(c->ca_data.data);
	free(c->cert_file);
	free(c->key_file);
	free(c->cert_data.data);
	free(c->key_data.data);
	free(c->username);
	free(c->password);
	if (c->token)
		explicit_bzero(c->token, strlen(c->token));
	free(c->token);
	free(c->token_file);
	pthread_mutex_destroy(&c->token_lock);
	free(c);
}

/* Strip trailing whitespace/newlines (token files end with one). */
static void rtrim(char *s)
{
	size_t n = strlen(s);
	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
		s[--n] = '\0';
}

/* Read the token file; caller holds token_lock (or owns c exclusively). */
static int token_reload(struct kube_config *c, const struct stat *st)
{
	char *tok = NULL;
	size_t len = 0;
	int rc = fsutil_read_file(c->token_file, 64 * 1024, &tok, &len);
	if (rc < 0)
		return rc;
	if (strlen(tok) != len) {
		free(tok);
		return -EINVAL;
	}
	rtrim(tok);
	if (c->token) {
		explicit_bzero(c->token, strlen(c->token));
		free(c->token);
	}
	c->token = tok;
	c->token_mtime = st->st_mtim;
	c->token_ino = (unsigned long long)st->st_ino;
	c->token_size = (long long)st->st_size;
	c->token_reread_ms = loop_now_ms();
	return 0;
}

int kube_config_token(struct kube_config *c, char *buf, size_t len)
{
	int rc = 0;
	if (len == 0)
		return -ENOSPC;
	pthread_mutex_lock(&c->token_lock);
	if (c->token_file) {
		unsigned long long now = loop_now_ms();
		if (now - c->token_checked_ms >= TOKEN_RECHECK_MS || !c->token) {
			c->token_checked_ms = now;
			struct stat st;
			if (stat(c->token_file, &st) < 0) {
				rc = -errno;
			} else if (!c->token || st.st_mtim.tv_sec != c->token_mtime.tv_sec ||
			           st.st_mtim.tv_nsec != c->token_mtime.tv_nsec ||
			           (unsigned long long)st.st_ino != c->token_ino ||
			           (long long)st.st_size != c->token_size ||
			           now - c->token_reread_ms >= TOKEN_REREAD_MS) {
				rc = token_reload(c, &st);
				if (rc == 0)
					log_debug("kube: bearer token re-read", "file",
					          c->token_file);
			}
			if (rc < 0)
				log_warn(
				    "kube: cannot re-read the token file, keeping the last token",
				    "file", c->token_file, "error", strerror(-rc));
		}
	}
	const char *t = c->token ? c->token : "";
	size_t tl = strlen(t);
	if (tl + 1 > len) {
		rc = -ENOSPC;
	} else {
		memcpy(buf, t, tl + 1);
		if (c->token)
			rc = 0; /* a read error with a last good token is only logged */
	}
	pthread_mutex_unlock(&c->token_lock);
	return rc;
}

/* Set a field from "<name>" (path) and "<name>-data" (base64). */
static int file_or_data(const cJSON *o, const char *fkey, const char *dkey, const char *dir,
                        char **file, struct kube_blob *data, char *err, size_t errlen,
                        const char *where)
{
	const char *d = jstr(o, dkey);
	if (d && *d) {
		if (b64decode(d, data) < 0) {
			errbuf_set(err, errlen, "%s: %s is not valid base64", where, dkey);
			return -EINVAL;
		}
		return 0;
	}
	const char *f = jstr(o, fkey);
	if (f && *f) {
		*file = resolve_path(dir, f);
		if (!*file)
			return -ENOMEM;
		if (access(*file, R_OK) < 0) {
			int e = errno;
			errbuf_set(err, errlen, "%s: %s %s: %s", where, fkey, *file, strerror(e));
			return -e;
		}
	}
	return 0;
}

static bool is_true(const cJSON *v)
{
	return cJSON_IsTrue(v) || (cJSON_IsString(v) && !strcmp(v->valuestring, "true"));
}

/* The kubeconfig to read when none is named: the first readable file of
 * $KUBECONFIG, else ~/.kube/config. *env_copy and *home_path hold what *path
 * points into, for the caller to free. */
static int default_path(const char **path, char **env_copy, char **home_path, char *err,
                        size_t errlen)
{
	const char *env = getenv("KUBECONFIG");
	if (env && *env) {
		*env_copy = strdup(env);
		if (!*env_copy)
			return -ENOMEM;
		char *save = NULL;
		for (char *p = strtok_r(*env_copy, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
			if (access(p, R_OK) == 0) {
				*path = p;
				return 0;
			}
		}
	}
	const char *home = getenv("HOME");
	if (!home || asprintf(home_path, "%s/.kube/config", home) < 0) {
		*home_path = NULL;
		errbuf_set(err, errlen, "no kubeconfig: set KUBECONFIG or HOME");
		return -ENOENT;
	}
	*path = *home_path;
	return 0;
}

/* The kubeconfig at path, parsed; where names it in messages. */
static int read_kubeconfig(const char *path, const char *where, cJSON **root, char *err,
                           size_t errlen)
{
	char *text = NULL;
	size_t len = 0;
	int rc = fsutil_read_file(path, CONFIG_MAX_BYTES, &text, &len);
	if (rc < 0) {
		errbuf_set(err, errlen, "%s: %s", where, strerror(-rc));
		return rc;
	}
	char yerr[256] = "";
	rc = kube_config_yaml_to_json(text, len, root, yerr, sizeof(yerr));
	free(text);
	if (rc < 0) {
		errbuf_set(err, errlen, "%s: %s", where, yerr);
		return rc;
	}
	if (!cJSON_IsObject(*root)) {
		errbuf_set(err, errlen, "%s: not a mapping", where);
		return -EINVAL;
	}
	return 0;
}

/* What a context of the kubeconfig names (pointers into its tree). */
struct kubeconfig_use {
	const char *ctxname, *clname, *username, *server;
	const cJSON *ctx, *cl, *user; /* user NULL: none */
};

/* The context to use (context, or the current one), its cluster and user. */
static int pick_context(const cJSON *root, const char *context, const char *where,
                        struct kubeconfig_use *u, char *err, size_t errlen)
{
	memset(u, 0, sizeof(*u));
	u->ctxname = context ? context : jstr(root, "current-context");
	if (!u->ctxname || !*u->ctxname) {
		errbuf_set(err, errlen, "%s: no current-context and no context given", where);
		return -EINVAL;
	}
	u->ctx = named(root, "contexts", "context", u->ctxname);
	if (!cJSON_IsObject(u->ctx)) {
		errbuf_set(err, errlen, "%s: context \"%s\" not found", where, u->ctxname);
		return -ENOENT;
	}
	u->clname = jstr(u->ctx, "cluster");
	u->username = jstr(u->ctx, "user");
	u->cl = u->clname ? named(root, "clusters", "cluster", u->clname) : NULL;
	if (!cJSON_IsObject(u->cl)) {
		errbuf_set(err, errlen, "%s: cluster \"%s\" of context \"%s\" not found", where,
		           u->clname ? u->clname : "", u->ctxname);
		return -ENOENT;
	}
	u->user = u->username ? named(root, "users", "user", u->username) : NULL;
	if (u->username && *u->username && !cJSON_IsObject(u->user)) {
		errbuf_set(err, errlen, "%s: user \"%s\" of context \"%s\" not found", where,
		           u->username, u->ctxname);
		return -ENOENT;
	}
	u->server = jstr(u->cl, "server");
	if (!u->server || (strncmp(u->server, "https://", 8) && strncmp(u->server, "http://", 7))) {
		errbuf_set(err, errlen, "%s: cluster \"%s\" has no http(s) server URL", where,
		           u->clname);
		return -EINVAL;
	}
	return 0;
}

/* The context's server, namespace and the cluster's TLS settings into c. */
static int set_cluster(struct kube_config *c, const struct kubeconfig_use *u, const char *dir,
                       const char *where, char *err, size_t errlen)
{
	c->server = strdup(u->server);
	c->context = strdup(u->ctxname);
	const char *ns = jstr(u->ctx, "namespace");
	c->namespace = strdup(ns && *ns ? ns : "default");
	if (!c->server || !c->context || !c->namespace)
		return -ENOMEM;
	size_t sl = strlen(c->server);
	while (sl > 0 && c->server[sl - 1] == '/')
		c->server[--sl] = '\0';
	c->insecure = is_true(cJSON_GetObjectItemCaseSensitive(u->cl, "insecure-skip-tls-verify"));
	c->tls_server_name = xstrdup(jstr(u->cl, "tls-server-name"));
	return file_or_data(u->cl, "certificate-authority", "certificate-authority-data", dir,
	                    &c->ca_file, &c->ca_data, err, errlen, where);
}

/* The user's credentials into c: a client certificate and key, a token or
 * a token file, a username and password. */
static int set_user(struct kube_config *c, const struct kubeconfig_use *u, const char *dir,
                    const char *where, char *err, size_t errlen)
{
	const cJSON *user = u->user;
	int rc = file_or_data(user, "client-certificate", "client-certificate-data", dir,
	                      &c->cert_file, &c->cert_data, err, errlen, where);
	if (rc < 0)
		return rc;
	rc = file_or_data(user, "client-key", "client-key-data", dir, &c->key_file, &c->key_data,
	                  err, errlen, where);
	if (rc < 0)
		return rc;
	bool has_cert = c->cert_file || c->cert_data.data;
	bool has_key = c->key_file || c->key_data.data;
	if (has_cert != has_key) {
		errbuf_set(err, errlen, "%s: user \"%s\" has a client %s without its %s", where,
		           u->username, has_cert ? "certificate" : "key",
		           has_cert ? "key" : "certificate");
		return -EINVAL;
	}
	const char *tok = jstr(user, "token");
	const char *tokfile = jstr(user, "tokenFile");
	if (tok && *tok) {
		c->token = strdup(tok);
		if (!c->token)
			return -ENOMEM;
	} else if (tokfile && *tokfile) {
		c->token_file = resolve_path(dir, tokfile);
		if (!c->token_file)
			return -ENOMEM;
		char tb[8];
		rc = kube_config_token(c, tb, sizeof(tb));
		if (rc < 0 && rc != -ENOSPC) {
			errbuf_set(err, errlen, "%s: tokenFile %s: %s", where, c->token_file,
			           strerror(-rc));
			return rc;
		}
	}
	c->username = xstrdup(jstr(user, "username"));
	c->password = xstrdup(jstr(user, "password"));
	if (cJSON_GetObjectItemCaseSensitive(user, "exec") ||
	    cJSON_GetObjectItemCaseSensitive(user, "auth-provider"))
		log_warn("kube: kubeconfig exec and auth-provider plugins are not supported",
		         "user", u->username);
	return 0;
}

int kube_config_load_file(const char *path, const char *context, struct kube_config **out,
                          char *err, size_t errlen)
{
	char *dir = NULL, *home_path = NULL, *env_copy = NULL;
	cJSON *root = NULL;
	struct kube_config *c = NULL;
	struct kubeconfig_use u;
	int rc = 0;
	char where[PATH_MAX + 32];

	if (!path && (rc = default_path(&path, &env_copy, &home_path, err, errlen)) < 0)
		goto out;
	snprintf(where, sizeof(where), "kubeconfig %s", path);
	if ((rc = read_kubeconfig(path, where, &root, err, errlen)) < 0)
		goto out;
	const char *slash = strrchr(path, '/');
	if (slash)
		dir = strndup(path, (size_t)(slash - path ? slash - path : 1));
	if ((rc = pick_context(root, context, where, &u, err, errlen)) < 0)
		goto out;
	c = config_alloc();
	if (!c) {
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = set_cluster(c, &u, dir, where, err, errlen)) < 0 ||
	    (u.user && (rc = set_user(c, &u, dir, where, err, errlen)) < 0))
		goto out;
	*out = c;
	c = NULL;
	rc = 0;
out:
	kube_config_free(c);
	cJSON_Delete(root);
	free(dir);
	free(home_path);
	free(env_copy);
	return rc;
}

int kube_config_load_incluster(const char *sa_dir, struct kube_config **out, char *err,
                               size_t errlen)
{
	const char *host = getenv("KUBERNETES_SERVICE_HOST");
	const char *port = getenv("KUBERNETES_SERVICE_PORT");
	if (!sa_dir)
		sa_dir = KUBE_SA_DIR;
	if (!host || !*host || !port || !*port) {
		errbuf_set(err, errlen,
		           "not running in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set");
		return -ENOENT;
	}
	for (const char *p = port; *p; p++)
		if (*p < '0' || *p > '9') {
			errbuf_set(err, errlen, "KUBERNETES_SERVICE_PORT \"%s\" is not a port",
			           port);
			return -EINVAL;
		}
	struct kube_config *c = config_alloc();
	char *nsbuf = NULL;
	size_t nslen = 0;
	int rc = -ENOMEM;
	if (!c)
		return -ENOMEM;
	bool v6 = strchr(host, ':') != NULL;
	if (asprintf(&c->server, v6 ? "https://[%s]:%s" : "https://%s:%s", host, port) < 0) {
		c->server = NULL;
		goto out;
	}
	if (asprintf(&c->token_file, "%s/token", sa_dir) < 0) {
		c->token_file = NULL;
		goto out;
	}
	char tb[8];
	rc = kube_config_token(c, tb, sizeof(tb));
	if (rc < 0 && rc != -ENOSPC) {
		errbuf_set(err, errlen, "service account token %s: %s", c->token_file,
		           strerror(-rc));
		goto out;
	}
	if (asprintf(&c->ca_file, "%s/ca.crt", sa_dir) < 0) {
		c->ca_file = NULL;
		rc = -ENOMEM;
		goto out;
	}
	if (access(c->ca_file, R_OK) < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "service account CA bundle %s: %s", c->ca_file,
		           strerror(-rc));
		goto out;
	}
	char nspath[PATH_MAX];
	snprintf(nspath, sizeof(nspath), "%s/namespace", sa_dir);
	if (fsutil_read_file(nspath, 4096, &nsbuf, &nslen) == 0) {
		rtrim(nsbuf);
		c->namespace = nsbuf;
		nsbuf = NULL;
	}
	if (!c->namespace || !*c->namespace) {
		free(c->namespace);
		c->namespace = strdup("default");
		if (!c->namespace) {
			rc = -ENOMEM;
			goto out;
		}
	}
	*out = c;
	c = NULL;
	rc = 0;
out:
	free(nsbuf);
	kube_config_free(c);
	return rc;
}

int kube_config_load(const char *path, const char *context, struct kube_config **out, char *err,
                     size_t errlen)
{
	if (!path && getenv("KUBERNETES_SERVICE_HOST"))
		return kube_config_load_incluster(NULL, out, err, errlen);
	return kube_config_load_file(path, context, out, err, errlen);
}
