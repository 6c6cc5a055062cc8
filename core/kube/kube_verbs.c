/* The Kubernetes client's verbs and Events (see kube_client.h). */
#include "kube_client_impl.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "textfmt.h"

#define LIST_RESTARTS 3

/* ---- verbs ---- */

static int path_or_fail(const struct kube_resource *r, const char *ns, const char *name,
                        const char *sub, char *buf, size_t len, struct kube_error *err)
{
	int rc = kube_resource_path(r, ns, name, sub, buf, len);
	if (rc < 0)
		kube_error_set(err, KUBE_BAD_REQUEST, "invalid %s name \"%s\"%s%s", r->kind,
		               name ? name : "", ns ? " in namespace " : "", ns ? ns : "");
	return rc;
}

int kube_client_get(struct kube_client *c, const struct kube_resource *r, const char *ns,
                    const char *name, cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = path_or_fail(r, ns, name, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	struct kube_request rq = {.method = "GET", .path = path};
	cJSON *obj = NULL;
	rc = kube_client_do(c, &rq, &obj, err);
	if (rc < 0)
		return rc;
	if (!obj) {
		kube_error_set(err, KUBE_MALFORMED, "GET %s: empty body", path);
		return -EBADMSG;
	}
	if (out)
		*out = obj;
	else
		cJSON_Delete(obj);
	return 0;
}

/* The collection's path with the list's selectors and page size. */
static int list_base_path(const struct kube_resource *r, const char *ns,
                          const struct kube_list_opts *o, char *base, size_t len,
                          struct kube_error *err)
{
	unsigned limit = o->limit ? o->limit : 500;
	int rc = path_or_fail(r, ns, NULL, NULL, base, len, err);
	if (rc < 0)
		return rc;
	char limit_s[16];
	snprintf(limit_s, sizeof(limit_s), "%u", limit);
	if ((o->label_selector && *o->label_selector &&
	     kube_query_add(base, len, "labelSelector", o->label_selector) < 0) ||
	    (o->field_selector && *o->field_selector &&
	     kube_query_add(base, len, "fieldSelector", o->field_selector) < 0) ||
	    kube_query_add(base, len, "limit", limit_s) < 0) {
		kube_error_set(err, KUBE_BAD_REQUEST, "list %s: selectors too long", r->plural);
		return -ENAMETOOLONG;
	}
	return 0;
}

/* A list in progress, page by page. */
struct listing {
	const struct kube_resource *r;
	const struct kube_list_opts *o;
	cJSON *all; /* the items taken (with on_page: of this page only) */
	char *cont; /* the next page's continue token; NULL for the first page */
	size_t count, max_items;
};

/* Start from the first page (again). */
static int list_reset(struct listing *l)
{
	l->count = 0;
	cJSON_Delete(l->all);
	l->all = cJSON_CreateArray();
	free(l->cont);
	l->cont = NULL;
	return l->all ? 0 : -ENOMEM;
}

/* GET the page l->cont names; path gets the path asked for. */
static int list_get(struct kube_client *c, const struct listing *l, const char *base, char *path,
                    size_t len, cJSON **page, struct kube_error *err)
{
	kc_copy_str(path, len, base);
	if (l->cont && kube_query_add(path, len, "continue", l->cont) < 0) {
		kube_error_set(err, KUBE_MALFORMED, "list %s: continue token too long",
		               l->r->plural);
		return -EBADMSG;
	}
	struct kube_request rq = {.method = "GET", .path = path};
	return kube_client_do(c, &rq, page, err);
}

/* Move the items of page (from path) to l->all, and hand them to on_page
 * when the caller takes the list page by page. */
static int list_take(struct listing *l, cJSON *page, const char *path, struct kube_error *err)
{
	cJSON *its = cJSON_GetObjectItemCaseSensitive(page, "items");
	cJSON *meta = cJSON_GetObjectItemCaseSensitive(page, "metadata");
	if (!page || !(cJSON_IsArray(its) || cJSON_IsNull(its) || !its) ||
	    (meta && !cJSON_IsObject(meta))) {
		kube_error_set(err, KUBE_MALFORMED, "GET %s: not a list", path);
		return -EBADMSG;
	}
	cJSON *it;
	while (its && (it = cJSON_DetachItemFromArray(its, 0))) {
		if (!cJSON_IsObject(it)) {
			cJSON_Delete(it);
			kube_error_set(err, KUBE_MALFORMED, "GET %s: a list item is not an object",
			               path);
			return -EBADMSG;
		}
		if (l->count++ >= l->max_items) {
			cJSON_Delete(it);
			kube_error_set(err, KUBE_TOO_LARGE, "list %s: more than %zu items",
			               l->r->plural, l->max_items);
			return -EMSGSIZE;
		}
		cJSON_AddItemToArray(l->all, it);
	}
	if (l->o->on_page) {
		l->o->on_page(l->all, l->cont == NULL /* the first page */, l->o->page_ud);
		l->all = cJSON_CreateArray();
		if (!l->all)
			return -ENOMEM;
	}
	return 0;
}

/* After page (from path): 1 with the next page's token in l->cont, or 0
 * for the last page, its resourceVersion copied to rv. */
static int list_next(struct listing *l, const cJSON *page, const char *path, char *rv, size_t rvlen,
                     struct kube_error *err)
{
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(page, "metadata");
	const char *lrv = kc_jstr(meta, "resourceVersion");
	const char *next = kc_jstr(meta, "continue");
	if (!next || !*next) {
		if (rv && rvlen) {
			if (!lrv || strlen(lrv) >= rvlen) {
				kube_error_set(err, KUBE_MALFORMED,
				               "GET %s: list without a usable resourceVersion",
				               path);
				return -EBADMSG;
			}
			kc_copy_str(rv, rvlen, lrv);
		}
		return 0;
	}
	free(l->cont);
	l->cont = strdup(next);
	return l->cont ? 1 : -ENOMEM;
}

int kube_client_list(struct kube_client *c, const struct kube_resource *r, const char *ns,
                     const struct kube_list_opts *o, cJSON **items, char *rv, size_t rvlen,
                     struct kube_error *err)
{
	struct kube_list_opts dflt = {0};
	if (!o)
		o = &dflt;
	char base[PATH_MAX_LEN];
	int rc = list_base_path(r, ns, o, base, sizeof(base), err);
	if (rc < 0)
		return rc;
	struct listing l = {.r = r, .o = o, .max_items = o->max_items ? o->max_items : 1000000};
	cJSON *page = NULL;
	int restarts = 0;
	if ((rc = list_reset(&l)) < 0)
		goto out;
	for (;;) {
		char path[PATH_MAX_LEN + 1024];
		rc = list_get(c, &l, base, path, sizeof(path), &page, err);
		if (rc == -ESTALE && l.cont && restarts < LIST_RESTARTS) {
			/* The continue token expired (compaction): a consistent
			 * list needs a fresh start. */
			restarts++;
			log_info("kube: list continue token expired, listing again", "resource",
			         r->plural);
			if ((rc = list_reset(&l)) < 0)
				goto out;
			continue;
		}
		if (rc < 0 || (rc = list_take(&l, page, path, err)) < 0 ||
		    (rc = list_next(&l, page, path, rv, rvlen, err)) < 0)
			goto out;
		if (rc == 0)
			break;
		cJSON_Delete(page);
		page = NULL;
	}
	if (o->on_page) {
		cJSON_Delete(l.all);
		l.all = NULL;
	}
	*items = l.all;
	l.all = NULL;
	rc = 0;
out:
	cJSON_Delete(page);
	cJSON_Delete(l.all);
	free(l.cont);
	return rc;
}

static int send_json(struct kube_client *c, const char *method, const char *path, const char *ctype,
                     const cJSON *body, cJSON **out, struct kube_error *err)
{
	char *text = cJSON_PrintUnformatted(body);
	if (!text) {
		kube_error_set(err, KUBE_BAD_REQUEST, "cannot serialise the request body");
		return -ENOMEM;
	}
	struct kube_request rq = {
	    .method = method,
	    .path = path,
	    .content_type = ctype,
	    .body = text,
	    .body_len = strlen(text),
	};
	int rc = kube_client_do(c, &rq, out, err);
	free(text);
	return rc;
}

/* Every write's first step: the path of the object verb acts on, ns and
 * name taken from obj (when given) where the caller passes none; a name is
 * required unless the verb creates (the collection's path then). */
static int object_path(const struct kube_resource *r, const char *verb, const char *ns,
                       const char *name, const cJSON *obj, const char *sub, char *buf, size_t len,
                       struct kube_error *err)
{
	bool create = strcmp(verb, "create") == 0;
	if (!ns && obj)
		ns = kube_obj_namespace(obj);
	if (!name && obj && !create)
		name = kube_obj_name(obj);
	if ((!create && !name) || (r->namespaced && !ns)) {
		kube_error_set(err, KUBE_BAD_REQUEST, "%s %s: %s required", verb, r->kind,
		               create ? "a namespace is" : "name and namespace are");
		return -EINVAL;
	}
	return path_or_fail(r, ns, create ? NULL : name, sub, buf, len, err);
}

int kube_client_create(struct kube_client *c, const struct kube_resource *r, const char *ns,
                       const cJSON *obj, cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = object_path(r, "create", ns, NULL, obj, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	return send_json(c, "POST", path, "application/json", obj, out, err);
}

int kube_client_replace(struct kube_client *c, const struct kube_resource *r, const char *ns,
                        const char *name, const cJSON *obj, cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = object_path(r, "replace", ns, name, obj, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	return send_json(c, "PUT", path, "application/json", obj, out, err);
}

int kube_client_apply(struct kube_client *c, const struct kube_resource *r, const char *ns,
                      const char *name, const cJSON *obj, const struct kube_apply_opts *o,
                      cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	if (!o || !o->field_manager || !*o->field_manager || strlen(o->field_manager) > 128) {
		kube_error_set(err, KUBE_BAD_REQUEST,
		               "apply: a field manager (at most 128 bytes) is required");
		return -EINVAL;
	}
	int rc = object_path(r, "apply", ns, name, obj, o->status ? "status" : NULL, path,
	                     sizeof(path), err);
	if (rc < 0)
		return rc;
	if (kube_query_add(path, sizeof(path), "fieldManager", o->field_manager) < 0 ||
	    (o->force && kube_query_add(path, sizeof(path), "force", "true") < 0)) {
		kube_error_set(err, KUBE_BAD_REQUEST, "apply %s: path too long", r->kind);
		return -ENAMETOOLONG;
	}
	/* JSON is YAML: the apply content type takes it as is. */
	return send_json(c, "PATCH", path, "application/apply-patch+yaml", obj, out, err);
}

int kube_client_delete(struct kube_client *c, const struct kube_resource *r, const char *ns,
                       const char *name, const struct kube_delete_opts *o, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = object_path(r, "delete", ns, name, NULL, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	cJSON *body = cJSON_CreateObject();
	if (!body)
		return -ENOMEM;
	cJSON_AddStringToObject(body, "kind", "DeleteOptions");
	cJSON_AddStringToObject(body, "apiVersion", "v1");
	if (o && (o->uid || o->resource_version)) {
		cJSON *pre = cJSON_AddObjectToObject(body, "preconditions");
		if (pre && o->uid)
			cJSON_AddStringToObject(pre, "uid", o->uid);
		if (pre && o->resource_version)
			cJSON_AddStringToObject(pre, "resourceVersion", o->resource_version);
	}
	if (o && o->propagation) {
		if (strcmp(o->propagation, "Background") && strcmp(o->propagation, "Foreground") &&
		    strcmp(o->propagation, "Orphan")) {
			cJSON_Delete(body);
			kube_error_set(err, KUBE_BAD_REQUEST,
			               "delete: unknown propagation policy \"%s\"", o->propagation);
			return -EINVAL;
		}
		cJSON_AddStringToObject(body, "propagationPolicy", o->propagation);
	}
	rc = send_json(c, "DELETE", path, "application/json", body, NULL, err);
	cJSON_Delete(body);
	return rc;
}

bool kube_valid_subdomain(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 253)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
		if (alnum)
			continue;
		if (ch != '-' && ch != '.')
			return false;
		if (i == 0 || i == n - 1)
			return false;
		if (ch == '.' && (s[i - 1] == '.' || s[i - 1] == '-' || s[i + 1] == '-'))
			return false;
	}
	return true;
}

int kube_event_build(const struct kube_event *ev, cJSON **out, struct kube_error *err)
{
	const cJSON *o = ev->regarding;
	const char *av = kc_jstr(o, "apiVersion"), *kind = kc_jstr(o, "kind");
	const char *name = kube_obj_name(o), *ns = kube_obj_namespace(o), *uid = kube_obj_uid(o);
	if (!av || !kind || !name) {
		kube_error_set(
		    err, KUBE_BAD_REQUEST,
		    "event: the regarding object needs apiVersion, kind and metadata.name");
		return -EINVAL;
	}
	if (!ev->reason || !*ev->reason || strlen(ev->reason) > 128) {
		kube_error_set(err, KUBE_BAD_REQUEST,
		               "event: a reason of 1 to 128 bytes is required");
		return -EINVAL;
	}
	const char *type = ev->type ? ev->type : "Normal";
	if (strcmp(type, "Normal") && strcmp(type, "Warning")) {
		kube_error_set(err, KUBE_BAD_REQUEST,
		               "event: type must be Normal or Warning, not \"%s\"", type);
		return -EINVAL;
	}
	/* "<object>.<hex nanoseconds>" like kubectl's recorder; an object name
	 * that is not a DNS subdomain gets a generic prefix. */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	unsigned long long nanos =
	    (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
	static _Atomic unsigned long long seq;
	nanos += atomic_fetch_add(&seq, 1) % 1000;
	char evname[254], suffix[24];
	snprintf(suffix, sizeof(suffix), ".%llx", nanos);
	size_t maxprefix = sizeof(evname) - 1 - strlen(suffix);
	if (kube_valid_subdomain(name))
		snprintf(evname, sizeof(evname), "%.*s%s", (int)maxprefix, name, suffix);
	else
		snprintf(evname, sizeof(evname), "gkm%s", suffix);
	if (!kube_valid_subdomain(evname)) /* the truncation ended on '.' or '-' */
		snprintf(evname, sizeof(evname), "gkm%s", suffix);
	char msg[1025];
	snprintf(msg, sizeof(msg), "%s", ev->message ? ev->message : "");
	char now[32];
	rfc3339_now(now, sizeof(now));

	cJSON *e = cJSON_CreateObject();
	cJSON *meta = cJSON_AddObjectToObject(e, "metadata");
	cJSON *inv = cJSON_AddObjectToObject(e, "involvedObject");
	cJSON *src = cJSON_AddObjectToObject(e, "source");
	if (!e || !meta || !inv || !src) {
		cJSON_Delete(e);
		return -ENOMEM;
	}
	cJSON_AddStringToObject(e, "apiVersion", "v1");
	cJSON_AddStringToObject(e, "kind", "Event");
	cJSON_AddStringToObject(meta, "name", evname);
	cJSON_AddStringToObject(meta, "namespace", ns && *ns ? ns : "default");
	cJSON_AddStringToObject(inv, "apiVersion", av);
	cJSON_AddStringToObject(inv, "kind", kind);
	if (ns && *ns)
		cJSON_AddStringToObject(inv, "namespace", ns);
	cJSON_AddStringToObject(inv, "name", name);
	if (uid)
		cJSON_AddStringToObject(inv, "uid", uid);
	const char *orv = kube_obj_rv(o);
	if (orv)
		cJSON_AddStringToObject(inv, "resourceVersion", orv);
	cJSON_AddStringToObject(e, "reason", ev->reason);
	cJSON_AddStringToObject(e, "message", msg);
	cJSON_AddStringToObject(e, "type", type);
	cJSON_AddStringToObject(src, "component", ev->component ? ev->component : "gkm");
	if (ev->host)
		cJSON_AddStringToObject(src, "host", ev->host);
	cJSON_AddStringToObject(e, "firstTimestamp", now);
	cJSON_AddStringToObject(e, "lastTimestamp", now);
	cJSON_AddNumberToObject(e, "count", 1);
	cJSON_AddStringToObject(e, "reportingComponent", ev->component ? ev->component : "gkm");
	cJSON_AddStringToObject(e, "reportingInstance", ev->host ? ev->host : "");
	*out = e;
	return 0;
}

int kube_client_event(struct kube_client *c, const struct kube_event *ev, struct kube_error *err)
{
	cJSON *e = NULL;
	int rc = kube_event_build(ev, &e, err);
	if (rc < 0)
		return rc;
	struct kube_resource r;
	rc = kube_resource_builtin("v1", "Event", &r);
	if (rc == 0)
		rc = kube_client_create(c, &r, kube_obj_namespace(e), e, NULL, err);
	cJSON_Delete(e);
	return rc;
}
