/* Reading JSON documents from files given on the command line. */
#ifndef GKM_JSONFILE_H
#define GKM_JSONFILE_H

#include <cjson/cJSON.h>
#include <stddef.h>

#define JSONFILE_MAX (16u << 20)

/* path "-" reads stdin. On success *out is the parsed document (caller frees
 * with cJSON_Delete). On failure err names the file and the problem, with the
 * line and column of a syntax error. 0 or -errno. */
__attribute__((warn_unused_result)) int jsonfile_read(const char *path, cJSON **out, char *err,
                                                      size_t errlen);

/* Parse a buffer; name is used in messages. Same contract as jsonfile_read. */
__attribute__((warn_unused_result)) int jsonfile_parse(const char *name, const char *buf,
                                                       size_t len, cJSON **out, char *err,
                                                       size_t errlen);

#endif
