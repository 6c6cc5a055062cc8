#include "textfmt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void rfc3339_format(int64_t t, char *buf, size_t cap)
{
	time_t tt = (time_t)t;
	struct tm tm;
	if (cap == 0)
		return;
	if (!gmtime_r(&tt, &tm) || strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		buf[0] = '\0';
}

void rfc3339_now(char *buf, size_t cap)
{
	rfc3339_format((int64_t)time(NULL), buf, cap);
}

static int two(const char *s)
{
	if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9')
		return -1;
	return (s[0] - '0') * 10 + (s[1] - '0');
}

int rfc3339_parse(const char *s, int64_t *out)
{
	struct tm tm;
	memset(&tm, 0, sizeof(tm));
	const char *p = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	if (!p)
		return -EINVAL;
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++)
			;
	int64_t off = 0;
	if (*p == 'Z' || *p == 'z') {
		p++;
	} else if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':') {
		int h = two(p + 1), m = two(p + 4);
		if (h < 0 || m < 0)
			return -EINVAL;
		off = (*p == '+' ? 1 : -1) * (int64_t)(h * 3600 + m * 60);
		p += 6;
	} else {
		return -EINVAL;
	}
	if (*p)
		return -EINVAL;
	time_t t = timegm(&tm);
	if (t == (time_t)-1)
		return -EINVAL;
	*out = (int64_t)t - off;
	return 0;
}

void hex_encode(const unsigned char *b, size_t n, char *out)
{
	static const char h[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = h[b[i] >> 4];
		out[2 * i + 1] = h[b[i] & 15];
	}
	out[2 * n] = '\0';
}

int quantity_parse_bytes(const char *s, uint64_t *out)
{
	static const struct {
		const char *suffix;
		uint64_t mul;
	} units[] = {{"Ki", 1ull << 10},   {"Mi", 1ull << 20},      {"Gi", 1ull << 30},
	             {"Ti", 1ull << 40},   {"k", 1000ull},          {"M", 1000000ull},
	             {"G", 1000000000ull}, {"T", 1000000000000ull}, {"", 1}};
	char *end = NULL;
	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(end, units[i].suffix) != 0)
			continue;
		if (v > UINT64_MAX / units[i].mul)
			return -EINVAL;
		*out = v * units[i].mul;
		return 0;
	}
	return -EINVAL;
}
