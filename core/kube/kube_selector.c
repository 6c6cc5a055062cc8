/* Label selectors (see kube_selector.h). */
#include "kube_selector.h"

#include "errbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REQS 32
#define MAX_VALUES 32
#define MAX_SELECTOR 4096

enum op { OP_EQ, OP_NE, OP_IN, OP_NOTIN, OP_EXISTS, OP_NOT_EXISTS };

struct req {
	enum op op;
	char *key;
	char *values[MAX_VALUES];
	unsigned nvalues;
};

struct kube_selector {
	struct req reqs[MAX_REQS];
	unsigned n;
};

static bool alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])? of 1..63 */
static bool qualified_name(const char *s, size_t n)
{
	if (n == 0 || n > 63 || !alnum(s[0]) || !alnum(s[n - 1]))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!alnum(s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
			return false;
	return true;
}

/* lower-case RFC 1123 subdomain of at most 253 */
static bool dns_prefix(const char *s, size_t n)
{
	if (n == 0 || n > 253)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
		if (!ok)
			return false;
	}
	return alnum(s[0]) && alnum(s[n - 1]);
}

bool kube_label_key_valid(const char *k)
{
	const char *slash = strchr(k, '/');
	if (!slash)
		return qualified_name(k, strlen(k));
	return dns_prefix(k, (size_t)(slash - k)) && qualified_name(slash + 1, strlen(slash + 1));
}

bool kube_label_value_valid(const char *v)
{
	size_t n = strlen(v);
	return n == 0 || qualified_name(v, n);
}

void kube_selector_free(struct kube_selector *sel)
{
	if (!sel)
		return;
	for (unsigned i = 0; i < sel->n; i++) {
		free(sel->reqs[i].key);
		for (unsigned j = 0; j < sel->reqs[i].nvalues; j++)
			free(sel->reqs[i].values[j]);
	}
	free(sel);
}

static void skip_ws(const char **p)
{
	while (**p == ' ' || **p == '\t')
		(*p)++;
}

/* A key or value token: up to a delimiter. */
static char *token(const char **p, const char *stops)
{
	skip_ws(p);
	const char *s = *p;
	while (**p && !strchr(stops, **p) && **p != ' ' && **p != '\t')
		(*p)++;
	char *t = strndup(s, (size_t)(*p - s));
	skip_ws(p);
	return t;
}

/* Read one value into r: 0, -ENOMEM, or -EINVAL with err. */
static int add_value(struct req *r, const char **p, const char *stops, const char *sel, char *err,
                     size_t errlen)
{
	if (r->nvalues >= MAX_VALUES) {
		errbuf_set(err, errlen, "more than %d values in a set", MAX_VALUES);
		return -EINVAL;
	}
	char *v = token(p, stops);
	if (!v)
		return -ENOMEM;
	r->values[r->nvalues++] = v;
	if (!kube_label_value_valid(v)) {
		errbuf_set(err, errlen, "invalid label value \"%s\" in selector \"%s\"", v, sel);
		return -EINVAL;
	}
	return 0;
}

