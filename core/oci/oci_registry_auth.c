#include "oci_registry_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base64.h"

/* ---- authentication -------------------------------------------------- */

static const char *token_for(struct oci_registry *r, const char *scope)
{
	time_t now = time(NULL);
	for (struct token *t = r->tokens; t; t = t->next)
		if (strcmp(t->scope, scope ? scope : "") == 0 && t->expires > now)
			return t->value;
	return NULL;
}

static int token_store(struct oci_registry *r, const char *scope, const char *value, long ttl)
{
	struct token *t = NULL;
	for (t = r->tokens; t; t = t->next)
		if (strcmp(t->scope, scope ? scope : "") == 0)
			break;
	char *v = strdup(value);
	if (!v)
		return -ENOMEM;
	if (!t) {
		if (!(t = calloc(1, sizeof(*t))) || !(t->scope = strdup(scope ? scope : ""))) {
			free(t);
			free(v);
			return -ENOMEM;
		}
		t->next = r->tokens;
		r->tokens = t;
	}
	free(t->value);
	t->value = v;
	/* renew a little early; the spec's minimum lifetime is 60 s */
	t->expires = time(NULL) + (ttl > 60 ? ttl : 60) - 10;
	return 0;
}

static int basic_header(const struct oci_creds *c, char **out)
{
	char *plain = NULL, *b64 = NULL;
	if (asprintf(&plain, "%s:%s", c->username, c->password ? c->password : "") < 0)
		return -ENOMEM;
	int rc = base64_encode(plain, strlen(plain), &b64);
	explicit_bzero(plain, strlen(plain));
	free(plain);
	if (rc)
		return rc;
	rc = asprintf(out, "Basic %s", b64) < 0 ? -ENOMEM : 0;
	free(b64);
	return rc;
}

/* The token request for scope into q (its URL into url): a refresh token
 * POSTed as a form (*form), or a GET of the realm with the service and
 * scope, with Basic credentials when there are some (*auth). */
static int token_request(struct oci_registry *r, const char *scope, CURL *esc, char *url,
                         size_t cap, struct req *q, char **form, char **auth)
{
	char *svc = r->service ? curl_easy_escape(esc, r->service, 0) : NULL;
	char *scp = scope && *scope ? curl_easy_escape(esc, scope, 0) : NULL;
	int rc = 0;
	if (r->have_creds && r->creds.identity_token) {
		char *tok = curl_easy_escape(esc, r->creds.identity_token, 0);
		if (asprintf(form,
		             "grant_type=refresh_token&client_id=gkm&service=%s&scope=%s&"
		             "refresh_token=%s",
		             svc ? svc : "", scp ? scp : "", tok ? tok : "") < 0)
			*form = NULL;
		curl_free(tok);
		snprintf(url, cap, "%s", r->realm);
		q->method = "POST";
		q->content_type = "application/x-www-form-urlencoded";
		q->up_mem = *form;
		q->up_len = *form ? strlen(*form) : 0;
		if (!*form)
			rc = -ENOMEM;
	} else {
		const char *sep = strchr(r->realm, '?') ? "&" : "?";
		snprintf(url, cap, "%s%s%s%s%s%s", r->realm, svc || scp ? sep : "",
		         svc ? "service=" : "", svc ? svc : "", svc && scp ? "&" : "",
		         scp ? "scope=" : "");
		if (scp)
			snprintf(url + strlen(url), cap - strlen(url), "%s", scp);
		if (r->have_creds && r->creds.username)
			rc = basic_header(&r->creds, auth);
		q->auth = *auth;
	}
	curl_free(svc);
	curl_free(scp);
	return rc;
}

/* The token server's answer x (to method): the token, kept for scope. */
static int token_answer(struct oci_registry *r, const char *scope, const struct xfer *x,
                        const char *method, struct oci_err *err)
{
	if (x->status == 401 || x->status == 403) {
		if (r->have_creds)
			oci_errf(err,
			         "token server %s rejected the credentials from %s for scope '%s' "
			         "(HTTP %ld)",
			         r->realm, r->creds_source, scope ? scope : "", x->status);
		else
			oci_errf(
			    err,
			    "token server %s refused anonymous access to scope '%s' (HTTP %ld); "
			    "credentials needed",
			    r->realm, scope ? scope : "", x->status);
		return -EACCES;
	}
	if (x->status != 200) {
		reg_describe_status(x, method, r->realm, err);
		oci_err_prefix(err, "token request failed");
		return reg_status_errno(x->status);
	}
	cJSON *j = x->body ? cJSON_ParseWithLength(x->body, x->body_len) : NULL;
	const cJSON *t = j ? cJSON_GetObjectItemCaseSensitive(j, "token") : NULL;
	if (!cJSON_IsString(t) || !*t->valuestring)
		t = j ? cJSON_GetObjectItemCaseSensitive(j, "access_token") : NULL;
	int rc;
	if (!cJSON_IsString(t) || !*t->valuestring) {
		oci_errf(err, "token server %s answered without a token", r->realm);
		rc = -EPROTO;
	} else {
		const cJSON *ttl = cJSON_GetObjectItemCaseSensitive(j, "expires_in");
		rc = token_store(r, scope, t->valuestring,
		                 cJSON_IsNumber(ttl) && ttl->valuedouble < 86400 * 365
		                     ? (long)ttl->valuedouble
		                     : 60);
	}
	cJSON_Delete(j);
	return rc;
}

