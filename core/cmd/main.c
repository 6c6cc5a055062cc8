/* gkm: one binary, many commands (see README.md). */
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "cmd.h"

struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const struct command commands[] = {
    {"operator", cmd_operator, "aggregate node reports into cache status (Deployment)"},
    {"agent", cmd_agent, "probe GPUs, pull, verify, check and extract caches (DaemonSet)"},
    {"csi", cmd_csi, "CSI node plugin: mount ready caches into pods"},
    {"webhook", cmd_webhook, "admission webhook: resolve digests, verify signatures"},
    {"up", cmd_up, "standalone mode: the whole pipeline on one machine, no cluster"},
    {"apply", cmd_apply, "standalone mode: create or update objects from YAML"},
    {"get", cmd_get, "standalone mode: show objects and their status"},
    {"delete", cmd_delete, "standalone mode: delete an object"},
    {"cache", cmd_cache, "build, push, inspect, sign and verify cache images"},
    {"policy", cmd_policy, "check, test and evaluate Lua policy bundles"},
    {"gpus", cmd_gpus, "show the GPUs this node has, as the agent sees them"},
    {"labels", cmd_labels, "the Node labels of ready caches: keys; remove them (uninstall)"},
    {"version", cmd_version, "print the version"},
    {"help", cmd_help, "show this help"},
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: gkm COMMAND [FLAGS] [ARGS]\n\n"
	           "gkm ships pre-compiled GPU kernel caches to Kubernetes nodes.\n\nCommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\nRun 'gkm COMMAND --help' for the flags of a command.\n");
}

static int cmd_version(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("gkm %s\n", GKM_VERSION);
	return EXIT_OK;
}

static int cmd_help(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	usage(stdout);
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	/* The daemons are mostly idle threads: one malloc arena per thread (glibc's
	 * default, up to 8 per core) keeps freed memory spread over many heaps
	 * that are never returned; two are plenty for gkm's contention. A fixed
	 * mmap threshold keeps the big pull and extraction buffers out of the
	 * heaps (glibc's moving threshold would put them there after the first
	 * free, where small long-lived blocks then pin their pages). */
	mallopt(M_ARENA_MAX, 2);
	mallopt(M_MMAP_THRESHOLD, 256 * 1024);
	const char *name = argv[1];
	if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0)
		name = "help";
	if (strcmp(name, "--version") == 0)
		name = "version";
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, name) == 0)
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "gkm: unknown command '%s'\n\n", name);
	usage(stderr);
	return EXIT_USAGE;
}