int kube_selector_parse(const char *s, struct kube_selector **out, char *err, size_t errlen)
{
	if (s && strlen(s) > MAX_SELECTOR) {
		errbuf_set(err, errlen, "label selector longer than %d bytes", MAX_SELECTOR);
		return -EINVAL;
	}
	struct kube_selector *sel = calloc(1, sizeof(*sel));
	if (!sel)
		return -ENOMEM;
	const char *p = s ? s : "";
	skip_ws(&p);
	while (*p) {
		if (sel->n >= MAX_REQS) {
			errbuf_set(err, errlen, "label selector with more than %d requirements",
			           MAX_REQS);
			goto bad;
		}
		struct req *r = &sel->reqs[sel->n++];
		bool neg = false;
		if (*p == '!') {
			neg = true;
			p++;
		}
		r->key = token(&p, "=!,()");
		if (!r->key)
			goto nomem;
		if (!kube_label_key_valid(r->key)) {
			errbuf_set(err, errlen, "invalid label key \"%s\" in selector \"%s\"",
			           r->key, s);
			goto bad;
		}
		if (neg) {
			r->op = OP_NOT_EXISTS;
		} else if (*p == '=' || (*p == '!' && p[1] == '=')) {
			r->op = *p == '!' ? OP_NE : OP_EQ;
			p += (*p == '!' || p[1] == '=') ? 2 : 1;
			int vr = add_value(r, &p, ",()=!", s, err, errlen);
			if (vr < 0) {
				if (vr == -ENOMEM)
					goto nomem;
				goto bad;
			}
		} else if (!strncmp(p, "in", 2) || !strncmp(p, "notin", 5)) {
			r->op = p[0] == 'i' ? OP_IN : OP_NOTIN;
			p += r->op == OP_IN ? 2 : 5;
			skip_ws(&p);
			if (*p != '(') {
				errbuf_set(err, errlen,
				           "expected '(' after in/notin in selector \"%s\"", s);
				goto bad;
			}
			p++;
			for (;;) {
				int vr = add_value(r, &p, ",()", s, err, errlen);
				if (vr < 0) {
					if (vr == -ENOMEM)
						goto nomem;
					goto bad;
				}
				if (*p == ',') {
					p++;
					continue;
				}
				if (*p == ')') {
					p++;
					break;
				}
				errbuf_set(err, errlen, "unterminated value set in selector \"%s\"",
				           s);
				goto bad;
			}
		} else {
			r->op = OP_EXISTS;
		}
		skip_ws(&p);
		if (*p == ',') {
			p++;
			skip_ws(&p);
			if (!*p) {
				errbuf_set(err, errlen, "trailing ',' in selector \"%s\"", s);
				goto bad;
			}
		} else if (*p) {
			errbuf_set(err, errlen, "unexpected '%c' in selector \"%s\"", *p, s);
			goto bad;
		}
	}
	*out = sel;
	return 0;
nomem:
	kube_selector_free(sel);
	return -ENOMEM;
bad:
	kube_selector_free(sel);
	return -EINVAL;
}

static bool in_set(const struct req *r, const char *v)
{
	for (unsigned i = 0; i < r->nvalues; i++)
		if (!strcmp(r->values[i], v))
			return true;
	return false;
}

bool kube_selector_match(const struct kube_selector *sel, const cJSON *labels)
{
	for (unsigned i = 0; sel && i < sel->n; i++) {
		const struct req *r = &sel->reqs[i];
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(labels, r->key);
		const char *val = cJSON_IsString(v) ? v->valuestring : NULL;
		bool ok;
		switch (r->op) {
		case OP_EQ:
		case OP_IN:
			ok = val && in_set(r, val);
			break;
		case OP_NE:
		case OP_NOTIN:
			ok = !val || !in_set(r, val);
			break;
		case OP_EXISTS:
			ok = val != NULL;
			break;
		default:
			ok = val == NULL;
			break;
		}
		if (!ok)
			return false;
	}
	return true;
}

bool kube_selector_match_object(const struct kube_selector *sel, const cJSON *obj)
{
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
	return kube_selector_match(sel, cJSON_GetObjectItemCaseSensitive(meta, "labels"));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int kube_selector_from_map(const cJSON *map, char **out, char *err, size_t errlen)
{
	if (!cJSON_IsObject(map)) {
		errbuf_set(err, errlen, "a label map must be an object of strings");
		return -EINVAL;
	}
	int n = cJSON_GetArraySize(map);
	if (n > MAX_REQS) {
		errbuf_set(err, errlen, "more than %d labels in a selector", MAX_REQS);
		return -EINVAL;
	}
	const char *keys[MAX_REQS] = {NULL};
	size_t total = 1;
	int k = 0;
	const cJSON *it;
	cJSON_ArrayForEach(it, map)
	{
		if (!cJSON_IsString(it)) {
			errbuf_set(err, errlen, "label \"%s\" must be a string", it->string);
			return -EINVAL;
		}
		if (!kube_label_key_valid(it->string)) {
			errbuf_set(err, errlen, "invalid label key \"%s\"", it->string);
			return -EINVAL;
		}
		if (!kube_label_value_valid(it->valuestring)) {
			errbuf_set(err, errlen, "invalid value \"%s\" of label \"%s\"",
			           it->valuestring, it->string);
			return -EINVAL;
		}
		keys[k++] = it->string;
		total += strlen(it->string) + strlen(it->valuestring) + 2;
	}
	qsort(keys, (size_t)k, sizeof(keys[0]), cmp_str);
	char *s = malloc(total);
	if (!s)
		return -ENOMEM;
	size_t len = 0;
	s[0] = '\0';
	for (int i = 0; i < k; i++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(map, keys[i]);
		len += (size_t)snprintf(s + len, total - len, "%s%s=%s", i ? "," : "", keys[i],
		                        v->valuestring);
	}
	*out = s;
	return 0;
}
