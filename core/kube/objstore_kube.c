/* objstore on the Kubernetes API (see objstore_kube.h). */
#include "objstore_kube.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube_informer.h"
#include "log.h"

struct kwatch {
	struct objstore_watch w; /* strings below */
	char api_version[160], kind[96], ns[256], labels[1024], fields[1024];
	struct kube_informer *inf;
	struct kwatch *next;
};

struct kstore {
	struct objstore base;
	struct kube_config *cfg;
	struct kube_client *c;
	struct loop *loop;
	char component[64];
	char host[256];
	struct kwatch *watches;
};

static void copy(char *dst, size_t len, const char *src)
{
	snprintf(dst, len, "%s", src ? src : "");
}

static void on_change(struct kube_informer *inf, enum kube_event_type t, const cJSON *obj, void *ud)
{
	(void)inf;
	struct kwatch *w = ud;
	enum objstore_event_type ot = t == KUBE_ADDED     ? OBJSTORE_ADDED
	                              : t == KUBE_DELETED ? OBJSTORE_DELETED
	                                                  : OBJSTORE_MODIFIED;
	w->w.on_event(w->w.ud, ot, obj);
}

static void on_synced(struct kube_informer *inf, void *ud)
{
	(void)inf;
	struct kwatch *w = ud;
	if (w->w.on_synced)
		w->w.on_synced(w->w.ud);
}

/* Resolve without blocking: watch() runs on the loop thread, so only the
 * kinds known without discovery can be watched. */
static int k_watch(struct objstore *s, const struct objstore_watch *in)
{
	struct kstore *ks = (struct kstore *)s;
	struct kube_resource r;
	if (!in->on_event || kube_resource_builtin(in->api_version, in->kind, &r) < 0) {
		log_error("kube: cannot watch this kind", "apiVersion", in->api_version, "kind",
		          in->kind);
		return in->on_event ? -ENOENT : -EINVAL;
	}
	struct kwatch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->w = *in;
	copy(w->api_version, sizeof(w->api_version), in->api_version);
	copy(w->kind, sizeof(w->kind), in->kind);
	copy(w->ns, sizeof(w->ns), in->namespace_);
	copy(w->labels, sizeof(w->labels), in->label_selector);
	copy(w->fields, sizeof(w->fields), in->field_selector);
	w->w.api_version = w->api_version;
	w->w.kind = w->kind;
	w->w.namespace_ = in->namespace_ ? w->ns : NULL;
	w->w.label_selector = in->label_selector ? w->labels : NULL;
	w->w.field_selector = in->field_selector ? w->fields : NULL;
	struct kube_informer_opts o = {
	    .watch = {.resource = r,
	              .ns = w->w.namespace_,
	              .label_selector = w->w.label_selector,
	              .field_selector = w->w.field_selector,
	              .list_limit = in->list_page},
	    .no_cache = in->no_cache,
	    .keep_managed_fields = in->keep_managed_fields,
	    .loop = ks->loop,
	    .on_change = on_change,
	    .on_synced = on_synced,
	    .ud = w,
	};
	int rc = kube_informer_start(ks->c, &o, &w->inf);
	if (rc < 0) {
		free(w);
		return rc;
	}
	w->next = ks->watches;
	ks->watches = w;
	return 0;
}

static int resolve(struct kstore *ks, const char *av, const char *kind, struct kube_resource *r,
                   char *err, size_t errlen)
{
	struct kube_error e;
	int rc = kube_client_resource(ks->c, av, kind, r, &e);
	if (rc < 0)
		copy(err, errlen, e.message);
	return rc;
}

