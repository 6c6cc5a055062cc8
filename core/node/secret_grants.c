#include "secret_grants.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pull_secret.h"
#include "strmap.h"

#define RBAC "rbac.authorization.k8s.io/v1"

/* One namespace's Role: what it should allow, and what it does. */
struct space {
	char ns[64];
	char *want;    /* sorted, comma-separated Secret names; "" for none */
	char *applied; /* as last applied (NULL: no Role of ours known there) */
	bool busy;     /* a job runs for it: the next waits for its end */
};

struct secret_grants {
	struct workers *workers;
	struct objstore *os;
	const char *manager;
	char sa_ns[64], sa_name[254], home[64];
	struct strmap caches; /* cache key -> "ns\tnames" (owned, key inside) */
	struct strmap spaces; /* namespace -> struct space */
	bool known;
};

struct job {
	struct secret_grants *g;
	char ns[64];
	char *names; /* "" removes the Role and its binding */
	int rc;
	char err[256];
};

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static struct space *space_of(struct secret_grants *g, const char *ns)
{
	struct space *s = strmap_get(&g->spaces, ns);
	if (s)
		return s;
	if (!(s = calloc(1, sizeof(*s))) || !(s->want = strdup(""))) {
		free(s);
		return NULL;
	}
	snprintf(s->ns, sizeof(s->ns), "%s", ns);
	if (strmap_put(&g->spaces, s->ns, s) != 0) {
		free(s->want);
		free(s);
		return NULL;
	}
	return s;
}

/* The Secret names every cache of ns names, sorted, without repeats. */
static char *names_of(struct secret_grants *g, const char *ns)
{
	char *list[512] = {0};
	size_t n = 0, total = 1, pos = 0;
	const char *key;
	void *val;
	size_t nl = strlen(ns);
	while (strmap_next(&g->caches, &pos, &key, &val)) {
		const char *rec = (const char *)val + strlen(key) + 1; /* "ns\tnames" */
		if (strncmp(rec, ns, nl) != 0 || rec[nl] != '\t')
			continue;
		char copy[700], *save = NULL;
		snprintf(copy, sizeof(copy), "%s", rec + nl + 1);
		for (char *t = strtok_r(copy, ",", &save); t && n < 512;
		     t = strtok_r(NULL, ",", &save)) {
			if (!(list[n] = strdup(t)))
				break;
			total += strlen(t) + 1;
			n++;
		}
	}
	qsort(list, n, sizeof(list[0]), cmp_str);
	char *out = calloc(1, total);
	size_t used = 0;
	for (size_t i = 0; i < n && out; i++)
		if (i == 0 || strcmp(list[i], list[i - 1]) != 0)
			used += (size_t)snprintf(out + used, total - used, "%s%s", used ? "," : "",
			                         list[i]);
	for (size_t i = 0; i < n; i++)
		free(list[i]);
	return out;
}

/* A Role or RoleBinding of ns, named and labelled as the operator's. */
static cJSON *rbac_obj(const char *kind, const char *ns)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "apiVersion", RBAC);
	cJSON_AddStringToObject(o, "kind", kind);
	cJSON *md = cJSON_AddObjectToObject(o, "metadata");
	cJSON_AddStringToObject(md, "name", SECRET_GRANTS_NAME);
	cJSON_AddStringToObject(md, "namespace", ns);
	cJSON *lb = cJSON_AddObjectToObject(md, "labels");
	cJSON_AddStringToObject(lb, SECRET_GRANTS_LABEL, "true");
	cJSON_AddStringToObject(lb, "app.kubernetes.io/managed-by", "gkm");
	return o;
}

static cJSON *role_obj(const char *ns, const char *names)
{
	cJSON *o = rbac_obj("Role", ns);
	cJSON *rule = cJSON_CreateObject();
	cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "rules"), rule);
	cJSON_AddItemToArray(cJSON_AddArrayToObject(rule, "apiGroups"), cJSON_CreateString(""));
	cJSON_AddItemToArray(cJSON_AddArrayToObject(rule, "resources"),
	                     cJSON_CreateString("secrets"));
	cJSON_AddItemToArray(cJSON_AddArrayToObject(rule, "verbs"), cJSON_CreateString("get"));
	cJSON *rn = cJSON_AddArrayToObject(rule, "resourceNames");
	char copy[4096], *save = NULL;
	snprintf(copy, sizeof(copy), "%s", names);
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
		cJSON_AddItemToArray(rn, cJSON_CreateString(t));
	return o;
}

