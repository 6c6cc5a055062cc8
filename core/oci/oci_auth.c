#include "base64.h"
#include "fsutil.h"
#include "oci_auth.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "oci_blob.h"

#define AUTH_FILE_MAX (4u << 20)

void oci_challenge_clear(struct oci_challenge *c)
{
	if (!c)
		return;
	free(c->realm);
	free(c->service);
	free(c->scope);
	free(c->error);
	memset(c, 0, sizeof(*c));
}

static bool is_tchar(char c)
{
	return isalnum((unsigned char)c) || strchr("!#$%&'*+-.^_`|~/", c);
}

/* Read a token or a quoted-string at *p into a new string. */
static int read_value(const char **p, char **out)
{
	const char *s = *p;
	size_t cap = strlen(s) + 1, n = 0;
	char *v = malloc(cap);
	if (!v)
		return -ENOMEM;
	if (*s == '"') {
		s++;
		while (*s && *s != '"') {
			if (*s == '\\' && s[1])
				s++;
			v[n++] = *s++;
		}
		if (*s != '"') {
			free(v);
			return -EINVAL;
		}
		s++;
	} else {
		while (*s && (is_tchar(*s) || *s == '=' || *s == ':'))
			v[n++] = *s++;
	}
	v[n] = '\0';
	*p = s;
	*out = v;
	return 0;
}

int oci_challenge_parse(const char *hdr, struct oci_challenge *out, struct oci_err *err)
{
	struct oci_challenge cand[2] = {{0}}; /* [0] basic, [1] bearer */
	struct oci_challenge *cur = NULL;
	const char *p = hdr ? hdr : "";
	int rc = -EINVAL;
	for (;;) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (!*p)
			break;
		const char *t = p;
		while (*p && is_tchar(*p))
			p++;
		size_t tlen = (size_t)(p - t);
		if (tlen == 0) {
			oci_errf(err, "malformed WWW-Authenticate header '%s'", hdr);
			goto out;
		}
		const char *q = p;
		while (*q == ' ' || *q == '\t')
			q++;
		if (*q == '=' && q[1] != '=') {
			q++;
			while (*q == ' ' || *q == '\t')
				q++;
			char *val = NULL;
			rc = read_value(&q, &val);
			if (rc) {
				if (rc == -EINVAL)
					oci_errf(
					    err,
					    "unterminated quoted string in WWW-Authenticate '%s'",
					    hdr);
				goto out;
			}
			rc = -EINVAL;
			p = q;
			char **slot = NULL;
			if (cur && tlen == 5 && strncasecmp(t, "realm", 5) == 0)
				slot = &cur->realm;
			else if (cur && tlen == 7 && strncasecmp(t, "service", 7) == 0)
				slot = &cur->service;
			else if (cur && tlen == 5 && strncasecmp(t, "scope", 5) == 0)
				slot = &cur->scope;
			else if (cur && tlen == 5 && strncasecmp(t, "error", 5) == 0)
				slot = &cur->error;
			if (slot) {
				free(*slot);
				*slot = val;
			} else {
				free(val);
			}
			continue;
		}
		/* a new scheme */
		if (tlen == 5 && strncasecmp(t, "basic", 5) == 0) {
			cur = &cand[0];
			oci_challenge_clear(cur);
			cur->scheme = OCI_AUTH_BASIC;
		} else if (tlen == 6 && strncasecmp(t, "bearer", 6) == 0) {
			cur = &cand[1];
			oci_challenge_clear(cur);
			cur->scheme = OCI_AUTH_BEARER;
		} else {
			cur = NULL; /* a scheme we do not speak: skip its parameters */
		}
		/* skip a token68 */
		while (*p == ' ')
			p++;
		if (*p && *p != ',' && !cur) {
			/* token68 is tchars then '=' padding; a parameter is name=value */
			const char *r = p;
			while (*r && is_tchar(*r))
				r++;
			const char *pad = r;
			while (*pad == '=')
				pad++;
			bool ends = *pad == '\0' || *pad == ',' || *pad == ' ';
			const char *r2 = r;
			while (*r2 == ' ')
				r2++;
			if (*r2 != '=' || (pad > r && ends))
				p = ends ? pad : r;
		}
	}
	if (cand[1].scheme == OCI_AUTH_BEARER) {
		if (!cand[1].realm || !*cand[1].realm) {
			oci_errf(err, "Bearer challenge without a realm in '%s'", hdr);
			goto out;
		}
		*out = cand[1];
		memset(&cand[1], 0, sizeof(cand[1]));
		rc = 0;
	} else if (cand[0].scheme == OCI_AUTH_BASIC) {
		*out = cand[0];
		memset(&cand[0], 0, sizeof(cand[0]));
		rc = 0;
	} else {
		oci_errf(err, "registry asks for an authentication scheme gkm does not speak: '%s'",
		         hdr ? hdr : "");
	}
