#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmd.h"
#include "log.h"

static enum log_level level = LOG_INFO;
static bool json_logs;

void cli_reset(void)
{
	optind = 0; /* 0 also re-initialises GNU getopt's internal state */
	opterr = 1;
}

int cli_next(int argc, char **argv, const char *shortopts, const struct option *opts,
             const char *cmd, const char *usage, int *exit_code)
{
	int opt;
	*exit_code = -1;
	while ((opt = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
		if (opt != 'h' && opt != '?' && opt != ':' && opt != CLI_OPT_LOG_LEVEL &&
		    opt != CLI_OPT_LOG_FORMAT)
			return opt;
		switch (cli_common(opt, optarg, cmd, usage)) {
		case CLI_CONTINUE:
			continue;
		case CLI_EXIT_OK:
			*exit_code = EXIT_OK;
			return -1;
		case CLI_EXIT_USAGE:
			*exit_code = EXIT_USAGE;
			return -1;
		}
	}
	return -1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nRun '%s --help' for usage.\n", cmd);
	return EXIT_USAGE;
}

enum cli_result cli_common(int opt, const char *arg, const char *cmd, const char *usage)
{
	switch (opt) {
	case 'h':
		fputs(usage, stdout);
		fputs(CLI_COMMON_HELP, stdout);
		return CLI_EXIT_OK;
	case CLI_OPT_LOG_LEVEL:
		if (log_parse_level(arg, &level) != 0) {
			cli_usage_error(
			    cmd, "invalid --log-level '%s' (want debug, info, warn or error)", arg);
			return CLI_EXIT_USAGE;
		}
		log_init(level, json_logs);
		return CLI_CONTINUE;
	case CLI_OPT_LOG_FORMAT:
		if (strcmp(arg, "json") == 0)
			json_logs = true;
		else if (strcmp(arg, "text") == 0)
			json_logs = false;
		else {
			cli_usage_error(cmd, "invalid --log-format '%s' (want text or json)", arg);
			return CLI_EXIT_USAGE;
		}
		log_init(level, json_logs);
		return CLI_CONTINUE;
	default:
		/* getopt already printed what was wrong with the flag */
		fprintf(stderr, "Run '%s --help' for usage.\n", cmd);
		return CLI_EXIT_USAGE;
	}
}

int cli_parse_u64(const char *s, unsigned long long max, unsigned long long *out)
{
	if (!s || !*s || *s == '-' || *s == '+')
		return -EINVAL;
	char *end = NULL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

void cli_print_json(cJSON *o)
{
	char *s = o ? cJSON_Print(o) : NULL;
	if (s)
		puts(s);
	free(s);
	cJSON_Delete(o);
}
