#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum log_level min_level = LOG_INFO;
static bool json_mode;
static void (*_Atomic writer)(const char *line, size_t len);

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_init(enum log_level min, bool json)
{
	min_level = min;
	json_mode = json;
}

int log_parse_level(const char *s, enum log_level *out)
{
	for (unsigned i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (s && strcmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

bool log_enabled(enum log_level lvl)
{
	return lvl >= min_level;
}

bool log_json(void)
{
	return json_mode;
}

void log_set_writer(void (*fn)(const char *line, size_t len))
{
	writer = fn;
}

struct buf {
	char data[4096];
	size_t len;
};

static void put(struct buf *b, const char *s, size_t n)
{
	size_t room = sizeof(b->data) - 1 - b->len;
	if (n > room)
		n = room;
	memcpy(b->data + b->len, s, n);
	b->len += n;
}

static void puts_raw(struct buf *b, const char *s)
{
	put(b, s, strlen(s));
}

/* JSON string escaping; also used for text mode values that need quoting. */
static void put_json_string(struct buf *b, const char *s)
{
	put(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			put(b, esc, 2);
		} else if (c == '\n') {
			put(b, "\\n", 2);
		} else if (c == '\t') {
			put(b, "\\t", 2);
		} else if (c < 0x20) {
			int n = snprintf(esc, sizeof(esc), "\\u%04x", c);
			put(b, esc, (size_t)n);
		} else {
			put(b, (const char *)&c, 1);
		}
	}
	put(b, "\"", 1);
}

static bool needs_quotes(const char *s)
{
	if (!*s)
		return true;
	for (; *s; s++)
		if (*s == ' ' || *s == '"' || *s == '=' || (unsigned char)*s < 0x20)
			return true;
	return false;
}

static void put_text_value(struct buf *b, const char *s)
{
	if (needs_quotes(s))
		put_json_string(b, s);
	else
		puts_raw(b, s);
}

void log_kv(enum log_level lvl, const char *msg, ...)
{
	if (lvl < min_level)
		return;
	struct buf b = {.len = 0};
	char ts[40];
	struct timespec now;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(ts + n, sizeof(ts) - n, ".%03ldZ", now.tv_nsec / 1000000);

	va_list ap;
	va_start(ap, msg);
	if (json_mode) {
		puts_raw(&b, "{\"ts\":\"");
		puts_raw(&b, ts);
		puts_raw(&b, "\",\"level\":\"");
		puts_raw(&b, level_names[lvl]);
		puts_raw(&b, "\",\"msg\":");
		put_json_string(&b, msg);
		const char *k;
		while ((k = va_arg(ap, const char *)) != NULL) {
			const char *v = va_arg(ap, const char *);
			puts_raw(&b, ",");
			put_json_string(&b, k);
			puts_raw(&b, ":");
			put_json_string(&b, v ? v : "");
		}
		puts_raw(&b, "}");
	} else {
		puts_raw(&b, ts);
		puts_raw(&b, " ");
		puts_raw(&b, level_names[lvl]);
		puts_raw(&b, " ");
		puts_raw(&b, msg);
		const char *k;
		while ((k = va_arg(ap, const char *)) != NULL) {
			const char *v = va_arg(ap, const char *);
			puts_raw(&b, " ");
			puts_raw(&b, k);
			puts_raw(&b, "=");
			put_text_value(&b, v ? v : "");
		}
	}
	va_end(ap);
	b.data[b.len++] = '\n';
	void (*fn)(const char *, size_t) = writer;
	if (fn) {
		fn(b.data, b.len);
		return;
	}
	ssize_t w = write(STDERR_FILENO, b.data, b.len);
	(void)w;
}
