/* base64 as Go reads it: the edge cases by hand, then every short input over
 * an alphabet of digits, padding, line breaks, a space and the other
 * alphabet's digits (and random longer ones) compared with Go's
 * encoding/base64 and protobuf's JSON mapping themselves
 * ($BUILD/spec/gkm-base64-go, built from spec/base64go). */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base64.h"
#include "tarbuild.h"

/* Decode s (length n) and check the outcome: want NULL means refused at
 * byte bad (SIZE_MAX: any offset), else the decoded bytes. */
static void expect(enum base64_dialect d, const char *s, size_t n, const char *want, size_t bad)
{
	unsigned char *o = NULL;
	size_t len = 0, at = SIZE_MAX;
	int rc = base64_decode(s, n, d, &o, &len, &at);
	if (want == NULL) {
		if (rc != -EINVAL)
			fail_msg("dialect %d: '%.*s' decoded (%d), wanted a refusal", d, (int)n, s,
			         rc);
		if (bad != SIZE_MAX && at != bad)
			fail_msg("dialect %d: '%.*s' refused at byte %zu, wanted %zu", d, (int)n, s,
			         at, bad);
		return;
	}
	if (rc != 0)
		fail_msg("dialect %d: '%.*s' refused at byte %zu, wanted '%s'", d, (int)n, s, at,
		         want);
	assert_int_equal(len, strlen(want));
	assert_memory_equal(o, want, len);
	assert_int_equal(o[len], '\0');
	free(o);
}

#define OK(d, s, want) expect(d, s, sizeof(s) - 1, want, 0)
#define BAD(d, s, at) expect(d, s, sizeof(s) - 1, NULL, at)

static void test_rfc4648_vectors(void **state)
{
	(void)state;
	const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
	const char *b64[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
		char *e = NULL;
		assert_int_equal(base64_encode(in[i], strlen(in[i]), &e), 0);
		assert_string_equal(e, b64[i]);
		free(e);
		expect(BASE64_STD, b64[i], strlen(b64[i]), in[i], 0);
		expect(BASE64_PROTOJSON, b64[i], strlen(b64[i]), in[i], 0);
	}
}

static void test_line_breaks(void **state)
{
	(void)state;
	/* anywhere: between groups, inside one, inside the padding, around it */
	OK(BASE64_STD, "Zm9v\nYmFy", "foobar");
	OK(BASE64_STD, "Zm9v\r\nYmFy\r\n", "foobar");
	OK(BASE64_STD, "Z\nm\r9\nv", "foo");
	OK(BASE64_STD, "\n\nZg==", "f");
	OK(BASE64_STD, "Zg=\n=", "f");
	OK(BASE64_STD, "Zg=\r\n=\n", "f");
	OK(BASE64_STD, "Zm8=\r\n\r\n", "fo");
	OK(BASE64_STD, "\n", "");
	OK(BASE64_STD, "\r\n\r\n", "");
	/* and only line breaks: every other white space is refused where it stands */
	BAD(BASE64_STD, "Zm9v YmFy", 4);
	BAD(BASE64_STD, "Zm9v\tYmFy", 4);
	BAD(BASE64_STD, "Zm9vYmFy ", 8);
	BAD(BASE64_STD, " Zm9v", 0);
	BAD(BASE64_STD, "Zm9v\vYmFy", 4);
	BAD(BASE64_STD, "Zm9v\fYmFy", 4);
	BAD(BASE64_STD, "Zg==\n ", 5);
}

static void test_padding(void **state)
{
	(void)state;
	/* required, and only where it belongs */
	BAD(BASE64_STD, "Zg", 0);
	BAD(BASE64_STD, "Zm8", 0);
	BAD(BASE64_STD, "Zm9vZg", 4);
	BAD(BASE64_STD, "Zm9vZ\n", 5); /* a short last group: Go counts back its digits */
	BAD(BASE64_STD, "Zg=", 3);     /* the second '=' is missing */
	BAD(BASE64_STD, "Zg=\n", 4);
	BAD(BASE64_STD, "Zg=x", 2); /* not '=' after the first: Go names the first */
	BAD(BASE64_STD, "=", 0);
	BAD(BASE64_STD, "Z===", 1);
	BAD(BASE64_STD, "Zm9v=", 4);
	BAD(BASE64_STD, "Zm8==", 4); /* garbage after the padding */
	BAD(BASE64_STD, "Zg==Zg==", 4);
	BAD(BASE64_STD, "Zg==x", 4);
	BAD(BASE64_STD, "Z", 0);
	/* unused low bits are ignored, as Go's (non-strict) StdEncoding does */
	OK(BASE64_STD, "Zh==", "f");
	OK(BASE64_STD, "Zm9=", "fo");
}

