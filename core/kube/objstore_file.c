/* Standalone object store: objects as files in a state directory.
 *
 *   DIR/objects/<kind>/<namespace or _cluster>/<name>.yaml         the object (gkm apply)
 *   DIR/objects/<kind>/<namespace or _cluster>/<name>.status.json  its status (the loops)
 *   DIR/events.jsonl                                               Events, one per line
 *
 * Each file has one writer (a user's `gkm apply` writes the object, one loop
 * writes the status) and every write is a rename of a complete temporary
 * file, so readers never see half a file. `_cluster` cannot be a namespace
 * (namespaces are DNS labels, without '_'). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"
#include "objstore.h"
#include "textfmt.h"
#include "yamljson.h"

#define CLUSTER_DIR "_cluster"
#define MAX_WATCHES 16
#define MAX_OBJECT (4u << 20)

struct known {
	struct known *next;
	char path[512]; /* object file path, the identity */
	char sig[96];   /* mtimes and sizes of object and status files */
	cJSON *obj;     /* last object delivered */
	unsigned pass;  /* the scan that last saw the file */
};

struct fwatch {
	struct objstore_watch w;
	char api_version[64], kind[64], ns[64], labels[256];
	struct known *known;
	unsigned pass;
	bool synced;
};

struct fstore {
	struct objstore base;
	char dir[400];
	struct loop *loop;
	unsigned poll_ms;
	struct fwatch watches[MAX_WATCHES];
	size_t nwatches;
	uint64_t timer;
	pthread_mutex_t write_lock;
};

static bool cluster_scoped(const char *kind)
{
	return !strcmp(kind, "ClusterGKMCache") || !strcmp(kind, "ClusterGKMCacheNode") ||
	       !strcmp(kind, "Node") || !strcmp(kind, "Namespace");
}

static void kind_dir(const char *kind, char *buf, size_t len)
{
	size_t i = 0;
	for (; kind[i] && i + 1 < len; i++)
		buf[i] = (char)tolower((unsigned char)kind[i]);
	buf[i] = '\0';
}

static int object_path(struct fstore *fs, const char *kind, const char *ns, const char *name,
                       const char *suffix, char *buf, size_t len)
{
	char kd[64];
	if (!obj_valid_name(name) || (!cluster_scoped(kind) && !obj_valid_label(ns)))
		return -EINVAL;
	kind_dir(kind, kd, sizeof(kd));
	int n = snprintf(buf, len, "%s/objects/%s/%s/%s%s", fs->dir, kd,
	                 cluster_scoped(kind) ? CLUSTER_DIR : ns, name, suffix);
	return n > 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

/* Read a whole small file; NULL with errno set when absent or too big. */
static char *slurp(const char *path, size_t *len)
{
	char *buf = NULL;
	if (fsutil_read_file(path, MAX_OBJECT, &buf, len) != 0)
		return NULL;
	return buf;
}

/* The object file merged with its status file, or NULL. */
static cJSON *load_object(const char *path)
{
	size_t len = 0;
	char *text = slurp(path, &len);
	cJSON *docs = NULL, *obj = NULL;
	char err[256];
	if (!text)
		return NULL;
	if (yamljson_parse(text, len, &docs, err, sizeof(err)) != 0) {
		log_warn("ignoring unreadable object file", "path", path, "error", err);
		goto out;
	}
	obj = cJSON_DetachItemFromArray(docs, 0);
	if (!cJSON_IsObject(obj)) {
		cJSON_Delete(obj);
		obj = NULL;
		goto out;
	}
	char spath[600];
	snprintf(spath, sizeof(spath), "%.*s.status.json", (int)(strlen(path) - 5), path);
	free(text);
	text = slurp(spath, &len);
	if (text) {
		cJSON *st = cJSON_ParseWithLength(text, len);
		cJSON *status = st ? cJSON_DetachItemFromObjectCaseSensitive(st, "status") : NULL;
		if (status)
			obj_set(obj, "status", status);
		cJSON_Delete(st);
	}
out:
	free(text);
	cJSON_Delete(docs);
	return obj;
}

static void file_sig(const char *path, char *sig, size_t len)
{
	struct stat a, b;
	char spath[600];
	snprintf(spath, sizeof(spath), "%.*s.status.json", (int)(strlen(path) - 5), path);
	bool ha = stat(path, &a) == 0, hb = stat(spath, &b) == 0;
	snprintf(sig, len, "%lld.%ld:%lld/%lld.%ld:%lld", ha ? (long long)a.st_mtim.tv_sec : 0,
	         ha ? a.st_mtim.tv_nsec : 0, ha ? (long long)a.st_size : 0,
	         hb ? (long long)b.st_mtim.tv_sec : 0, hb ? b.st_mtim.tv_nsec : 0,
	         hb ? (long long)b.st_size : 0);
}

/* label selector: comma-separated key=value or key (exists) terms */
static bool labels_match(const cJSON *obj, const char *sel)
{
	if (!sel || !*sel)
		return true;
	const cJSON *labels = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "labels");
	char copy[256], *save = NULL;
	snprintf(copy, sizeof(copy), "%s", sel);
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(t, '=');
		if (eq)
			*eq = '\0';
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(labels, t);
		if (!v || (eq && (!cJSON_IsString(v) || strcmp(v->valuestring, eq + 1) != 0)))
			return false;
	}
	return true;
}