static int k_apply(struct objstore *s, const cJSON *obj, const char *manager, bool status,
                   cJSON **result, char *err, size_t errlen)
{
	struct kstore *ks = (struct kstore *)s;
	struct kube_resource r;
	int rc = resolve(ks, kube_obj_str(obj, NULL, "apiVersion"), kube_obj_str(obj, NULL, "kind"),
	                 &r, err, errlen);
	if (rc < 0)
		return rc;
	struct kube_apply_opts o = {.field_manager = manager, .force = true, .status = status};
	struct kube_error e;
	rc = kube_client_apply(ks->c, &r, NULL, NULL, obj, &o, result, &e);
	if (rc < 0)
		copy(err, errlen, e.message);
	return rc;
}

static int k_get(struct objstore *s, const char *av, const char *kind, const char *ns,
                 const char *name, cJSON **out, char *err, size_t errlen)
{
	struct kstore *ks = (struct kstore *)s;
	struct kube_resource r;
	int rc = resolve(ks, av, kind, &r, err, errlen);
	if (rc < 0)
		return rc;
	struct kube_error e;
	rc = kube_client_get(ks->c, &r, ns, name, out, &e);
	if (rc < 0)
		copy(err, errlen, e.message);
	return rc;
}

static int k_remove(struct objstore *s, const char *av, const char *kind, const char *ns,
                    const char *name, char *err, size_t errlen)
{
	struct kstore *ks = (struct kstore *)s;
	struct kube_resource r;
	int rc = resolve(ks, av, kind, &r, err, errlen);
	if (rc < 0)
		return rc;
	struct kube_error e;
	rc = kube_client_delete(ks->c, &r, ns, name, NULL, &e);
	if (rc < 0)
		copy(err, errlen, e.message);
	return rc;
}

static int k_event(struct objstore *s, const cJSON *obj, const char *type, const char *reason,
                   const char *message, const char *component)
{
	struct kstore *ks = (struct kstore *)s;
	struct kube_event ev = {
	    .regarding = obj,
	    .type = type,
	    .reason = reason,
	    .message = message,
	    .component = component ? component : ks->component,
	    .host = ks->host[0] ? ks->host : NULL,
	};
	struct kube_error e;
	int rc = kube_client_event(ks->c, &ev, &e);
	if (rc < 0)
		log_warn("kube: cannot record an Event", "reason", reason ? reason : "", "error",
		         e.message);
	return rc;
}

static void k_free(struct objstore *s)
{
	struct kstore *ks = (struct kstore *)s;
	if (!ks)
		return;
	while (ks->watches) {
		struct kwatch *w = ks->watches;
		ks->watches = w->next;
		kube_informer_stop(w->inf);
		free(w);
	}
	kube_client_free(ks->c);
	kube_config_free(ks->cfg);
	free(ks);
}

static const struct objstore_ops kube_ops = {
    .watch = k_watch,
    .apply = k_apply,
    .get = k_get,
    .remove = k_remove,
    .event = k_event,
    .free = k_free,
};

int objstore_kube_new(const char *kubeconfig, const char *context, struct loop *l,
                      const char *component, const char *host, struct objstore **out, char *err,
                      size_t errlen)
{
	struct kstore *ks = calloc(1, sizeof(*ks));
	if (!ks)
		return -ENOMEM;
	ks->base.ops = &kube_ops;
	ks->loop = l;
	copy(ks->component, sizeof(ks->component), component ? component : "gkm");
	copy(ks->host, sizeof(ks->host), host);
	int rc = kube_config_load(kubeconfig, context, &ks->cfg, err, errlen);
	if (rc < 0) {
		free(ks);
		return rc;
	}
	char ua[96];
	snprintf(ua, sizeof(ua), "%s/" GKM_VERSION, ks->component);
	struct kube_client_opts co = {.user_agent = ua};
	rc = kube_client_new(ks->cfg, &co, &ks->c);
	if (rc < 0) {
		copy(err, errlen, "cannot create the Kubernetes client");
		kube_config_free(ks->cfg);
		free(ks);
		return rc;
	}
	*out = &ks->base;
	return 0;
}

struct kube_client *objstore_kube_client(struct objstore *s)
{
	return ((struct kstore *)s)->c;
}