static void test_alphabet(void **state)
{
	(void)state;
	OK(BASE64_STD, "+/+/", "\xfb\xff\xbf");
	BAD(BASE64_STD, "-_-_", 0);
	BAD(BASE64_STD, "Zm9v!", 4);
	BAD(BASE64_STD, "Zm\xc3\xa9v", 2);
	expect(BASE64_STD, "Zm\0v", 4, NULL, 2);
	/* protobuf JSON: the URL-safe alphabet as soon as '-' or '_' appears */
	OK(BASE64_PROTOJSON, "-_-_", "\xfb\xff\xbf");
	OK(BASE64_PROTOJSON, "+/+/", "\xfb\xff\xbf");
	BAD(BASE64_PROTOJSON, "+/-_", 0);
}

static void test_protojson_padding(void **state)
{
	(void)state;
	/* padding required when the length (line breaks counted) is a multiple
	 * of 4, refused otherwise */
	OK(BASE64_PROTOJSON, "Zg", "f");
	OK(BASE64_PROTOJSON, "Zm8", "fo");
	OK(BASE64_PROTOJSON, "Zg==", "f");
	BAD(BASE64_PROTOJSON, "Zg=", SIZE_MAX);
	BAD(BASE64_PROTOJSON, "Zg==\n", SIZE_MAX);
	OK(BASE64_PROTOJSON, "Zg\n", "f");
	OK(BASE64_PROTOJSON, "Zm9v\nYmFy", "foobar");
	OK(BASE64_PROTOJSON, "Zm9\nv\nYmFy", "foobar");
	BAD(BASE64_PROTOJSON, "Z", SIZE_MAX);
	BAD(BASE64_PROTOJSON, "Zm9v Ym", SIZE_MAX);
}

static void test_bad_dialect(void **state)
{
	(void)state;
	unsigned char *o = NULL;
	size_t n = 0;
	assert_int_equal(base64_decode("Zg==", 4, (enum base64_dialect)0, &o, &n, NULL), -EINVAL);
	assert_null(o);
}

/* ---- compared with Go ---- */

static char dir[300];

