#include "toml.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"

#define KEY_MAX 1024
#define DEPTH_MAX 16
#define CLOSED_MAX 4096

struct parser {
	const char *name;
	const char *p, *end;
	unsigned line;
	char *err;
	size_t errlen;
	int rc;
	cJSON *root, *current; /* the table key = value lines go into */
	/* tables defined by a header, and arrays written as values: neither may
	 * be defined again or extended with [[...]] */
	const cJSON *closed[CLOSED_MAX];
	size_t nclosed;
};

static int fail(struct parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct parser *ps, const char *fmt, ...)
{
	if (ps->rc)
		return ps->rc;
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	snprintf(ps->err, ps->errlen, "%s:%u: %s", ps->name, ps->line, what);
	ps->rc = -EINVAL;
	return ps->rc;
}

static int oom(struct parser *ps)
{
	snprintf(ps->err, ps->errlen, "%s: out of memory", ps->name);
	ps->rc = -ENOMEM;
	return ps->rc;
}

static bool is_closed(const struct parser *ps, const cJSON *n)
{
	for (size_t i = 0; i < ps->nclosed; i++)
		if (ps->closed[i] == n)
			return true;
	return false;
}

static int close_node(struct parser *ps, const cJSON *n)
{
	if (ps->nclosed >= CLOSED_MAX)
		return fail(ps, "too many tables");
	ps->closed[ps->nclosed++] = n;
	return 0;
}

static void skip_blanks(struct parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t'))
		ps->p++;
}

/* Blanks, then a comment or the end of the line (or file). */
static int end_of_line(struct parser *ps)
{
	skip_blanks(ps);
	if (ps->p < ps->end && *ps->p == '#')
		while (ps->p < ps->end && *ps->p != '\n')
			ps->p++;
	if (ps->p < ps->end && *ps->p == '\r')
		ps->p++;
	if (ps->p >= ps->end)
		return 0;
	if (*ps->p != '\n')
		return fail(ps, "unexpected '%c' after the value", *ps->p);
	ps->p++;
	ps->line++;
	return 0;
}

/* Inside arrays: blanks, comments and line breaks. */
static void skip_space(struct parser *ps)
{
	for (;;) {
		skip_blanks(ps);
		if (ps->p < ps->end && *ps->p == '#')
			while (ps->p < ps->end && *ps->p != '\n')
				ps->p++;
		if (ps->p < ps->end && (*ps->p == '\n' || *ps->p == '\r')) {
			if (*ps->p == '\n')
				ps->line++;
			ps->p++;
			continue;
		}
		return;
	}
}

