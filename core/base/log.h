/* Levelled, structured logging (text or JSON lines) to stderr.
 *
 * Usage: log_info("pulled layer", "digest", d, "bytes", buf);
 * The variadic part is key/value pairs of C strings; the macros append the
 * terminating NULL. Safe to call from any thread; each record is written
 * with one write(2) so lines from threads never interleave. */
#ifndef GKM_LOG_H
#define GKM_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };

/* Configure once at start-up (before threads start). Defaults: info, text. */
void log_init(enum log_level min, bool json);

/* "debug" | "info" | "warn" | "error" -> 0, or -EINVAL (out untouched). */
__attribute__((warn_unused_result)) int log_parse_level(const char *s, enum log_level *out);

bool log_enabled(enum log_level lvl);
/* Whether records are JSON lines (--log-format json). */
bool log_json(void);

/* Route every record (one whole line, newline included) through fn instead
 * of one write(2) to stderr: a progress meter erases itself first. NULL
 * restores the default. fn may be called from any thread. */
void log_set_writer(void (*fn)(const char *line, size_t len));

/* msg, then key/value string pairs, NULL-terminated. A NULL value prints as "". */
void log_kv(enum log_level lvl, const char *msg, ...) __attribute__((sentinel));

#define log_debug(msg, ...) log_kv(LOG_DEBUG, msg, ##__VA_ARGS__, (char *)0)
#define log_info(msg, ...) log_kv(LOG_INFO, msg, ##__VA_ARGS__, (char *)0)
#define log_warn(msg, ...) log_kv(LOG_WARN, msg, ##__VA_ARGS__, (char *)0)
#define log_error(msg, ...) log_kv(LOG_ERROR, msg, ##__VA_ARGS__, (char *)0)

#endif
