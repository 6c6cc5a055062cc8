/* RFC 3339 times, quantities of bytes and hex, as every layer writes and
 * reads them. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "textfmt.h"

static void test_format(void **state)
{
	(void)state;
	char buf[RFC3339_MAX];
	rfc3339_format(0, buf, sizeof(buf));
	assert_string_equal(buf, "1970-01-01T00:00:00Z");
	rfc3339_format(1714564800, buf, sizeof(buf));
	assert_string_equal(buf, "2024-05-01T12:00:00Z");
	char small[8] = "x";
	rfc3339_format(1714564800, small, sizeof(small));
	assert_string_equal(small, "");
}

static void test_parse(void **state)
{
	(void)state;
	int64_t t = 0;
	assert_int_equal(rfc3339_parse("2024-05-01T12:00:00Z", &t), 0);
	assert_int_equal(t, 1714564800);
	assert_int_equal(rfc3339_parse("2024-05-01T12:00:00.123456Z", &t), 0);
	assert_int_equal(t, 1714564800);
	assert_int_equal(rfc3339_parse("2024-05-01T14:30:00+02:30", &t), 0);
	assert_int_equal(t, 1714564800);
	assert_int_equal(rfc3339_parse("2024-05-01T09:00:00-03:00", &t), 0);
	assert_int_equal(t, 1714564800);
	assert_int_equal(rfc3339_parse("2024-05-01T12:00:00Zjunk", &t), -EINVAL);
	assert_int_equal(rfc3339_parse("2024-05-01T12:00:00", &t), -EINVAL);
	assert_int_equal(rfc3339_parse("2024-05-01T12:00:00+2:00", &t), -EINVAL);
	assert_int_equal(rfc3339_parse("2024-05-01T12:00:00+0a:00", &t), -EINVAL);
	assert_int_equal(rfc3339_parse("yesterday", &t), -EINVAL);
	assert_int_equal(rfc3339_parse(NULL, &t), -EINVAL);
	char buf[RFC3339_MAX];
	rfc3339_format(t, buf, sizeof(buf));
	assert_int_equal(rfc3339_parse(buf, &t), 0);
	assert_int_equal(t, 1714564800);
}

static void test_hex(void **state)
{
	(void)state;
	const unsigned char b[] = {0x00, 0x0f, 0xa5, 0xff};
	char out[9];
	memset(out, 'x', sizeof(out));
	hex_encode(b, sizeof(b), out);
	assert_string_equal(out, "000fa5ff");
	hex_encode(b, 0, out);
	assert_string_equal(out, "");
}

static void test_quantity(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		uint64_t want;
	} good[] = {{"0", 0},
	            {"1000", 1000},
	            {"512Mi", 512ull << 20},
	            {"10Gi", 10ull << 30},
	            {"1G", 1000000000ull},
	            {"2Ti", 2ull << 40}};
	static const char *const bad[] = {"",      "-1",   "1.5Gi", "Gi",
	                                  "10 Gi", "10gi", "1e9",   "99999999999Ti"};
	uint64_t v;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		assert_int_equal(quantity_parse_bytes(good[i].s, &v), 0);
		assert_true(v == good[i].want);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(quantity_parse_bytes(bad[i], &v), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_format),
	    cmocka_unit_test(test_parse),
	    cmocka_unit_test(test_hex),
	    cmocka_unit_test(test_quantity),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
