#include "yamljson.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define MAX_DEPTH 64
#define MAX_DOCS 1024

static bool is_plain_null(const char *s)
{
	return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	       !strcmp(s, "NULL");
}

/* YAML 1.2 core schema for plain scalars: null, bool, int, float, else string. */
static cJSON *plain_scalar(const char *s)
{
	if (is_plain_null(s))
		return cJSON_CreateNull();
	if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
		return cJSON_CreateTrue();
	if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
		return cJSON_CreateFalse();
	char *end = NULL;
	errno = 0;
	if ((s[0] >= '0' && s[0] <= '9') ||
	    ((s[0] == '-' || s[0] == '+') && s[1] >= '0' && s[1] <= '9')) {
		long long v = strtoll(s, &end, 10);
		if (!*end && !errno && strlen(s) < 16)
			return cJSON_CreateNumber((double)v);
		double d = strtod(s, &end);
		if (!*end && isfinite(d) && strlen(s) < 32)
			return cJSON_CreateNumber(d);
	}
	return cJSON_CreateString(s);
}

static cJSON *node_json(yaml_document_t *doc, yaml_node_t *n, int depth, char *err, size_t errlen)
{
	if (!n)
		return cJSON_CreateNull();
	if (depth > MAX_DEPTH) {
		snprintf(err, errlen, "line %zu: nesting deeper than %d levels",
		         n->start_mark.line + 1, MAX_DEPTH);
		return NULL;
	}
	switch (n->type) {
	case YAML_SCALAR_NODE: {
		const char *v = (const char *)n->data.scalar.value;
		if (strlen(v) != n->data.scalar.length) {
			snprintf(err, errlen, "line %zu: NUL byte in a scalar",
			         n->start_mark.line + 1);
			return NULL;
		}
		if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
			return plain_scalar(v);
		return cJSON_CreateString(v);
	}
	case YAML_SEQUENCE_NODE: {
		cJSON *a = cJSON_CreateArray();
		for (yaml_node_item_t *it = n->data.sequence.items.start;
		     a && it < n->data.sequence.items.top; it++) {
			cJSON *c = node_json(doc, yaml_document_get_node(doc, *it), depth + 1, err,
			                     errlen);
			if (!c) {
				cJSON_Delete(a);
				return NULL;
			}
			cJSON_AddItemToArray(a, c);
		}
		return a;
	}
	case YAML_MAPPING_NODE: {
		cJSON *o = cJSON_CreateObject();
		for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
		     o && p < n->data.mapping.pairs.top; p++) {
			yaml_node_t *k = yaml_document_get_node(doc, p->key);
			if (!k || k->type != YAML_SCALAR_NODE) {
				snprintf(err, errlen, "line %zu: mapping keys must be scalars",
				         n->start_mark.line + 1);
				cJSON_Delete(o);
				return NULL;
			}
			const char *key = (const char *)k->data.scalar.value;
			if (cJSON_GetObjectItemCaseSensitive(o, key)) {
				snprintf(err, errlen, "line %zu: duplicate key '%s'",
				         k->start_mark.line + 1, key);
				cJSON_Delete(o);
				return NULL;
			}
			cJSON *v = node_json(doc, yaml_document_get_node(doc, p->value), depth + 1,
			                     err, errlen);
			if (!v) {
				cJSON_Delete(o);
				return NULL;
			}
			cJSON_AddItemToObject(o, key, v);
		}
		return o;
	}
	default:
		return cJSON_CreateNull();
	}
}

int yamljson_parse(const char *text, size_t len, cJSON **out, char *err, size_t errlen)
{
	yaml_parser_t p;
	cJSON *docs = cJSON_CreateArray();
	int rc = 0;
	if (!docs || !yaml_parser_initialize(&p)) {
		cJSON_Delete(docs);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
	for (;;) {
		yaml_document_t doc;
		if (!yaml_parser_load(&p, &doc)) {
			snprintf(err, errlen, "line %zu, column %zu: %s", p.problem_mark.line + 1,
			         p.problem_mark.column + 1, p.problem ? p.problem : "invalid YAML");
			rc = -EINVAL;
			break;
		}
		yaml_node_t *root = yaml_document_get_root_node(&doc);
		if (!root) { /* end of stream */
			yaml_document_delete(&doc);
			break;
		}
		cJSON *j = node_json(&doc, root, 0, err, errlen);
		yaml_document_delete(&doc);
		if (!j) {
			rc = -EINVAL;
			break;
		}
		if (cJSON_IsNull(j)) { /* an empty document between separators */
			cJSON_Delete(j);
			continue;
		}
		if (cJSON_GetArraySize(docs) >= MAX_DOCS) {
			cJSON_Delete(j);
			snprintf(err, errlen, "more than %d documents", MAX_DOCS);
			rc = -E2BIG;
			break;
		}
		cJSON_AddItemToArray(docs, j);
	}
	yaml_parser_delete(&p);
	if (rc != 0) {
		cJSON_Delete(docs);
		return rc;
	}
	*out = docs;
	return 0;
}

/* ---- emitting ---- */

struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->cap + n + 1) * 2;
		char *np = realloc(b->p, cap);
		if (!np) {
			b->oom = true;
			return;
		}
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void puts_(struct sbuf *b, const char *s)
{
	put(b, s, strlen(s));
}

