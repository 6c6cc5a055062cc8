/* Weak placeholders for subcommands whose implementation has not landed.
 * They never pretend: they say so and exit with EXIT_NOT_BUILT. */
#include <stdio.h>

#include "cmd.h"

static int not_built(const char *name)
{
	fprintf(stderr, "gkm %s: not built yet in this version of gkm\n", name);
	return EXIT_NOT_BUILT;
}

#define STUB(fn, name)                                                                             \
	__attribute__((weak)) int fn(int argc, char **argv)                                        \
	{                                                                                          \
		(void)argc;                                                                        \
		(void)argv;                                                                        \
		return not_built(name);                                                            \
	}

STUB(cmd_csi, "csi")
STUB(cmd_webhook, "webhook")
STUB(cmd_cache, "cache")
STUB(cmd_gpus, "gpus")