static struct known *find_known(struct fwatch *w, const char *path)
{
	for (struct known *k = w->known; k; k = k->next)
		if (!strcmp(k->path, path))
			return k;
	return NULL;
}

/* One pass over the watched kind's directory; delivers changes. */
static void scan(struct fstore *fs, struct fwatch *w)
{
	char kd[64], base[480];
	kind_dir(w->kind, kd, sizeof(kd));
	snprintf(base, sizeof(base), "%s/objects/%s", fs->dir, kd);
	unsigned pass = ++w->pass;
	DIR *top = opendir(base);
	struct dirent *nsd, *de;
	while (top && (nsd = readdir(top)) != NULL) {
		if (nsd->d_name[0] == '.')
			continue;
		if (w->ns[0] && strcmp(nsd->d_name, w->ns) != 0)
			continue;
		char nsdir[768];
		snprintf(nsdir, sizeof(nsdir), "%s/%s", base, nsd->d_name);
		DIR *d = opendir(nsdir);
		while (d && (de = readdir(d)) != NULL) {
			size_t n = strlen(de->d_name);
			if (n < 6 || strcmp(de->d_name + n - 5, ".yaml") != 0 ||
			    de->d_name[0] == '.')
				continue;
			char path[1100], sig[96];
			if (snprintf(path, sizeof(path), "%s/%s", nsdir, de->d_name) >= 512)
				continue;
			file_sig(path, sig, sizeof(sig));
			struct known *k = find_known(w, path);
			if (k && !strcmp(k->sig, sig)) {
				k->pass = pass;
				continue;
			}
			cJSON *obj = load_object(path);
			if (!obj || !labels_match(obj, w->labels)) {
				cJSON_Delete(obj);
				continue;
			}
			enum objstore_event_type t = k ? OBJSTORE_MODIFIED : OBJSTORE_ADDED;
			if (!k) {
				k = calloc(1, sizeof(*k));
				if (!k) {
					cJSON_Delete(obj);
					continue;
				}
				snprintf(k->path, sizeof(k->path), "%s", path);
				k->next = w->known;
				w->known = k;
			}
			snprintf(k->sig, sizeof(k->sig), "%s", sig);
			cJSON_Delete(k->obj);
			k->obj = obj;
			k->pass = pass;
			w->w.on_event(w->w.ud, t, obj);
		}
		if (d)
			closedir(d);
	}
	if (top)
		closedir(top);
	/* whatever was not seen in this pass is gone */
	for (struct known **pk = &w->known; *pk;) {
		struct known *k = *pk;
		if (k->pass == pass) {
			pk = &k->next;
			continue;
		}
		*pk = k->next;
		w->w.on_event(w->w.ud, OBJSTORE_DELETED, k->obj);
		cJSON_Delete(k->obj);
		free(k);
	}
	if (!w->synced) {
		w->synced = true;
		if (w->w.on_synced)
			w->w.on_synced(w->w.ud);
	}
}

