#include "cache_env.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *label(const cJSON *labels, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(labels, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

enum cache_format cache_format_of_labels(const cJSON *labels)
{
	if (label(labels, "cache.vllm.image/summary") ||
	    label(labels, "cache.vllm.image/entry-count"))
		return CACHE_VLLM;
	if (label(labels, "cache.triton.image/summary") ||
	    label(labels, "cache.triton.image/entry-count"))
		return CACHE_TRITON;
	return CACHE_AUTO;
}

const char *cache_env_label(const cJSON *labels, enum cache_format f, const char *key)
{
	char k[96];
	snprintf(k, sizeof(k), "cache.%s.image/%s", f == CACHE_VLLM ? "vllm" : "triton", key);
	return label(labels, k);
}

unsigned long long cache_env_size_bytes(const cJSON *labels)
{
	enum cache_format f = cache_format_of_labels(labels);
	const char *v = f == CACHE_AUTO ? NULL : cache_env_label(labels, f, "cache-size-bytes");
	char *end = NULL;
	unsigned long long n = v && *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
	return end && *end == '\0' ? n : 0;
}

const char *cache_env_identity(const cJSON *labels)
{
	enum cache_format f = cache_format_of_labels(labels);
	return f == CACHE_AUTO ? NULL : cache_env_label(labels, f, "identity");
}

/* An environment variable name as Kubernetes accepts one (C identifier). */
static bool env_name(const char *s, size_t len)
{
	if (!len || len >= sizeof(((struct cache_env_tree *)0)->variable) ||
	    (s[0] >= '0' && s[0] <= '9'))
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9')))
			return false;
	}
	return true;
}

int cache_env_tree_set(struct cache_env_tree *t, const char *var, size_t varlen, const char *sub,
                       size_t sublen)
{
	if (!env_name(var, varlen))
		return 0;
	while (sublen && *sub == '/')
		sub++, sublen--;
	while (sublen && sub[sublen - 1] == '/')
		sublen--;
	if (sublen >= sizeof(t->subpath) || memchr(sub, ',', sublen))
		return 0;
	/* a path component ".." would leave the mount */
	for (size_t i = 0; i + 1 < sublen; i++)
		if ((i == 0 || sub[i - 1] == '/') && sub[i] == '.' && sub[i + 1] == '.' &&
		    (i + 2 == sublen || sub[i + 2] == '/'))
			return 0;
	memcpy(t->variable, var, varlen);
	t->variable[varlen] = '\0';
	memcpy(t->subpath, sub, sublen);
	t->subpath[sublen] = '\0';
	return 1;
}

static bool have_variable(const struct cache_env_tree *t, size_t n, const char *var)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(t[i].variable, var) == 0)
			return true;
	return false;
}

size_t cache_env_trees(const cJSON *labels, struct cache_env_tree *out, size_t cap)
{
	size_t n = 0;
	const char *env = label(labels, CACHE_ENV_LABEL_ROOT_ENV);
	const char *sub = label(labels, CACHE_ENV_LABEL_SUBPATH);
	if (env && n < cap) {
		const char *eq = strchr(env, '=');
		size_t len = eq ? (size_t)(eq - env) : strlen(env);
		sub = sub ? sub : "";
		n += (size_t)cache_env_tree_set(&out[n], env, len, sub, strlen(sub));
	}
	static const struct {
		enum cache_format format;
		const char *variable, *subpath;
	} known[] = {
	    {CACHE_TRITON, "TRITON_CACHE_DIR", "io.triton.cache"},
	    {CACHE_VLLM, "VLLM_CACHE_ROOT", "io.vllm.cache"},
	};
	enum cache_format f = cache_format_of_labels(labels);
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		if (known[i].format != f || n >= cap || have_variable(out, n, known[i].variable))
			continue;
		n += (size_t)cache_env_tree_set(&out[n], known[i].variable,
		                                strlen(known[i].variable), known[i].subpath,
		                                strlen(known[i].subpath));
	}
	return n;
}

void cache_env_format(const struct cache_env_tree *t, size_t n, char *buf, size_t len)
{
	size_t at = 0;
	if (len)
		buf[0] = '\0';
	for (size_t i = 0; i < n && at < len; i++) {
		int w = snprintf(buf + at, len - at, "%s%s=%s", i ? "," : "", t[i].variable,
		                 t[i].subpath);
		if (w < 0 || (size_t)w >= len - at) {
			buf[at] = '\0'; /* no entry is cut in half */
			return;
		}
		at += (size_t)w;
	}
}

size_t cache_env_parse(const char *text, struct cache_env_tree *out, size_t cap)
{
	size_t n = 0;
	while (text && *text && n < cap) {
		const char *end = strchr(text, ',');
		size_t len = end ? (size_t)(end - text) : strlen(text);
		const char *eq = memchr(text, '=', len);
		if (eq &&
		    cache_env_tree_set(&out[n], text, (size_t)(eq - text), eq + 1,
		                       len - (size_t)(eq - text) - 1) &&
		    !have_variable(out, n, out[n].variable))
			n++;
		text = end ? end + 1 : NULL;
	}
	return n;
}
