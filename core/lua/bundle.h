/* A policy bundle: Lua files by name, as a directory or a ConfigMap's data
 * holds them. Files of the bundle override the built-in policies/ files of
 * the same name; the rest of the built-in bundle stays. */
#ifndef GKM_BUNDLE_H
#define GKM_BUNDLE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

struct bundle_file {
	char *name;   /* "compat.lua" (module "compat") */
	char *source; /* NUL-terminated copy */
	size_t size;
};

struct bundle {
	struct bundle_file *files; /* sorted by name */
	size_t count;
	char digest[72]; /* "sha256:<hex>" over names and contents */
};

/* The built-in policies/ files. Caller frees with bundle_free(). */
__attribute__((warn_unused_result)) int bundle_builtin(struct bundle **out);
/* Built-in files overlaid with every *.lua file of dir. err names the problem. */
__attribute__((warn_unused_result)) int bundle_from_dir(const char *dir, struct bundle **out,
                                                        char *err, size_t errlen);
/* Built-in files overlaid with a ConfigMap's data (object of name -> source);
 * keys not ending in .lua are ignored. */
__attribute__((warn_unused_result)) int bundle_from_map(const cJSON *data, struct bundle **out,
                                                        char *err, size_t errlen);
/* Add or replace one file (copies name and source). 0 or -errno. */
__attribute__((warn_unused_result)) int bundle_put(struct bundle *b, const char *name,
                                                   const char *source, size_t size, char *err,
                                                   size_t errlen);
const struct bundle_file *bundle_get(const struct bundle *b, const char *name);
/* Recompute digest after bundle_put(). */
void bundle_seal(struct bundle *b);
struct bundle *bundle_copy(const struct bundle *b);
void bundle_free(struct bundle *b);

#endif
