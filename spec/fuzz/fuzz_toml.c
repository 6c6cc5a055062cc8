/* Fuzz target: the TOML reader of the registry mirror files. Whatever the
 * bytes, it returns a document or -EINVAL with a message; a document it
 * returns prints. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *doc = NULL;
	char err[600];
	int rc = toml_parse("fuzz.toml", (const char *)data, size, &doc, err, sizeof(err));
	if (rc == 0) {
		char *s = cJSON_PrintUnformatted(doc);
		if (!s)
			abort();
		free(s);
		cJSON_Delete(doc);
	} else if ((rc != -EINVAL && rc != -ENOMEM) || strncmp(err, "fuzz.toml", 9) != 0) {
		abort();
	}
	return 0;
}
