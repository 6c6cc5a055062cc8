/* YAML <-> JSON for Kubernetes objects (libyaml). Plain scalars follow the
 * YAML 1.2 core schema (null, booleans, integers, floats); quoted scalars are
 * strings. Anchors resolve; keys must be scalars; duplicate keys are refused. */
#ifndef GKM_YAMLJSON_H
#define GKM_YAMLJSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* Parse every document of a YAML stream (JSON is YAML too) into a JSON
 * array, empty documents skipped. Caller frees *out with cJSON_Delete().
 * On failure err gives line, column and problem. 0 or -errno. */
__attribute__((warn_unused_result)) int yamljson_parse(const char *text, size_t len, cJSON **out,
                                                       char *err, size_t errlen);

/* Block-style YAML for one value, in the key order of the object (as
 * kubectl prints). Caller frees with free(); NULL on ENOMEM. */
char *yamljson_emit(const cJSON *v);

#endif