static int put_utf8(struct parser *ps, char *out, size_t cap, size_t *n, uint32_t c)
{
	unsigned char b[4];
	size_t k;
	if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		return fail(ps, "\\u escape names no Unicode scalar value");
	if (c < 0x80) {
		b[0] = (unsigned char)c;
		k = 1;
	} else if (c < 0x800) {
		b[0] = (unsigned char)(0xC0 | (c >> 6));
		b[1] = (unsigned char)(0x80 | (c & 0x3F));
		k = 2;
	} else if (c < 0x10000) {
		b[0] = (unsigned char)(0xE0 | (c >> 12));
		b[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
		b[2] = (unsigned char)(0x80 | (c & 0x3F));
		k = 3;
	} else {
		b[0] = (unsigned char)(0xF0 | (c >> 18));
		b[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
		b[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
		b[3] = (unsigned char)(0x80 | (c & 0x3F));
		k = 4;
	}
	if (*n + k >= cap)
		return fail(ps, "string longer than %zu bytes", cap - 1);
	memcpy(out + *n, b, k);
	*n += k;
	return 0;
}

/* A basic ("...") or literal ('...') string on one line into out. */
static int string(struct parser *ps, char *out, size_t cap)
{
	char q = *ps->p++;
	size_t n = 0;
	if (ps->end - ps->p >= 2 && ps->p[0] == q && ps->p[1] == q)
		return fail(ps, "multi-line strings are not supported here");
	for (;;) {
		if (ps->p >= ps->end || *ps->p == '\n')
			return fail(ps, "string not closed on its line");
		char c = *ps->p++;
		if (c == q)
			break;
		if ((unsigned char)c < 0x20 && c != '\t')
			return fail(ps, "control character in a string");
		if (c == '\\' && q == '"') {
			if (ps->p >= ps->end)
				return fail(ps, "string not closed on its line");
			char e = *ps->p++;
			const char *map = "b\bt\tn\nf\fr\r\"\"\\\\";
			const char *m = strchr(map, e);
			if (m && ((m - map) % 2) == 0) {
				c = m[1];
			} else if (e == 'u' || e == 'U') {
				int digits = e == 'u' ? 4 : 8;
				uint32_t v = 0;
				for (int i = 0; i < digits; i++) {
					if (ps->p >= ps->end)
						return fail(ps, "short \\%c escape", e);
					char h = *ps->p++;
					int d = h >= '0' && h <= '9'   ? h - '0'
					        : h >= 'a' && h <= 'f' ? h - 'a' + 10
					        : h >= 'A' && h <= 'F' ? h - 'A' + 10
					                               : -1;
					if (d < 0)
						return fail(ps, "bad hex digit '%c' in \\%c escape",
						            h, e);
					v = v * 16 + (uint32_t)d;
				}
				if (put_utf8(ps, out, cap, &n, v))
					return ps->rc;
				continue;
			} else {
				return fail(ps, "unknown escape '\\%c'", e);
			}
		}
		if (n + 1 >= cap)
			return fail(ps, "string longer than %zu bytes", cap - 1);
		out[n++] = c;
	}
	out[n] = '\0';
	return 0;
}

static bool bare_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-';
}

/* One key part (bare or quoted). */
static int key_part(struct parser *ps, char *out, size_t cap)
{
	skip_blanks(ps);
	if (ps->p < ps->end && (*ps->p == '"' || *ps->p == '\''))
		return string(ps, out, cap);
	size_t n = 0;
	while (ps->p < ps->end && bare_char(*ps->p)) {
		if (n + 1 >= cap)
			return fail(ps, "key longer than %zu bytes", cap - 1);
		out[n++] = *ps->p++;
	}
	if (n == 0) {
		if (ps->p < ps->end && *ps->p != '\n')
			return fail(ps, "expected a key, found '%c'", *ps->p);
		return fail(ps, "expected a key");
	}
	out[n] = '\0';
	return 0;
}

/* A dotted key: parts[0..*n), each KEY_MAX bytes. */
static int dotted_key(struct parser *ps, char parts[][KEY_MAX], size_t *n)
{
	*n = 0;
	for (;;) {
		if (*n >= DEPTH_MAX)
			return fail(ps, "key nested deeper than %d", DEPTH_MAX);
		if (key_part(ps, parts[*n], KEY_MAX))
			return ps->rc;
		(*n)++;
		skip_blanks(ps);
		if (ps->p < ps->end && *ps->p == '.') {
			ps->p++;
			continue;
		}
		return 0;
	}
}

static int value(struct parser *ps, cJSON **out, unsigned depth);

static int array(struct parser *ps, cJSON **out, unsigned depth)
{
	ps->p++; /* '[' */
	unsigned opened = ps->line;
	cJSON *a = cJSON_CreateArray();
	if (!a)
		return oom(ps);
	for (;;) {
		skip_space(ps);
		if (ps->p >= ps->end) {
			ps->line = opened;
			fail(ps, "array not closed");
			break;
		}
		if (*ps->p == ']') {
			ps->p++;
			*out = a;
			return 0;
		}
		cJSON *v = NULL;
		if (value(ps, &v, depth + 1))
			break;
		cJSON_AddItemToArray(a, v);
		skip_space(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			continue;
		}
		if (ps->p < ps->end && *ps->p == ']')
			continue;
		if (ps->p >= ps->end) {
			ps->line = opened;
			fail(ps, "array not closed");
		} else
			fail(ps, "expected ',' or ']' in an array");
		break;
	}
	cJSON_Delete(a);
	return ps->rc;
}

static int value(struct parser *ps, cJSON **out, unsigned depth)
{
	char buf[4096];
	skip_blanks(ps);
	if (depth > DEPTH_MAX)
		return fail(ps, "arrays nested deeper than %d", DEPTH_MAX);
	if (ps->p >= ps->end || *ps->p == '\n' || *ps->p == '#')
		return fail(ps, "expected a value");
	char c = *ps->p;
	if (c == '"' || c == '\'') {
		if (string(ps, buf, sizeof(buf)))
			return ps->rc;
		return (*out = cJSON_CreateString(buf)) ? 0 : oom(ps);
	}
	if (c == '[')
		return array(ps, out, depth);
	if (c == '{')
		return fail(ps, "inline tables are not supported here: write a [table]");
	const char *s = ps->p;
	while (ps->p < ps->end &&
	       (bare_char(*ps->p) || *ps->p == '+' || *ps->p == '.' || *ps->p == ':'))
		ps->p++;
	size_t n = (size_t)(ps->p - s);
	if (n == 4 && !memcmp(s, "true", 4))
		return (*out = cJSON_CreateTrue()) ? 0 : oom(ps);
	if (n == 5 && !memcmp(s, "false", 5))
		return (*out = cJSON_CreateFalse()) ? 0 : oom(ps);
	/* decimal integers: [+-]digits, underscores between digits */
	size_t i = (n && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
	bool ok = i < n && s[i] >= '0' && s[i] <= '9' && !(s[i] == '0' && i + 1 < n);
	long long v = 0;
	for (; ok && i < n; i++) {
		if (s[i] == '_' && i + 1 < n && s[i - 1] != '_' && s[i + 1] != '_' &&
		    (s[i - 1] >= '0' && s[i - 1] <= '9'))
			continue;
		if (s[i] < '0' || s[i] > '9' || v > (1LL << 53) / 10) {
			ok = false;
			break;
		}
		v = v * 10 + (s[i] - '0');
	}
	if (ok)
		return (*out = cJSON_CreateNumber((double)(s[0] == '-' ? -v : v))) ? 0 : oom(ps);
	if (n == 0)
		return fail(ps, "unexpected '%c' where a value belongs", c);
	return fail(ps,
	            "'%.*s' is not a value this reader accepts (strings, true/false, integers "
	            "and arrays of them)",
	            (int)(n > 64 ? 64 : n), s);
}

/* The table parts[0..n) names, from root, creating missing ones. The last
 * element of an array of tables stands for the array. */
static int walk(struct parser *ps, char parts[][KEY_MAX], size_t n, cJSON **out)
{
	cJSON *t = ps->root;
	for (size_t i = 0; i < n; i++) {
		cJSON *c = cJSON_GetObjectItemCaseSensitive(t, parts[i]);
		if (!c) {
			if (!(c = cJSON_AddObjectToObject(t, parts[i])))
				return oom(ps);
		} else if (cJSON_IsArray(c) && !is_closed(ps, c)) {
			c = cJSON_GetArrayItem(c, cJSON_GetArraySize(c) - 1);
		} else if (!cJSON_IsObject(c)) {
			return fail(ps, "'%s' is a value, not a table", parts[i]);
		}
		t = c;
	}
	*out = t;
	return 0;
}

static int header(struct parser *ps)
{
	char parts[DEPTH_MAX][KEY_MAX];
	size_t n;
	bool aot = ps->end - ps->p >= 2 && ps->p[1] == '[';
	ps->p += aot ? 2 : 1;
	if (dotted_key(ps, parts, &n))
		return ps->rc;
	skip_blanks(ps);
	if (ps->p >= ps->end || *ps->p != ']' || (aot && (ps->end - ps->p < 2 || ps->p[1] != ']')))
		return fail(ps, "expected '%s' to close the table header", aot ? "]]" : "]");
	ps->p += aot ? 2 : 1;
	cJSON *parent = NULL;
	if (walk(ps, parts, n - 1, &parent))
		return ps->rc;
	const char *last = parts[n - 1];
	cJSON *c = cJSON_GetObjectItemCaseSensitive(parent, last);
	if (aot) {
		if (!c && !(c = cJSON_AddArrayToObject(parent, last)))
			return oom(ps);
		if (!cJSON_IsArray(c) || is_closed(ps, c))
			return fail(ps, "[[%s]]: '%s' is already defined as something else", last,
			            last);
		cJSON *t = cJSON_CreateObject();
		if (!t)
			return oom(ps);
		cJSON_AddItemToArray(c, t);
		ps->current = t;
	} else {
		if (!c && !(c = cJSON_AddObjectToObject(parent, last)))
			return oom(ps);
		if (!cJSON_IsObject(c) || is_closed(ps, c))
			return fail(ps, "table [%s] is defined twice", last);
		if (close_node(ps, c))
			return ps->rc;
		ps->current = c;
	}
	return end_of_line(ps);
}

static int keyval(struct parser *ps)
{
	char parts[DEPTH_MAX][KEY_MAX];
	size_t n;
	if (dotted_key(ps, parts, &n))
		return ps->rc;
	skip_blanks(ps);
	if (ps->p >= ps->end || *ps->p != '=')
		return fail(ps, "expected '=' after the key '%s'", parts[n - 1]);
	ps->p++;
	cJSON *t = ps->current;
	for (size_t i = 0; i + 1 < n; i++) {
		cJSON *c = cJSON_GetObjectItemCaseSensitive(t, parts[i]);
		if (!c && !(c = cJSON_AddObjectToObject(t, parts[i])))
			return oom(ps);
		if (!cJSON_IsObject(c))
			return fail(ps, "'%s' is a value, not a table", parts[i]);
		t = c;
	}
	if (cJSON_GetObjectItemCaseSensitive(t, parts[n - 1]))
		return fail(ps, "key '%s' is defined twice", parts[n - 1]);
	cJSON *v = NULL;
	if (value(ps, &v, 0))
		return ps->rc;
	cJSON_AddItemToObject(t, parts[n - 1], v);
	if (cJSON_IsArray(v) && close_node(ps, v))
		return ps->rc;
	return end_of_line(ps);
}

int toml_parse(const char *name, const char *text, size_t len, cJSON **out, char *err,
               size_t errlen)
{
	struct parser *ps = calloc(1, sizeof(*ps));
	if (!ps) {
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	ps->name = name;
	ps->p = text;
	ps->end = text + len;
	ps->line = 1;
	ps->err = err;
	ps->errlen = errlen;
	if (memchr(text, '\0', len)) {
		snprintf(err, errlen, "%s: contains a NUL byte (not a text file)", name);
		free(ps);
		return -EINVAL;
	}
	if (!(ps->root = ps->current = cJSON_CreateObject())) {
		free(ps);
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	while (ps->rc == 0) {
		skip_blanks(ps);
		if (ps->p >= ps->end)
			break;
		char c = *ps->p;
		if (c == '#' || c == '\n' || c == '\r')
			end_of_line(ps);
		else if (c == '[')
			header(ps);
		else
			keyval(ps);
	}
	int rc = ps->rc;
	if (rc)
		cJSON_Delete(ps->root);
	else
		*out = ps->root;
	free(ps);
	return rc;
}

int toml_parse_file(const char *path, cJSON **out, char *err, size_t errlen)
{
	char *buf = NULL;
	size_t len = 0;
	int rc = fsutil_read_file(path, TOML_FILE_MAX, &buf, &len);
	if (rc) {
		snprintf(err, errlen, "%s: %s", path,
		         rc == -EFBIG ? "larger than 1 MiB" : strerror(-rc));
		return rc;
	}
	rc = toml_parse(path, buf, len, out, err, errlen);
	free(buf);
	return rc;
}