static cJSON *binding_obj(const struct secret_grants *g, const char *ns)
{
	cJSON *o = rbac_obj("RoleBinding", ns);
	cJSON *ref = cJSON_AddObjectToObject(o, "roleRef");
	cJSON_AddStringToObject(ref, "apiGroup", "rbac.authorization.k8s.io");
	cJSON_AddStringToObject(ref, "kind", "Role");
	cJSON_AddStringToObject(ref, "name", SECRET_GRANTS_NAME);
	cJSON *sub = cJSON_CreateObject();
	cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "subjects"), sub);
	cJSON_AddStringToObject(sub, "kind", "ServiceAccount");
	cJSON_AddStringToObject(sub, "name", g->sa_name);
	cJSON_AddStringToObject(sub, "namespace", g->sa_ns);
	return o;
}

static void work(void *ud)
{
	struct job *j = ud;
	struct objstore *os = j->g->os;
	if (!*j->names) {
		/* the binding first: a Role left behind grants nobody anything */
		j->rc = os->ops->remove(os, RBAC, "RoleBinding", j->ns, SECRET_GRANTS_NAME, j->err,
		                        sizeof(j->err));
		if (j->rc == 0 || j->rc == -ENOENT)
			j->rc = os->ops->remove(os, RBAC, "Role", j->ns, SECRET_GRANTS_NAME, j->err,
			                        sizeof(j->err));
		if (j->rc == -ENOENT)
			j->rc = 0;
		return;
	}
	/* the Role first: the binding never names a Role that allows more */
	cJSON *role = role_obj(j->ns, j->names), *binding = binding_obj(j->g, j->ns);
	j->rc = os->ops->apply(os, role, j->g->manager, false, NULL, j->err, sizeof(j->err));
	if (j->rc == 0)
		j->rc =
		    os->ops->apply(os, binding, j->g->manager, false, NULL, j->err, sizeof(j->err));
	cJSON_Delete(role);
	cJSON_Delete(binding);
}

static void sync_space(struct secret_grants *g, struct space *s);

static void done(struct loop *l, void *ud)
{
	struct job *j = ud;
	struct secret_grants *g = j->g;
	(void)l;
	struct space *s = strmap_get(&g->spaces, j->ns);
	if (j->rc)
		log_warn("cannot grant the node agents their pull Secrets", "namespace", j->ns,
		         "secrets", j->names, "error", j->err);
	else
		log_info(*j->names ? "node agents may read these pull Secrets"
		                   : "node agents may read no Secret here any more",
		         "namespace", j->ns, "secrets", j->names);
	if (s) {
		s->busy = false;
		if (j->rc == 0) {
			free(s->applied);
			s->applied = *j->names ? j->names : NULL;
			if (s->applied)
				j->names = NULL;
		}
		sync_space(g, s); /* what changed meanwhile; a failure is tried at resync */
	}
	free(j->names);
	free(j);
}

/* Apply or remove ns's Role when what it should allow differs from what
 * it does (Roles are only removed once every cache was seen). */
static void sync_space(struct secret_grants *g, struct space *s)
{
	bool same = s->applied ? strcmp(s->applied, s->want) == 0 : !*s->want;
	if (s->busy || same || (!*s->want && !g->known))
		return;
	struct job *j = calloc(1, sizeof(*j));
	if (!j || !(j->names = strdup(s->want))) {
		free(j);
		return;
	}
	j->g = g;
	snprintf(j->ns, sizeof(j->ns), "%s", s->ns);
	s->busy = true;
	if (workers_submit(g->workers, work, done, j) != 0) {
		s->busy = false;
		free(j->names);
		free(j);
	}
}

static void want_again(struct secret_grants *g, const char *ns)
{
	struct space *s = space_of(g, ns);
	char *want = s ? names_of(g, ns) : NULL;
	if (!want)
		return;
	free(s->want);
	s->want = want;
	sync_space(g, s);
}

