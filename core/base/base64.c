#include "base64.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int digit(unsigned char c, bool url)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == (url ? '-' : '+'))
		return 62;
	if (c == (url ? '_' : '/'))
		return 63;
	return -1;
}

static bool line_break(unsigned char c)
{
	return c == '\n' || c == '\r';
}

static size_t skip_breaks(const unsigned char *s, size_t n, size_t i)
{
	while (i < n && line_break(s[i]))
		i++;
	return i;
}

/* One group of up to four digits from s[*i], line breaks skipped. Writes
 * its bytes to o (count in *got; 0 at the end of the input). -EINVAL with
 * *bad the offset of the fault. */
static int group(const unsigned char *s, size_t n, size_t *i, bool url, bool padded,
                 unsigned char *o, size_t *got, size_t *bad)
{
	uint32_t acc = 0;
	int j = 0;
	while (j < 4) {
		if (*i == n) {
			if (j == 0) {
				*got = 0;
				return 0;
			}
			if (j == 1 || padded) {
				*bad =
				    n - (size_t)j; /* where the short group began, breaks aside */
				return -EINVAL;
			}
			break;
		}
		unsigned char c = s[(*i)++];
		int v = digit(c, url);
		if (v >= 0) {
			acc |= (uint32_t)v << (18 - 6 * j);
			j++;
			continue;
		}
		if (line_break(c))
			continue;
		if (!padded || c != '=' || j < 2) {
			*bad = *i - 1;
			return -EINVAL;
		}
		if (j == 2) { /* a second '=' must follow, line breaks aside */
			*i = skip_breaks(s, n, *i);
			if (*i == n) {
				*bad = n;
				return -EINVAL;
			}
			if (s[*i] != '=') {
				*bad = *i - 1;
				return -EINVAL;
			}
			(*i)++;
		}
		*i = skip_breaks(s, n, *i);
		if (*i < n) { /* nothing may follow the padding */
			*bad = *i;
			return -EINVAL;
		}
		break;
	}
	o[0] = (unsigned char)(acc >> 16);
	o[1] = (unsigned char)(acc >> 8);
	o[2] = (unsigned char)acc;
	*got = (size_t)j - 1;
	return 0;
}

int base64_decode(const char *in, size_t len, enum base64_dialect d, unsigned char **out,
                  size_t *out_len, size_t *bad_at)
{
	const unsigned char *s = (const unsigned char *)in;
	bool url = false, padded = true;
	if (d == BASE64_PROTOJSON) {
		url = memchr(s, '-', len) != NULL || memchr(s, '_', len) != NULL;
		padded = len % 4 == 0;
	} else if (d != BASE64_STD) {
		return -EINVAL;
	}
	unsigned char *o = malloc(len / 4 * 3 + 4);
	if (o == NULL)
		return -ENOMEM;
	size_t n = 0, i = 0, got = 0, bad = 0;
	while (i < len) {
		/* the group writes 3 bytes whatever it holds: room is len/4*3 + 4 */
		if (group(s, len, &i, url, padded, o + n, &got, &bad) < 0) {
			free(o);
			if (bad_at)
				*bad_at = bad;
			return -EINVAL;
		}
		n += got;
	}
	o[n] = '\0';
	*out = o;
	*out_len = n;
	return 0;
}

int base64_encode(const void *in, size_t len, char **out)
{
	if (len > (size_t)INT32_MAX / 4 * 3)
		return -EOVERFLOW;
	char *o = malloc(4 * ((len + 2) / 3) + 1);
	if (o == NULL)
		return -ENOMEM;
	EVP_EncodeBlock((unsigned char *)o, in, (int)len);
	*out = o;
	return 0;
}
