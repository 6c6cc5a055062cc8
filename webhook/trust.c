#include "trust.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "log.h"
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

static int load_keys(const char *dir, const struct watched_files *w, struct sig_keyset *ks,
                     char *err, size_t errlen)
{
	for (size_t i = 0; i < w->n; i++) {
		char why[256];
		if (sig_keyset_add_pem(ks, w->f[i].data, w->f[i].len, why, sizeof(why)) != 0) {
			snprintf(err, errlen, "%s/%s: %s", dir, w->f[i].name, why);
			return -EINVAL;
		}
	}
	return 0;
}

/* Read both sources; *keys_out and *config_out may be NULL when unused. */
static int read_sources(const struct trust_source *src, struct watched_files *keys,
                        struct watched_files *config, char digest[132], char *err, size_t errlen)
{
	int rc;
	*keys = (struct watched_files){0};
	*config = (struct watched_files){0};
	if (src->trust_dir && (rc = watched_read(src->trust_dir, keys, err, errlen)) != 0)
		return rc;
	if (src->config_path && (rc = watched_read(src->config_path, config, err, errlen)) != 0) {
		watched_files_clear(keys);
		return rc;
	}
	snprintf(digest, 132, "%.64s:%.64s", src->trust_dir ? keys->digest : "-",
	         src->config_path ? config->digest : "-");
	return 0;
}

int trust_source_digest(const struct trust_source *src, char out[132], char *err, size_t errlen)
{
	struct watched_files keys, config;
	int rc = read_sources(src, &keys, &config, out, err, errlen);
	if (rc == 0) {
		watched_files_clear(&keys);
		watched_files_clear(&config);
	}
	return rc;
}

int trust_load(const struct trust_source *src, struct trust **out, char *err, size_t errlen)
{
	struct watched_files keys, config;
	struct trust *t = calloc(1, sizeof(*t));
	int rc;
	if (!t)
		return -ENOMEM;
	atomic_init(&t->refs, 1);
	t->s = src->defaults;
	if ((rc = read_sources(src, &keys, &config, t->digest, err, errlen)) != 0) {
		free(t);
		return rc;
	}
	if ((rc = sig_keyset_new(&t->keys)) != 0)
		goto out;
	if (src->trust_dir && (rc = load_keys(src->trust_dir, &keys, t->keys, err, errlen)) != 0)
		goto out;
	if (src->config_path) {
		struct stat st;
		bool is_dir = stat(src->config_path, &st) == 0 && S_ISDIR(st.st_mode);
		if ((rc = read_config(src->config_path, &config, is_dir, &t->s, err, errlen)) != 0)
			goto out;
	}
	t->nkeys = sig_keyset_count(t->keys);
	snprintf(t->keys_fp, sizeof(t->keys_fp), "%s",
	         t->nkeys ? sig_keyset_fingerprint(t->keys) : "none");
out:
	watched_files_clear(&keys);
	watched_files_clear(&config);
	if (rc != 0) {
		trust_unref(t);
		return rc;
	}
	*out = t;
	return 0;
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