static void indent(struct sbuf *b, int n)
{
	for (int i = 0; i < n; i++)
		put(b, "  ", 2);
}

/* A string needs quotes when a plain scalar would read back as something
 * else (a number, bool, null) or contains YAML syntax. */
static bool needs_quotes(const char *s)
{
	if (!*s)
		return true;
	cJSON *probe = plain_scalar(s);
	bool other = !cJSON_IsString(probe);
	cJSON_Delete(probe);
	if (other)
		return true;
	if (strchr("-?:,[]{}#&*!|>'\"%@` ", s[0]))
		return true;
	for (const char *c = s; *c; c++) {
		if ((unsigned char)*c < 0x20 || (*c == ':' && (c[1] == ' ' || !c[1])) ||
		    (*c == ' ' && c[1] == '#'))
			return true;
	}
	return s[strlen(s) - 1] == ' ';
}

static void scalar(struct sbuf *b, const cJSON *v)
{
	char num[64];
	if (cJSON_IsString(v)) {
		if (!needs_quotes(v->valuestring)) {
			puts_(b, v->valuestring);
			return;
		}
		/* a JSON string is a valid YAML double-quoted scalar */
		char *q = cJSON_PrintUnformatted(v);
		if (q)
			puts_(b, q);
		free(q);
	} else if (cJSON_IsNumber(v)) {
		double d = v->valuedouble;
		if (d == floor(d) && fabs(d) < 1e15)
			snprintf(num, sizeof(num), "%.0f", d);
		else
			snprintf(num, sizeof(num), "%.17g", d);
		puts_(b, num);
	} else if (cJSON_IsBool(v)) {
		puts_(b, cJSON_IsTrue(v) ? "true" : "false");
	} else {
		puts_(b, "null");
	}
}

static bool is_empty_container(const cJSON *v)
{
	return (cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child;
}

static void emit(struct sbuf *b, const cJSON *v, int depth);

static void emit_value_after_key(struct sbuf *b, const cJSON *v, int depth)
{
	if (is_empty_container(v)) {
		puts_(b, cJSON_IsArray(v) ? " []\n" : " {}\n");
	} else if (cJSON_IsObject(v)) {
		puts_(b, "\n");
		emit(b, v, depth + 1);
	} else if (cJSON_IsArray(v)) {
		puts_(b, "\n");
		emit(b, v, depth);
	} else {
		puts_(b, " ");
		scalar(b, v);
		puts_(b, "\n");
	}
}

static void emit_key(struct sbuf *b, const char *k)
{
	cJSON tmp = {.type = cJSON_String, .valuestring = (char *)k};
	scalar(b, &tmp);
	puts_(b, ":");
}

static void emit(struct sbuf *b, const cJSON *v, int depth)
{
	const cJSON *c;
	if (cJSON_IsObject(v)) {
		cJSON_ArrayForEach(c, v)
		{
			indent(b, depth);
			emit_key(b, c->string);
			emit_value_after_key(b, c, depth);
		}
	} else if (cJSON_IsArray(v)) {
		cJSON_ArrayForEach(c, v)
		{
			indent(b, depth);
			puts_(b, "- ");
			if (cJSON_IsObject(c) && c->child) {
				/* first key on the dash line, the rest aligned under it */
				const cJSON *k = c->child;
				emit_key(b, k->string);
				emit_value_after_key(b, k, depth + 1);
				for (k = k->next; k; k = k->next) {
					indent(b, depth + 1);
					emit_key(b, k->string);
					emit_value_after_key(b, k, depth + 1);
				}
			} else if (cJSON_IsArray(c) && c->child) {
				puts_(b, "\n");
				emit(b, c, depth + 1);
			} else if (is_empty_container(c)) {
				puts_(b, cJSON_IsArray(c) ? "[]\n" : "{}\n");
			} else {
				scalar(b, c);
				puts_(b, "\n");
			}
		}
	} else {
		indent(b, depth);
		scalar(b, v);
		puts_(b, "\n");
	}
}

char *yamljson_emit(const cJSON *v)
{
	struct sbuf b = {0};
	if (is_empty_container(v))
		puts_(&b, cJSON_IsArray(v) ? "[]\n" : "{}\n");
	else
		emit(&b, v, 0);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p ? b.p : strdup("");
}