static void poll_tick(struct loop *l, void *ud)
{
	struct fstore *fs = ud;
	for (size_t i = 0; i < fs->nwatches; i++)
		scan(fs, &fs->watches[i]);
	fs->timer = loop_add_timer(l, fs->poll_ms, poll_tick, fs);
}

static int f_watch(struct objstore *s, const struct objstore_watch *w)
{
	struct fstore *fs = (struct fstore *)s;
	if (fs->nwatches >= MAX_WATCHES)
		return -ENOSPC;
	struct fwatch *fw = &fs->watches[fs->nwatches++];
	memset(fw, 0, sizeof(*fw));
	fw->w = *w;
	snprintf(fw->api_version, sizeof(fw->api_version), "%s", w->api_version);
	snprintf(fw->kind, sizeof(fw->kind), "%s", w->kind);
	snprintf(fw->ns, sizeof(fw->ns), "%s", w->namespace_ ? w->namespace_ : "");
	snprintf(fw->labels, sizeof(fw->labels), "%s", w->label_selector ? w->label_selector : "");
	fw->w.api_version = fw->api_version;
	fw->w.kind = fw->kind;
	scan(fs, fw); /* deliver what is there now, on the caller's (loop) thread */
	return 0;
}

static char *sha_hex(const char *s)
{
	unsigned char md[32];
	unsigned int n = 0;
	EVP_Digest(s, strlen(s), md, &n, EVP_sha256(), NULL);
	char *out = malloc(65);
	if (!out)
		return NULL;
	hex_encode(md, 32, out);
	return out;
}

/* Merge the applied object into the stored one: labels and annotations by
 * key, spec replaced; generation bumps when spec changes. */
static cJSON *merge_object(cJSON *stored, const cJSON *applied)
{
	cJSON *out = cJSON_Duplicate(applied, 1);
	cJSON *meta = cJSON_GetObjectItemCaseSensitive(out, "metadata");
	const cJSON *old_meta = cJSON_GetObjectItemCaseSensitive(stored, "metadata");
	char now[32];
	obj_now(now, sizeof(now));
	cJSON_DeleteItemFromObjectCaseSensitive(out, "status");
	double generation = 1;
	if (old_meta) {
		static const char *const maps[] = {"labels", "annotations"};
		for (size_t i = 0; i < 2; i++) {
			const cJSON *om = cJSON_GetObjectItemCaseSensitive(old_meta, maps[i]), *e;
			cJSON *nm = cJSON_GetObjectItemCaseSensitive(meta, maps[i]);
			if (!om)
				continue;
			if (!nm)
				nm = cJSON_AddObjectToObject(meta, maps[i]);
			cJSON_ArrayForEach(e, om)
			{
				if (!cJSON_GetObjectItemCaseSensitive(nm, e->string))
					cJSON_AddItemToObject(nm, e->string, cJSON_Duplicate(e, 1));
			}
		}
		static const char *const keep[] = {"uid", "creationTimestamp", "ownerReferences"};
		for (size_t i = 0; i < 3; i++) {
			const cJSON *v = cJSON_GetObjectItemCaseSensitive(old_meta, keep[i]);
			if (v && !cJSON_GetObjectItemCaseSensitive(meta, keep[i]))
				cJSON_AddItemToObject(meta, keep[i], cJSON_Duplicate(v, 1));
		}
		const cJSON *og = cJSON_GetObjectItemCaseSensitive(old_meta, "generation");
		generation = cJSON_IsNumber(og) ? og->valuedouble : 1;
		if (!cJSON_Compare(cJSON_GetObjectItemCaseSensitive(stored, "spec"),
		                   cJSON_GetObjectItemCaseSensitive(out, "spec"), 1))
			generation += 1;
	}
	cJSON_DeleteItemFromObjectCaseSensitive(meta, "generation");
	cJSON_AddNumberToObject(meta, "generation", generation);
	if (!cJSON_GetObjectItemCaseSensitive(meta, "creationTimestamp"))
		cJSON_AddStringToObject(meta, "creationTimestamp", now);
	if (!cJSON_GetObjectItemCaseSensitive(meta, "uid")) {
		char seed[512];
		snprintf(seed, sizeof(seed), "%s/%s/%s/%s", obj_str(out, "kind"),
		         obj_str(out, "metadata.namespace"), obj_str(out, "metadata.name"), now);
		char *h = sha_hex(seed);
		if (h) {
			char uid[40];
			snprintf(uid, sizeof(uid), "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12,
			         h + 16, h + 20);
			cJSON_AddStringToObject(meta, "uid", uid);
		}
		free(h);
	}
	return out;
}

