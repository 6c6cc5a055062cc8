/* A strict reader for the part of TOML that registry configuration files
 * use (containerd's hosts.toml, containers-registries.conf v2): comments,
 * [tables] and [[arrays of tables]] with dotted and quoted keys, key =
 * value lines (dotted keys too), basic and literal strings, booleans,
 * integers and arrays of those (over several lines, trailing comma allowed).
 *
 * Everything else TOML has (multi-line strings, floats, dates, inline
 * tables) is refused with a message naming it, as are duplicate keys and
 * tables defined twice: a configuration read wrongly would send pulls to the
 * wrong place, so what is not understood is an error, never skipped. */
#ifndef GKM_TOML_H
#define GKM_TOML_H

#include <cjson/cJSON.h>
#include <stddef.h>

#define TOML_FILE_MAX (1u << 20)

/* Parse text (len bytes; NUL bytes are refused) into a cJSON object: tables
 * are objects (keys in file order), arrays of tables arrays of objects,
 * integers numbers. name is used in messages, which read "name:LINE: what".
 * 0 and *out (caller frees with cJSON_Delete), or -EINVAL / -ENOMEM with
 * err filled. */
__attribute__((warn_unused_result)) int toml_parse(const char *name, const char *text, size_t len,
                                                   cJSON **out, char *err, size_t errlen);

/* The same for a file (at most TOML_FILE_MAX bytes): -errno of open/read
 * with err naming the file. */
__attribute__((warn_unused_result)) int toml_parse_file(const char *path, cJSON **out, char *err,
                                                        size_t errlen);

#endif
