/* Subcommands of the gkm multi-call binary. Each takes the argv that starts
 * at its own name (argv[0] == "agent", ...) and returns the process exit code.
 * cmd_csi loads the CSI module (core/cmd/module.h) and runs its csi_main. */
#ifndef GKM_CMD_H
#define GKM_CMD_H

int cmd_operator(int argc, char **argv);
int cmd_agent(int argc, char **argv);
int cmd_csi(int argc, char **argv);
int cmd_webhook(int argc, char **argv);
int cmd_up(int argc, char **argv);
int cmd_apply(int argc, char **argv);
int cmd_get(int argc, char **argv);
int cmd_delete(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_policy(int argc, char **argv);
int cmd_gpus(int argc, char **argv);
int cmd_labels(int argc, char **argv);

/* Exit codes shared by all subcommands. */
enum {
	EXIT_OK = 0,
	EXIT_FAIL = 1,
	EXIT_USAGE = 2,
	EXIT_NOT_BUILT = 3 /* a module of the command cannot be loaded */
};

#endif