static void hex_line(FILE *f, const unsigned char *s, size_t n)
{
	if (n == 0)
		fputc('-', f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%02x", s[i]);
	fputc('\n', f);
}

/* What gkm's decoder says, in the reference's words. */
static void ours(enum base64_dialect d, const unsigned char *s, size_t n, char *out, size_t cap,
                 bool offset)
{
	unsigned char *o = NULL;
	size_t len = 0, at = 0;
	if (base64_decode((const char *)s, n, d, &o, &len, &at) != 0) {
		if (offset)
			snprintf(out, cap, "err:%zu", at);
		else
			snprintf(out, cap, "err");
		return;
	}
	size_t w = (size_t)snprintf(out, cap, "ok:%s", len ? "" : "-");
	for (size_t i = 0; i < len && w + 3 < cap; i++)
		w += (size_t)snprintf(out + w, cap - w, "%02x", o[i]);
	free(o);
}

struct cases {
	unsigned char *buf; /* all inputs back to back */
	size_t *off, *len;
	size_t n, cap, used, bufcap;
};

static void add(struct cases *c, const unsigned char *s, size_t n)
{
	if (c->n == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 1024;
		c->off = realloc(c->off, c->cap * sizeof(size_t));
		c->len = realloc(c->len, c->cap * sizeof(size_t));
		assert_non_null(c->off);
		assert_non_null(c->len);
	}
	if (c->buf == NULL || c->used + n > c->bufcap) {
		c->bufcap = 2 * (c->used + n) + 4096;
		c->buf = realloc(c->buf, c->bufcap);
		assert_non_null(c->buf);
	}
	memcpy(c->buf + c->used, s, n);
	c->off[c->n] = c->used;
	c->len[c->n++] = n;
	c->used += n;
}

/* Every string up to 6 bytes over an alphabet that reaches each rule, and
 * random longer ones: wrapped text, stray bytes, padding in odd places. */
static void make_cases(struct cases *c)
{
	static const char sym[] = "AB/-=\n\r ";
	const size_t ns = sizeof(sym) - 1;
	unsigned char s[400];
	for (size_t len = 0; len <= 6; len++) {
		size_t total = 1;
		for (size_t i = 0; i < len; i++)
			total *= ns;
		for (size_t k = 0; k < total; k++) {
			size_t v = k;
			for (size_t i = 0; i < len; i++, v /= ns)
				s[i] = (unsigned char)sym[v % ns];
			add(c, s, len);
		}
	}
	static const char digits[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	static const char odd[] = "=\n\r \t-_!\0\xff";
	uint64_t x = 0x9e3779b97f4a7c15u;
	for (int k = 0; k < 20000; k++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t len = (size_t)(x % 300);
		int wrap =
		    (int)((x >> 20) % 4); /* 0: none, 1: \n at 76, 2: \r\n at 64, 3: \n at 4 */
		size_t col = wrap == 1 ? 76 : wrap == 2 ? 64 : 4, n = 0, line = 0;
		for (size_t i = 0; i < len && n + 3 < sizeof(s); i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			s[n++] = (x % 50 == 0) ? (unsigned char)odd[(x >> 8) % (sizeof(odd) - 1)]
			                       : (unsigned char)digits[(x >> 8) % 64];
			if (wrap && ++line == col) {
				if (wrap == 2)
					s[n++] = '\r';
				s[n++] = '\n';
				line = 0;
			}
		}
		/* a proper ending half the time */
		if ((x >> 40) & 1) {
			size_t digs = 0;
			for (size_t i = 0; i < n; i++)
				digs += s[i] != '\n' && s[i] != '\r';
			while (digs % 4 && n < sizeof(s))
				s[n++] = '=', digs++;
		}
		add(c, s, n);
	}
}

static void test_same_as_go(void **state)
{
	(void)state;
	char ref[PATH_MAX + 32], exe[PATH_MAX];
	ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	assert_true(el > 0);
	exe[el] = '\0';
	*strrchr(exe, '/') = '\0'; /* $BUILD/unit */
	snprintf(ref, sizeof(ref), "%s/../spec/gkm-base64-go", exe);
	if (access(ref, X_OK) != 0) {
		print_message(
		    "# skipped: %s is not built (make spec-extra builds it where "
		    "golang-1.19-go and golang-google-protobuf-dev are installed: make deps)\n",
		    ref);
		skip();
	}
	struct cases c = {0};
	make_cases(&c);
	tmpdir_make(dir, sizeof(dir), "b64");
	char in[400], out[400], cmd[PATH_MAX + 900];
	snprintf(in, sizeof(in), "%s/cases", dir);
	snprintf(out, sizeof(out), "%s/go", dir);
	FILE *f = fopen(in, "w");
	assert_non_null(f);
	for (size_t i = 0; i < c.n; i++)
		hex_line(f, c.buf + c.off[i], c.len[i]);
	assert_int_equal(fclose(f), 0);
	snprintf(cmd, sizeof(cmd), "'%s' < '%s' > '%s'", ref, in, out);
	assert_int_equal(system(cmd), 0);
	f = fopen(out, "r");
	assert_non_null(f);
	char line[2048], mine_std[1024], mine_pj[1024];
	size_t i = 0, differ = 0;
	for (; i < c.n && fgets(line, sizeof(line), f); i++) {
		char *sp = strchr(line, ' ');
		assert_non_null(sp);
		*sp = '\0';
		sp[strcspn(sp + 1, "\n") + 1] = '\0';
		const unsigned char *s = c.buf + c.off[i];
		ours(BASE64_STD, s, c.len[i], mine_std, sizeof(mine_std), true);
		ours(BASE64_PROTOJSON, s, c.len[i], mine_pj, sizeof(mine_pj), false);
		if (strcmp(line, mine_std) != 0 || strcmp(sp + 1, mine_pj) != 0) {
			if (differ++ < 10) {
				print_message("# case %zu (", i);
				for (size_t k = 0; k < c.len[i]; k++)
					print_message("%02x", s[k]);
				print_message("): Go %s %s, gkm %s %s\n", line, sp + 1, mine_std,
				              mine_pj);
			}
		}
	}
	fclose(f);
	print_message("# %zu inputs compared with Go, %zu differ\n", i, differ);
	assert_int_equal(i, c.n);
	assert_int_equal(differ, 0);
	tmpdir_remove(dir);
	free(c.buf);
	free(c.off);
	free(c.len);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_rfc4648_vectors),   cmocka_unit_test(test_line_breaks),
	    cmocka_unit_test(test_padding),           cmocka_unit_test(test_alphabet),
	    cmocka_unit_test(test_protojson_padding), cmocka_unit_test(test_bad_dialect),
	    cmocka_unit_test(test_same_as_go),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
