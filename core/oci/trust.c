#include "trust.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define MAX_KEY_FILES 64

#include "log.h"
#include "trust_keyless.h"
#include "watched.h"
#include "yamljson.h"

int trust_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = {"true", "yes", "on", "1"};
	static const char *const no[] = {"false", "no", "off", "0"};
	char v[8];
	size_t n;
	while (isspace((unsigned char)*s))
		s++;
	for (n = 0; s[n] && !isspace((unsigned char)s[n]); n++)
		;
	for (const char *t = s + n; *t; t++)
		if (!isspace((unsigned char)*t))
			return -EINVAL;
	if (n == 0 || n >= sizeof(v))
		return -EINVAL;
	memcpy(v, s, n);
	v[n] = '\0';
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* Which setting a configuration key names (both spellings), or NULL for a
 * key of another daemon (the ConfigMap is shared). */
static bool *setting_for(struct trust_settings *s, const char *key)
{
	if (!strcmp(key, "verify-enabled") || !strcmp(key, "verifyEnabled"))
		return &s->verify_enabled;
	if (!strcmp(key, "allow-unsigned-images") || !strcmp(key, "allowUnsignedImages"))
		return &s->allow_unsigned;
	return NULL;
}

static int set_value(struct trust_settings *s, const char *where, const char *key, const cJSON *v,
                     char *err, size_t errlen)
{
	bool *dst = setting_for(s, key);
	if (!dst)
		return 0;
	if (cJSON_IsBool(v)) {
		*dst = cJSON_IsTrue(v);
		return 0;
	}
	if (cJSON_IsString(v) && trust_parse_bool(v->valuestring, dst) == 0)
		return 0;
	char *shown = cJSON_IsString(v) ? NULL : cJSON_PrintUnformatted(v);
	snprintf(err, errlen, "%s: %s: want true or false, got '%.64s'", where, key,
	         shown ? shown : (cJSON_IsString(v) ? v->valuestring : "?"));
	free(shown);
	return -EINVAL;
}

/* A configuration directory holds one file per key (a mounted ConfigMap);
 * a file holds a YAML or JSON mapping. */
static int read_config(const char *path, const struct watched_files *w, bool is_dir,
                       struct trust_settings *s, char *err, size_t errlen)
{
	int rc = 0;
	if (is_dir) {
		for (size_t i = 0; i < w->n && rc == 0; i++) {
			cJSON *v = cJSON_CreateString(w->f[i].data);
			if (!v)
				return -ENOMEM;
			char where[4200];
			snprintf(where, sizeof(where), "%s/%s", path, w->f[i].name);
			rc = set_value(s, where, w->f[i].name, v, err, errlen);
			cJSON_Delete(v);
		}
		return rc;
	}
	cJSON *docs = NULL;
	char perr[256];
	if (yamljson_parse(w->f[0].data, w->f[0].len, &docs, perr, sizeof(perr)) != 0) {
		snprintf(err, errlen, "%s: %s", path, perr);
		return -EINVAL;
	}
	const cJSON *doc = cJSON_GetArrayItem(docs, 0);
	if (cJSON_GetArraySize(docs) > 1 || (doc && !cJSON_IsObject(doc))) {
		snprintf(err, errlen,
		         "%s: want one mapping of settings (verify-enabled: true, ...)", path);
		rc = -EINVAL;
	}
	for (const cJSON *kv = rc == 0 && doc ? doc->child : NULL; kv && rc == 0; kv = kv->next)
		rc = set_value(s, path, kv->string, kv, err, errlen);
	cJSON_Delete(docs);
	return rc;
}

/* Every PEM key of every file of w; path names the directory (is_dir) or
 * the file in messages. */
static int load_keys(const char *path, bool is_dir, const struct watched_files *w,
                     struct sig_keyset *ks, char *err, size_t errlen)
{
	for (size_t i = 0; i < w->n; i++) {
		char why[256];
		if (is_dir && trust_keyless_file(w->f[i].name))
			continue; /* trust_keyless_load's */
		if (sig_keyset_add_pem(ks, w->f[i].data, w->f[i].len, why, sizeof(why)) != 0) {
			if (is_dir)
				snprintf(err, errlen, "%s/%s: %s", path, w->f[i].name, why);
			else
				snprintf(err, errlen, "%s: %s", path, why);
			return -EINVAL;
		}
	}
	return 0;
}

/* Everything a trust snapshot is built from, read whole. */
struct sources {
	struct watched_files dir, config;
	struct watched_files *files; /* one per key file */
	unsigned nfiles;
	char digest[65];
};

static void sources_clear(struct sources *s)
{
	watched_files_clear(&s->dir);
	watched_files_clear(&s->config);
	for (unsigned i = 0; i < s->nfiles; i++)
		watched_files_clear(&s->files[i]);
	free(s->files);
	memset(s, 0, sizeof(*s));
}