static int f_apply(struct objstore *s, const cJSON *obj, const char *manager, bool status,
                   cJSON **result, char *err, size_t errlen)
{
	struct fstore *fs = (struct fstore *)s;
	const char *kind = obj_str(obj, "kind"), *ns = obj_str(obj, "metadata.namespace"),
	           *name = obj_str(obj, "metadata.name");
	char path[512], spath[540];
	int rc;
	(void)manager;
	if (object_path(fs, kind, ns, name, ".yaml", path, sizeof(path)) != 0 ||
	    object_path(fs, kind, ns, name, ".status.json", spath, sizeof(spath)) != 0) {
		snprintf(err, errlen, "%s %s/%s: invalid kind, namespace or name", kind, ns, name);
		return -EINVAL;
	}
	pthread_mutex_lock(&fs->write_lock);
	cJSON *stored = load_object(path);
	if (status) {
		if (!stored) {
			snprintf(err, errlen, "%s %s/%s: not found", kind, ns, name);
			rc = -ENOENT;
			goto out;
		}
		cJSON *doc = cJSON_CreateObject();
		cJSON_AddItemToObject(
		    doc, "status",
		    cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(obj, "status"), 1));
		char *text = cJSON_PrintUnformatted(doc);
		cJSON_Delete(doc);
		rc = text ? fsutil_write_atomic(spath, text, strlen(text), 0644) : -ENOMEM;
		free(text);
		if (rc == 0 && result)
			obj_set(
			    stored, "status",
			    cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(obj, "status"), 1));
	} else {
		cJSON *merged = merge_object(stored, obj); /* stored may be NULL */
		char *text = merged ? yamljson_emit(merged) : NULL;
		char dir[512];
		snprintf(dir, sizeof(dir), "%s", path);
		*strrchr(dir, '/') = '\0';
		rc = text ? fsutil_mkdirs(dir, 0755) : -ENOMEM;
		if (rc == 0)
			rc = fsutil_write_atomic(path, text, strlen(text), 0644);
		free(text);
		cJSON_Delete(stored);
		stored = merged;
	}
	if (rc != 0)
		snprintf(err, errlen, "%s %s/%s: write failed: %s", kind, ns, name, strerror(-rc));
	else if (result) {
		*result = stored;
		stored = NULL;
	}
out:
	pthread_mutex_unlock(&fs->write_lock);
	cJSON_Delete(stored);
	return rc;
}

static int f_get(struct objstore *s, const char *api_version, const char *kind, const char *ns,
                 const char *name, cJSON **out, char *err, size_t errlen)
{
	struct fstore *fs = (struct fstore *)s;
	char path[512];
	(void)api_version;
	if (object_path(fs, kind, ns ? ns : "", name, ".yaml", path, sizeof(path)) != 0) {
		snprintf(err, errlen, "%s %s: invalid name", kind, name);
		return -EINVAL;
	}
	cJSON *obj = load_object(path);
	if (!obj) {
		snprintf(err, errlen, "%s %s: not found", kind, name);
		return -ENOENT;
	}
	*out = obj;
	return 0;
}