out:
	oci_challenge_clear(&cand[0]);
	oci_challenge_clear(&cand[1]);
	return rc;
}

void oci_creds_clear(struct oci_creds *c)
{
	if (!c)
		return;
	if (c->password)
		explicit_bzero(c->password, strlen(c->password));
	if (c->identity_token)
		explicit_bzero(c->identity_token, strlen(c->identity_token));
	free(c->username);
	free(c->password);
	free(c->identity_token);
	memset(c, 0, sizeof(*c));
}

static const char *jstr(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* "https://quay.io/v1/" -> "quay.io" for comparison. */
static void normalise_key(const char *k, char *out, size_t cap)
{
	if (strncmp(k, "https://", 8) == 0)
		k += 8;
	else if (strncmp(k, "http://", 7) == 0)
		k += 7;
	snprintf(out, cap, "%s", k);
	char *slash = strchr(out, '/');
	if (slash)
		*slash = '\0';
}

static bool is_hub(const char *h)
{
	return strcmp(h, "docker.io") == 0 || strcmp(h, "index.docker.io") == 0 ||
	       strcmp(h, "registry-1.docker.io") == 0;
}

static int entry_to_creds(const cJSON *e, const char *host, struct oci_creds *out,
                          struct oci_err *err)
{
	struct oci_creds c = {0};
	const char *auth = jstr(e, "auth");
	const char *user = jstr(e, "username");
	const char *pass = jstr(e, "password");
	const char *tok = jstr(e, "identitytoken");
	int rc = -ENOMEM;
	if (auth && *auth) {
		unsigned char *dec = NULL;
		size_t dlen = 0;
		if (base64_decode(auth, strlen(auth), BASE64_STD, &dec, &dlen, NULL) ||
		    memchr(dec, '\0', dlen)) {
			free(dec);
			oci_errf(err, "credentials for %s: 'auth' is not base64 of user:password",
			         host);
			return -EINVAL;
		}
		char *colon = strchr((char *)dec, ':');
		if (!colon) {
			explicit_bzero(dec, dlen);
			free(dec);
			oci_errf(err, "credentials for %s: 'auth' does not hold user:password",
			         host);
			return -EINVAL;
		}
		*colon = '\0';
		c.username = strdup((char *)dec);
		c.password = strdup(colon + 1);
		explicit_bzero(dec, dlen);
		free(dec);
		if (!c.username || !c.password)
			goto fail;
	} else if (user && pass) {
		if (!(c.username = strdup(user)) || !(c.password = strdup(pass)))
			goto fail;
	}
	if (tok && *tok && !(c.identity_token = strdup(tok)))
		goto fail;
	if (!c.username && !c.identity_token) {
		oci_errf(err,
		         "credentials for %s hold neither auth, username/password nor "
		         "identitytoken",
		         host);
		return -EINVAL;
	}
	*out = c;
	return 0;
fail:
	oci_creds_clear(&c);
	return rc;
}

static int lookup_doc(const cJSON *doc, const char *host, struct oci_creds *out,
                      struct oci_err *err, int depth);

/* A Secret's data value: base64 of a dockerconfigjson document. */
static int lookup_encoded(const char *b64, bool encoded, const char *host, struct oci_creds *out,
                          struct oci_err *err, int depth)
{
	unsigned char *dec = NULL;
	size_t dlen = 0;
	if (encoded) {
		if (base64_decode(b64, strlen(b64), BASE64_STD, &dec, &dlen, NULL)) {
			oci_errf(err, "pull secret data is not valid base64");
			return -EINVAL;
		}
	}
	const char *doc_s = encoded ? (const char *)dec : b64;
	size_t doc_len = encoded ? dlen : strlen(b64);
	cJSON *d = cJSON_ParseWithLength(doc_s, doc_len);
	int rc;
	if (!d) {
		oci_errf(err, "pull secret does not hold a JSON dockerconfig document");
		rc = -EINVAL;
	} else {
		rc = lookup_doc(d, host, out, err, depth + 1);
	}
	cJSON_Delete(d);
	if (dec) {
		explicit_bzero(dec, dlen);
		free(dec);
	}
	return rc;
}

static int lookup_doc(const cJSON *doc, const char *host, struct oci_creds *out,
                      struct oci_err *err, int depth)
{
	if (!cJSON_IsObject(doc) || depth > 2) {
		oci_errf(err, "credentials document is not a JSON object");
		return -EINVAL;
	}
	/* A Kubernetes Secret */
	const cJSON *data = cJSON_GetObjectItemCaseSensitive(doc, "data");
	const cJSON *sdata = cJSON_GetObjectItemCaseSensitive(doc, "stringData");
	static const char *const keys[] = {".dockerconfigjson", ".dockercfg"};
	for (size_t i = 0; i < 2; i++) {
		const char *v = sdata ? jstr(sdata, keys[i]) : NULL;
		if (v)
			return lookup_encoded(v, false, host, out, err, depth);
		v = data ? jstr(data, keys[i]) : NULL;
		if (v)
			return lookup_encoded(v, true, host, out, err, depth);
	}
	if (cJSON_IsObject(data) && jstr(doc, "kind")) {
		oci_errf(err, "secret has no .dockerconfigjson or .dockercfg data");
		return -EINVAL;
	}
	const cJSON *auths = cJSON_GetObjectItemCaseSensitive(doc, "auths");
	if (!auths)
		auths = doc; /* the older .dockercfg shape */
	if (!cJSON_IsObject(auths)) {
		oci_errf(err, "credentials document: 'auths' is not an object");
		return -EINVAL;
	}
	const cJSON *e;
	cJSON_ArrayForEach(e, auths)
	{
		char k[512];
		if (!e->string || !cJSON_IsObject(e))
			continue;
		normalise_key(e->string, k, sizeof(k));
		if (strcmp(k, host) == 0 || (is_hub(host) && is_hub(k)))
			return entry_to_creds(e, host, out, err);
	}
	if (jstr(doc, "credsStore") || cJSON_GetObjectItemCaseSensitive(doc, "credHelpers"))
		oci_errf(err, "no inline credentials for %s (credential helpers are not supported)",
		         host);
	else
		oci_errf(err, "no credentials for %s", host);
	return -ENOENT;
}

int oci_creds_lookup(const char *json, size_t len, const char *host, struct oci_creds *out,
                     struct oci_err *err)
{
	cJSON *doc = cJSON_ParseWithLength(json, len);
	if (!doc) {
		oci_errf(err, "credentials document is not valid JSON");
		return -EINVAL;
	}
	int rc = lookup_doc(doc, host, out, err, 0);
	cJSON_Delete(doc);
	return rc;
}

int oci_creds_lookup_file(const char *path, const char *host, struct oci_creds *out,
                          struct oci_err *err)
{
	char *buf = NULL;
	size_t len = 0;
	int rc = fsutil_read_file(path, AUTH_FILE_MAX, &buf, &len);
	if (rc) {
		oci_errf(err, "cannot read credentials file %s: %s", path,
		         rc == -EFBIG ? "larger than 4 MiB" : strerror(-rc));
		return rc;
	}
	rc = oci_creds_lookup(buf, len, host, out, err);
	if (rc == -EINVAL)
		oci_err_prefix(err, "%s", path);
	explicit_bzero(buf, len);
	free(buf);
	return rc;
}