static int read_sources(const struct trust_source *src, struct sources *out, char *err,
                        size_t errlen)
{
	struct sources s = {0};
	char all[80 * (MAX_KEY_FILES + 2)];
	int rc;
	if (src->nkey_files > MAX_KEY_FILES)
		return -E2BIG;
	if (src->nkey_files && !(s.files = calloc(src->nkey_files, sizeof(*s.files))))
		return -ENOMEM;
	if (src->trust_dir && (rc = watched_read(src->trust_dir, &s.dir, err, errlen)) != 0)
		goto fail;
	for (; s.nfiles < src->nkey_files; s.nfiles++)
		if ((rc = watched_read(src->key_files[s.nfiles], &s.files[s.nfiles], err,
		                       errlen)) != 0)
			goto fail;
	if (src->config_path && (rc = watched_read(src->config_path, &s.config, err, errlen)) != 0)
		goto fail;
	/* one digest over the parts, each marked so that no two layouts collide */
	size_t used =
	    (size_t)snprintf(all, sizeof(all), "dir:%s\n", src->trust_dir ? s.dir.digest : "-");
	for (unsigned i = 0; i < s.nfiles && used < sizeof(all); i++)
		used +=
		    (size_t)snprintf(all + used, sizeof(all) - used, "key:%s\n", s.files[i].digest);
	if (used < sizeof(all))
		used += (size_t)snprintf(all + used, sizeof(all) - used, "config:%s\n",
		                         src->config_path ? s.config.digest : "-");
	if (used >= sizeof(all)) {
		rc = -E2BIG;
		snprintf(err, errlen, "too many key files");
		goto fail;
	}
	if ((rc = watched_hash(all, used, s.digest)) != 0)
		goto fail;
	*out = s;
	return 0;
fail:
	sources_clear(&s);
	return rc;
}

int trust_source_digest(const struct trust_source *src, char out[65], char *err, size_t errlen)
{
	struct sources s;
	int rc = read_sources(src, &s, err, errlen);
	if (rc == 0) {
		memcpy(out, s.digest, 65);
		sources_clear(&s);
	}
	return rc;
}

int trust_load(const struct trust_source *src, struct trust **out, char *err, size_t errlen)
{
	struct sources in;
	struct trust *t = calloc(1, sizeof(*t));
	int rc;
	if (!t)
		return -ENOMEM;
	atomic_init(&t->refs, 1);
	t->s = src->defaults;
	if ((rc = read_sources(src, &in, err, errlen)) != 0) {
		free(t);
		return rc;
	}
	memcpy(t->digest, in.digest, sizeof(t->digest));
	if ((rc = sig_keyset_new(&t->keys)) != 0)
		goto out;
	if (src->trust_dir &&
	    ((rc = load_keys(src->trust_dir, true, &in.dir, t->keys, err, errlen)) != 0 ||
	     (rc = trust_keyless_load(src->trust_dir, &in.dir, t->keys, err, errlen)) != 0))
		goto out;
	for (unsigned i = 0; i < in.nfiles; i++)
		if ((rc = load_keys(src->key_files[i], false, &in.files[i], t->keys, err,
		                    errlen)) != 0)
			goto out;
	if (src->config_path) {
		struct stat st;
		bool is_dir = stat(src->config_path, &st) == 0 && S_ISDIR(st.st_mode);
		if ((rc = read_config(src->config_path, &in.config, is_dir, &t->s, err, errlen)) !=
		    0)
			goto out;
	}
	t->nkeys = sig_keyset_count(t->keys);
	snprintf(t->keys_fp, sizeof(t->keys_fp), "%s",
	         t->nkeys ? sig_keyset_fingerprint(t->keys) : "none");
out:
	sources_clear(&in);
	if (rc != 0) {
		trust_unref(t);
		return rc;
	}
	*out = t;
	return 0;
}

int trust_poll(const struct trust_source *src, const struct trust *cur, char seen[65],
               struct trust **out)
{
	char digest[65], err[512];
	struct trust *t = NULL;
	int rc = trust_source_digest(src, digest, err, sizeof(err));
	if (rc) {
		if (strcmp(seen, "unreadable") != 0)
			log_warn("trust configuration unreadable; keeping the previous one",
			         "error", err);
		snprintf(seen, 65, "unreadable");
		return rc;
	}
	if (strcmp(digest, seen) == 0)
		return 0;
	memcpy(seen, digest, 65);
	if (strcmp(digest, cur->digest) == 0)
		return 0;
	if ((rc = trust_load(src, &t, err, sizeof(err))) != 0) {
		log_error("trust configuration refused; keeping the previous one", "error", err);
		return rc;
	}
	char nkeys[24];
	snprintf(nkeys, sizeof(nkeys), "%zu", t->nkeys);
	log_info("trust configuration reloaded", "keys", nkeys, "keyset", t->keys_fp,
	         "verify_enabled", t->s.verify_enabled ? "true" : "false", "allow_unsigned",
	         t->s.allow_unsigned ? "true" : "false");
	*out = t;
	return 1;
}

struct trust *trust_ref(struct trust *t)
{
	atomic_fetch_add(&t->refs, 1);
	return t;
}

void trust_unref(struct trust *t)
{
	if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	sig_keyset_free(t->keys);
	free(t);
}