/* GET (or POST for refresh tokens) the realm for scope. */
static int fetch_token(struct oci_registry *r, const char *scope, struct oci_err *err)
{
	char url[URL_MAX];
	char *form = NULL, *auth = NULL;
	struct xfer *x = NULL;
	int rc;
	CURL *esc = curl_easy_init();
	if (!esc)
		return -ENOMEM;
	if (strncmp(r->realm, "https://", 8) != 0 && strncmp(r->realm, "http://", 7) != 0) {
		oci_errf(err, "token realm '%s' is not an http(s) URL", r->realm);
		rc = -EPROTO;
		goto out;
	}
	struct req q = {.method = "GET",
	                .url = url,
	                .body_max = TOKEN_BODY_MAX,
	                .total_timeout = true,
	                .up_fd = -1};
	if ((rc = token_request(r, scope, esc, url, sizeof(url), &q, &form, &auth)) ||
	    (rc = reg_run_simple(r, &q, &x, err)))
		goto out;
	rc = token_answer(r, scope, x, q.method, err);
out:
	reg_xfer_free(x);
	free(form);
	if (auth) {
		explicit_bzero(auth, strlen(auth));
		free(auth);
	}
	curl_easy_cleanup(esc);
	return rc;
}

/* The Authorization header for a request in scope, fetching a token when
 * the registry is known to want one. *out NULL for anonymous. */
int reg_auth_for(struct oci_registry *r, const char *scope, char **out, struct oci_err *err)
{
	*out = NULL;
	if (r->auth == OCI_AUTH_BASIC && r->have_creds && r->creds.username)
		return basic_header(&r->creds, out);
	if (r->auth != OCI_AUTH_BEARER)
		return 0;
	const char *t = token_for(r, scope);
	if (!t) {
		int rc = fetch_token(r, scope, err);
		if (rc)
			return rc;
		t = token_for(r, scope);
	}
	if (t && asprintf(out, "Bearer %s", t) < 0)
		return -ENOMEM;
	return 0;
}

/* Learn from a 401. 0 when trying again can help. */
int reg_on_unauthorized(struct oci_registry *r, const struct xfer *x, const char *scope,
                        bool sent_auth, struct oci_err *err)
{
	struct oci_challenge c = {0};
	int rc = oci_challenge_parse(x->www_auth, &c, err);
	if (rc) {
		if (!x->www_auth[0])
			oci_errf(err,
			         "registry %s answered 401 without a WWW-Authenticate challenge",
			         r->host);
		return -EACCES;
	}
	if (c.scheme == OCI_AUTH_BASIC) {
		bool had = r->auth == OCI_AUTH_BASIC;
		r->auth = OCI_AUTH_BASIC;
		if (!r->have_creds || !r->creds.username) {
			oci_errf(err,
			         "registry %s requires a login and no credentials were found for "
			         "it %s%s",
			         r->host,
			         r->creds_named      ? "in "
			         : r->creds_why_none ? ": "
			                             : "",
			         r->creds_named || r->creds_why_none
			             ? r->creds_source
			             : "(use --authfile, --creds or a pull secret)");
			rc = -EACCES;
		} else if (had && sent_auth) {
			oci_errf(err, "registry %s rejected the credentials from %s", r->host,
			         r->creds_source);
			rc = -EACCES;
		}
		oci_challenge_clear(&c);
		return rc;
	}
	/* Bearer: a token we sent was refused (expired, or too narrow a scope) */
	if (sent_auth && r->auth == OCI_AUTH_BEARER && c.error &&
	    strcmp(c.error, "insufficient_scope") != 0 && strcmp(c.error, "invalid_token") != 0) {
		oci_errf(err, "registry %s refused the token: %s", r->host, c.error);
		oci_challenge_clear(&c);
		return -EACCES;
	}
	bool same_realm = r->realm && strcmp(r->realm, c.realm) == 0;
	if (sent_auth && r->auth == OCI_AUTH_BEARER && same_realm && !c.error) {
		oci_errf(err, "registry %s refused the token it issued for '%s'%s", r->host,
		         scope ? scope : "",
		         r->have_creds ? "" : " (anonymous; credentials needed?)");
		oci_challenge_clear(&c);
		return -EACCES;
	}
	free(r->realm);
	free(r->service);
	r->realm = c.realm;
	r->service = c.service;
	c.realm = c.service = NULL;
	r->auth = OCI_AUTH_BEARER;
	/* Ask for what this request needs (our scope covers the challenge's:
	 * a push asks for pull,push even when a HEAD was challenged for pull). */
	rc = fetch_token(r, scope && *scope ? scope : c.scope, err);
	oci_challenge_clear(&c);
	return rc;
}
