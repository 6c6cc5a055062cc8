/* Flag handling shared by every subcommand, so that all of them accept the
 * same common flags and answer --help the same way.
 *
 * A subcommand builds its getopt_long table with CLI_COMMON_OPTIONS first and
 * passes every option it does not know itself to cli_common(). */
#ifndef GKM_CLI_H
#define GKM_CLI_H

#include <getopt.h>
#include <stdbool.h>

enum { CLI_OPT_LOG_LEVEL = 0x1000, CLI_OPT_LOG_FORMAT, CLI_OPT_FIRST_FREE };

#define CLI_COMMON_OPTIONS                                                                         \
	{"help", no_argument, 0, 'h'}, {"log-level", required_argument, 0, CLI_OPT_LOG_LEVEL},     \
	{                                                                                          \
		"log-format", required_argument, 0, CLI_OPT_LOG_FORMAT                             \
	}

#define CLI_COMMON_HELP                                                                            \
	"Common flags:\n"                                                                          \
	"  --log-level LEVEL   debug, info, warn or error (default info)\n"                        \
	"  --log-format FMT    text or json (default text)\n"                                      \
	"  -h, --help          show this help\n"

enum cli_result { CLI_CONTINUE = 0, CLI_EXIT_OK, CLI_EXIT_USAGE };

/* Handle a common option (or '?' from getopt). usage is printed for -h.
 * cmd names the subcommand in error messages ("gkm policy"). */
enum cli_result cli_common(int opt, const char *arg, const char *cmd, const char *usage);

/* The option parser of every command: the next of the command's own flags
 * (optarg its value), the common ones handled here. Flags may come before
 * or after the positional arguments, as kubectl and cosign take them (GNU
 * getopt moves the positional ones to the end; a shortopts starting with
 * '+' stops at the first, for commands that run another command); "--"
 * ends them. -1 at the end: optind is then the first positional argument,
 * and *exit_code is -1, or the exit code the command returns now (--help
 * printed: EXIT_OK; a bad flag: EXIT_USAGE, said). Start with cli_reset(). */
int cli_next(int argc, char **argv, const char *shortopts, const struct option *opts,
             const char *cmd, const char *usage, int *exit_code);

/* Reset getopt for a fresh parse of a sub-argv. */
void cli_reset(void);

/* Print "gkm CMD: message" to stderr with printf formatting; returns EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print o as indented JSON on stdout, then free it (NULL prints nothing). */
struct cJSON;
void cli_print_json(struct cJSON *o);

/* Parse a non-negative integer flag value strictly (whole string, in range). */
__attribute__((warn_unused_result)) int cli_parse_u64(const char *s, unsigned long long max,
                                                      unsigned long long *out);

#endif