static int f_remove(struct objstore *s, const char *api_version, const char *kind, const char *ns,
                    const char *name, char *err, size_t errlen)
{
	struct fstore *fs = (struct fstore *)s;
	char path[512], spath[540];
	(void)api_version;
	if (object_path(fs, kind, ns ? ns : "", name, ".yaml", path, sizeof(path)) != 0 ||
	    object_path(fs, kind, ns ? ns : "", name, ".status.json", spath, sizeof(spath)) != 0) {
		snprintf(err, errlen, "%s %s: invalid name", kind, name);
		return -EINVAL;
	}
	pthread_mutex_lock(&fs->write_lock);
	int rc = unlink(path) == 0 ? 0 : -errno;
	unlink(spath);
	pthread_mutex_unlock(&fs->write_lock);
	if (rc != 0)
		snprintf(err, errlen, "%s %s: %s", kind, name,
		         rc == -ENOENT ? "not found" : strerror(-rc));
	return rc;
}

static int f_event(struct objstore *s, const cJSON *obj, const char *type, const char *reason,
                   const char *message, const char *component)
{
	struct fstore *fs = (struct fstore *)s;
	char path[460], now[32];
	obj_now(now, sizeof(now));
	snprintf(path, sizeof(path), "%s/events.jsonl", fs->dir);
	cJSON *ev = cJSON_CreateObject();
	cJSON *inv = cJSON_AddObjectToObject(ev, "involvedObject");
	cJSON_AddStringToObject(inv, "kind", obj_str(obj, "kind"));
	cJSON_AddStringToObject(inv, "namespace", obj_str(obj, "metadata.namespace"));
	cJSON_AddStringToObject(inv, "name", obj_str(obj, "metadata.name"));
	cJSON_AddStringToObject(inv, "uid", obj_str(obj, "metadata.uid"));
	cJSON_AddStringToObject(ev, "type", type);
	cJSON_AddStringToObject(ev, "reason", reason);
	cJSON_AddStringToObject(ev, "message", message);
	cJSON_AddStringToObject(ev, "source", component);
	cJSON_AddStringToObject(ev, "time", now);
	char *line = cJSON_PrintUnformatted(ev);
	cJSON_Delete(ev);
	if (!line)
		return -ENOMEM;
	int rc = fsutil_append_line(path, line);
	free(line);
	return rc;
}

static void f_free(struct objstore *s)
{
	struct fstore *fs = (struct fstore *)s;
	if (!fs)
		return;
	if (fs->timer)
		loop_cancel_timer(fs->loop, fs->timer);
	for (size_t i = 0; i < fs->nwatches; i++) {
		while (fs->watches[i].known) {
			struct known *k = fs->watches[i].known;
			fs->watches[i].known = k->next;
			cJSON_Delete(k->obj);
			free(k);
		}
	}
	pthread_mutex_destroy(&fs->write_lock);
	free(fs);
}

static const struct objstore_ops file_ops = {
    .watch = f_watch,
    .apply = f_apply,
    .get = f_get,
    .remove = f_remove,
    .event = f_event,
    .free = f_free,
};

int objstore_file_new(const char *dir, struct loop *l, unsigned poll_ms, struct objstore **out)
{
	struct fstore *fs = calloc(1, sizeof(*fs));
	char objdir[460];
	if (!fs)
		return -ENOMEM;
	if (snprintf(fs->dir, sizeof(fs->dir), "%s", dir) >= (int)sizeof(fs->dir)) {
		free(fs);
		return -ENAMETOOLONG;
	}
	snprintf(objdir, sizeof(objdir), "%s/objects", dir);
	int rc = fsutil_mkdirs(objdir, 0755);
	if (rc != 0) {
		free(fs);
		return rc;
	}
	fs->base.ops = &file_ops;
	fs->loop = l;
	fs->poll_ms = poll_ms ? poll_ms : 250;
	pthread_mutex_init(&fs->write_lock, NULL);
	if (l)
		fs->timer = loop_add_timer(l, fs->poll_ms, poll_tick, fs);
	*out = &fs->base;
	return 0;
}