void secret_grants_cache(struct secret_grants *g, const char *key, const cJSON *cache)
{
	char names[600] = "", err[256], ns[64] = "", old_ns[64] = "";
	char *old = strmap_get(&g->caches, key);
	if (cache && old && pull_secret_names(cache, names, sizeof(names), err, sizeof(err)) == 0) {
		/* the same Secrets as before (most events: status writes) */
		const char *own = obj_str(cache, "metadata.namespace");
		const char *rec = old + strlen(key) + 1, *tab = strchr(rec, '\t');
		const char *cns = *own ? own : g->home;
		if (tab && (size_t)(tab - rec) == strlen(cns) && !strncmp(rec, cns, strlen(cns)) &&
		    !strcmp(tab + 1, names) && names[0])
			return;
		names[0] = '\0';
	}
	if (old) {
		const char *rec = old + strlen(key) + 1;
		snprintf(old_ns, sizeof(old_ns), "%.*s", (int)strcspn(rec, "\t"), rec);
		strmap_del(&g->caches, key);
		free(old);
	}
	if (cache && pull_secret_names(cache, names, sizeof(names), err, sizeof(err)) == 0 &&
	    names[0]) {
		const char *own = obj_str(cache, "metadata.namespace");
		snprintf(ns, sizeof(ns), "%s", *own ? own : g->home);
		/* "key\0ns\tnames": the map's key lives in its value */
		size_t kl = strlen(key) + 1, rl = strlen(ns) + 1 + strlen(names) + 1;
		char *rec = malloc(kl + rl);
		if (rec) {
			memcpy(rec, key, kl);
			snprintf(rec + kl, rl, "%s\t%s", ns, names);
			if (strmap_put(&g->caches, rec, rec) != 0)
				free(rec);
		}
	}
	if (old_ns[0] && strcmp(old_ns, ns) != 0)
		want_again(g, old_ns);
	if (ns[0])
		want_again(g, ns);
}

void secret_grants_caches_known(struct secret_grants *g)
{
	size_t pos = 0;
	void *val;
	g->known = true;
	while (strmap_next(&g->spaces, &pos, NULL, &val))
		sync_space(g, val);
}

void secret_grants_resync(struct secret_grants *g)
{
	size_t pos = 0;
	void *val;
	while (strmap_next(&g->spaces, &pos, NULL, &val)) {
		struct space *s = val;
		if (s->busy || !s->applied)
			continue;
		free(s->applied); /* applied again: a Role edited by hand is put right */
		s->applied = strdup("\n");
		sync_space(g, s);
	}
}

/* The Roles this operator made, as the API server has them. */
static void on_role(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct secret_grants *g = ud;
	const char *ns = obj_str(obj, "metadata.namespace");
	if (strcmp(obj_str(obj, "metadata.name"), SECRET_GRANTS_NAME) != 0 || !*ns)
		return;
	struct space *s = space_of(g, ns);
	if (!s || s->busy)
		return;
	free(s->applied);
	s->applied = NULL;
	if (t != OBJSTORE_DELETED) {
		/* what it allows now: a hand edit shows as a difference */
		char buf[4096] = "";
		size_t n = 0;
		const cJSON *rule =
		    cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(obj, "rules"), 0);
		const cJSON *v;
		cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(rule, "resourceNames"))
		{
			if (cJSON_IsString(v) && n + strlen(v->valuestring) + 2 < sizeof(buf))
				n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%s",
				                      n ? "," : "", v->valuestring);
		}
		/* anything but the one rule we write (or no names: every name) is
		 * never what the caches want */
		s->applied = strdup(
		    cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(obj, "rules")) == 1 && n
		        ? buf
		        : "\n");
	}
	sync_space(g, s);
}

int secret_grants_new(struct workers *w, struct objstore *os, const char *manager,
                      const char *agent_sa, const char *home, struct secret_grants **out)
{
	const char *slash = agent_sa ? strchr(agent_sa, '/') : NULL;
	if (!slash || slash == agent_sa || (size_t)(slash - agent_sa) >= 64 || !slash[1] ||
	    strlen(slash + 1) >= 254)
		return -EINVAL;
	struct secret_grants *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->workers = w;
	g->os = os;
	g->manager = manager;
	snprintf(g->sa_ns, sizeof(g->sa_ns), "%.*s", (int)(slash - agent_sa), agent_sa);
	snprintf(g->sa_name, sizeof(g->sa_name), "%s", slash + 1);
	snprintf(g->home, sizeof(g->home), "%s", pull_secret_home(home));
	if (!obj_valid_label(g->sa_ns) || !obj_valid_name(g->sa_name)) {
		free(g);
		return -EINVAL;
	}
	struct objstore_watch watch = {.api_version = RBAC,
	                               .kind = "Role",
	                               .label_selector = SECRET_GRANTS_LABEL "=true",
	                               .on_event = on_role,
	                               .ud = g,
	                               .no_cache = true};
	int rc = os->ops->watch(os, &watch);
	if (rc) {
		free(g);
		return rc;
	}
	*out = g;
	return 0;
}

void secret_grants_free(struct secret_grants *g)
{
	size_t pos = 0;
	void *val;
	if (!g)
		return;
	while (strmap_next(&g->caches, &pos, NULL, &val))
		free(val);
	pos = 0;
	while (strmap_next(&g->spaces, &pos, NULL, &val)) {
		struct space *s = val;
		free(s->want);
		free(s->applied);
		free(s);
	}
	strmap_clear(&g->caches);
	strmap_clear(&g->spaces);
	free(g);
}
