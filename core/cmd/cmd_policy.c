/* gkm policy: check, evaluate, test and preview reloads of policy bundles,
 * through exactly the engine the daemons use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "cli.h"
#include "cmd.h"
#include "engine.h"
#include "jsonfile.h"
#include "log.h"

static const char usage[] =
    "Usage: gkm policy check DIR\n"
    "       gkm policy eval DIR HOOK INPUT.json\n"
    "       gkm policy test DIR CASES.json\n"
    "       gkm policy reload DIR NEWDIR HOOK INPUT.json\n"
    "\n"
    "DIR holds *.lua policy files (a ConfigMap's data, unpacked); they override the\n"
    "built-in files of the same name. Everything runs in the daemons' sandbox.\n"
    "\n"
    "  check    load the bundle as a daemon would; report file, line and reason\n"
    "  eval     run one hook (compat, aggregate, admission, placement) on a JSON input\n"
    "  test     run cases [{\"name\",\"hook\",\"input\",\"expect\"}]: expect must match\n"
    "           the result (every key it names, recursively)\n"
    "  reload   load DIR, then try NEWDIR as a live daemon would on a ConfigMap\n"
    "           change, and show which bundle answers HOOK afterwards\n"
    "\n"
    "Flags:\n"
    "  --memory BYTES       Lua memory cap (default 33554432)\n"
    "  --instructions N     instruction budget per call (default 200000000)\n"
    "  --timeout-ms MS      wall-clock budget per call (default 2000)\n";

#define CMD "gkm policy"

static int load_bundle(const char *dir, struct bundle **out)
{
	char err[512];
	if (bundle_from_dir(dir, out, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD ": %s\n", err);
		return -1;
	}
	return 0;
}

static int build(const char *dir, const struct engine_limits *lim, struct engine **out)
{
	struct bundle *b = NULL;
	struct engine_error err;
	if (load_bundle(dir, &b) != 0)
		return -1;
	int rc = engine_new(b, lim, out, &err);
	if (rc != 0)
		fprintf(stderr, CMD ": %s: refused (%s): %s\n", dir, engine_status_name(err.status),
		        err.message);
	bundle_free(b);
	return rc;
}

static int do_check(const char *dir, const struct engine_limits *lim)
{
	struct bundle *b = NULL;
	struct engine_error err;
	struct engine *e = NULL;
	if (load_bundle(dir, &b) != 0)
		return EXIT_FAIL;
	if (engine_new(b, lim, &e, &err) != 0) {
		fprintf(stderr, CMD " check: %s: refused (%s): %s\n", dir,
		        engine_status_name(err.status), err.message);
		bundle_free(b);
		return EXIT_FAIL;
	}
	printf("%s: ok, %zu files, digest %s, Lua memory %zu bytes\n", dir, b->count, b->digest,
	       engine_memory(e));
	engine_unref(e);
	bundle_free(b);
	return EXIT_OK;
}

static int eval_and_print(struct engine *e, const char *hook, const cJSON *input)
{
	cJSON *out = NULL;
	struct engine_error err;
	enum engine_status st = engine_call(e, hook, input, &out, &err);
	if (st != ENGINE_OK) {
		fprintf(stderr, CMD ": hook %s: %s: %s\n", hook, engine_status_name(st),
		        err.message);
		return EXIT_FAIL;
	}
	cli_print_json(out);
	return EXIT_OK;
}

static int do_eval(const char *dir, const char *hook, const char *input_path,
                   const struct engine_limits *lim)
{
	char err[512];
	cJSON *input = NULL;
	struct engine *e = NULL;
	if (jsonfile_read(input_path, &input, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD " eval: %s\n", err);
		return EXIT_FAIL;
	}
	int rc = EXIT_FAIL;
	if (build(dir, lim, &e) == 0)
		rc = eval_and_print(e, hook, input);
	if (e)
		engine_unref(e);
	cJSON_Delete(input);
	return rc;
}

/* Does got contain everything want names (objects: each key; arrays: same
 * length, element-wise; scalars: equal)? path describes the first mismatch. */
static int matches(const cJSON *want, const cJSON *got, char *path, size_t pathlen)
{
	if (cJSON_IsObject(want)) {
		if (!cJSON_IsObject(got))
			return 0;
		const cJSON *w;
		size_t n = strlen(path);
		cJSON_ArrayForEach(w, want)
		{
			snprintf(path + n, pathlen - n, ".%s", w->string);
			if (!matches(w, cJSON_GetObjectItemCaseSensitive(got, w->string), path,
			             pathlen))
				return 0;
		}
		path[n] = '\0';
		return 1;
	}
	if (cJSON_IsArray(want)) {
		/* an empty table leaves Lua as {}: accept it for an empty array */
		if (cJSON_GetArraySize(want) == 0)
			return (cJSON_IsArray(got) || cJSON_IsObject(got)) &&
			       cJSON_GetArraySize(got) == 0;
		if (!cJSON_IsArray(got) || cJSON_GetArraySize(want) != cJSON_GetArraySize(got))
			return 0;
		size_t n = strlen(path);
		for (int i = 0; i < cJSON_GetArraySize(want); i++) {
			snprintf(path + n, pathlen - n, "[%d]", i + 1);
			if (!matches(cJSON_GetArrayItem(want, i), cJSON_GetArrayItem(got, i), path,
			             pathlen))
				return 0;
		}
		path[n] = '\0';
		return 1;
	}
	return got && cJSON_Compare(want, got, 1);
}

static int do_test(const char *dir, const char *cases_path, const struct engine_limits *lim)
{
	char err[512];
	cJSON *cases = NULL;
	struct engine *e = NULL;
	int failed = 0, n = 0;
	if (jsonfile_read(cases_path, &cases, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD " test: %s\n", err);
		return EXIT_FAIL;
	}
	if (!cJSON_IsArray(cases)) {
		fprintf(stderr, CMD " test: %s: want a JSON array of cases\n", cases_path);
		cJSON_Delete(cases);
		return EXIT_FAIL;
	}
	if (build(dir, lim, &e) != 0) {
		cJSON_Delete(cases);
		return EXIT_FAIL;
	}
	const cJSON *c;
	cJSON_ArrayForEach(c, cases)
	{
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
		const cJSON *hook = cJSON_GetObjectItemCaseSensitive(c, "hook");
		const cJSON *input = cJSON_GetObjectItemCaseSensitive(c, "input");
		const cJSON *expect = cJSON_GetObjectItemCaseSensitive(c, "expect");
		const char *nm = cJSON_IsString(name) ? name->valuestring : "(unnamed)";
		n++;
		if (!cJSON_IsString(hook) || !expect) {
			printf("not ok %d - %s: a case needs \"hook\" and \"expect\"\n", n, nm);
			failed++;
			continue;
		}
		cJSON *out = NULL;
		struct engine_error eerr;
		enum engine_status st = engine_call(e, hook->valuestring, input, &out, &eerr);
		char path[256] = "";
		if (st != ENGINE_OK) {
			printf("not ok %d - %s: %s: %s\n", n, nm, engine_status_name(st),
			       eerr.message);
			failed++;
		} else if (!matches(expect, out, path, sizeof(path))) {
			char *g = cJSON_PrintUnformatted(out);
			printf("not ok %d - %s: result differs at %s\n#   got: %s\n", n, nm,
			       path[0] ? path : "(top)", g ? g : "?");
			free(g);
			failed++;
		} else {
			printf("ok %d - %s\n", n, nm);
		}
		cJSON_Delete(out);
	}
	printf("1..%d\n%d passed, %d failed\n", n, n - failed, failed);
	engine_unref(e);
	cJSON_Delete(cases);
	return failed ? EXIT_FAIL : EXIT_OK;
}

static int do_reload(const char *dir, const char *newdir, const char *hook, const char *input_path,
                     const struct engine_limits *lim)
{
	char err[512];
	cJSON *input = NULL;
	struct bundle *b = NULL, *nb = NULL;
	struct engine_slot slot;
	struct engine_error eerr;
	int rc = EXIT_FAIL;
	engine_slot_init(&slot, lim);
	if (jsonfile_read(input_path, &input, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD " reload: %s\n", err);
		return EXIT_FAIL;
	}
	if (load_bundle(dir, &b) != 0)
		goto out;
	if (engine_slot_load(&slot, b, &eerr) != 0) {
		fprintf(stderr, CMD " reload: %s: refused (%s): %s\n", dir,
		        engine_status_name(eerr.status), eerr.message);
		goto out;
	}
	printf("generation %llu: %s (%s)\n", (unsigned long long)slot.generation, dir, b->digest);
	if (eval_and_print(slot.current, hook, input) != EXIT_OK)
		goto out;
	if (load_bundle(newdir, &nb) != 0)
		goto out;
	if (engine_slot_load(&slot, nb, &eerr) != 0)
		printf(
		    "reload to %s refused (%s): %s\nstill answering with generation %llu (%s):\n",
		    newdir, engine_status_name(eerr.status), eerr.message,
		    (unsigned long long)slot.generation, engine_digest(slot.current));
	else
		printf("generation %llu: %s (%s)\n", (unsigned long long)slot.generation, newdir,
		       engine_digest(slot.current));
	rc = eval_and_print(slot.current, hook, input);
out:
	engine_slot_clear(&slot);
	bundle_free(b);
	bundle_free(nb);
	cJSON_Delete(input);
	return rc;
}

int cmd_policy(int argc, char **argv)
{
	enum { OPT_MEMORY = CLI_OPT_FIRST_FREE, OPT_INSTR, OPT_TIMEOUT };
	static const struct option opts[] = {
	    CLI_COMMON_OPTIONS,
	    {"memory", required_argument, 0, OPT_MEMORY},
	    {"instructions", required_argument, 0, OPT_INSTR},
	    {"timeout-ms", required_argument, 0, OPT_TIMEOUT},
	    {0, 0, 0, 0},
	};
	struct engine_limits lim = engine_limits_default;
	unsigned long long v;
	int c;
	cli_reset();
	int exit_code;
	while ((c = cli_next(argc, argv, "h", opts, CMD, usage, &exit_code)) != -1) {
		switch (c) {
		case OPT_MEMORY:
			if (cli_parse_u64(optarg, 1ull << 34, &v) != 0 || v < (1u << 20))
				return cli_usage_error(
				    CMD,
				    "--memory wants bytes, 1048576 to 17179869184, "
				    "got '%s'",
				    optarg);
			lim.memory_bytes = (size_t)v;
			break;
		case OPT_INSTR:
			if (cli_parse_u64(optarg, 1ull << 40, &v) != 0 || v < 1000)
				return cli_usage_error(
				    CMD, "--instructions wants a count >= 1000, got '%s'", optarg);
			lim.instructions = v;
			break;
		case OPT_TIMEOUT:
			if (cli_parse_u64(optarg, 3600000, &v) != 0 || v == 0)
				return cli_usage_error(
				    CMD, "--timeout-ms wants 1 to 3600000, got '%s'", optarg);
			lim.wall_ms = v;
			break;
		default:
		}
	}
	if (exit_code >= 0)
		return exit_code == EXIT_OK ? EXIT_OK : EXIT_USAGE;
	int n = argc - optind;
	char **a = argv + optind;
	if (n < 1)
		return cli_usage_error(CMD, "missing subcommand (check, eval, test or reload)");
	if (strcmp(a[0], "check") == 0 && n == 2)
		return do_check(a[1], &lim);
	if (strcmp(a[0], "eval") == 0 && n == 4)
		return do_eval(a[1], a[2], a[3], &lim);
	if (strcmp(a[0], "test") == 0 && n == 3)
		return do_test(a[1], a[2], &lim);
	if (strcmp(a[0], "reload") == 0 && n == 5)
		return do_reload(a[1], a[2], a[3], a[4], &lim);
	if (strcmp(a[0], "check") && strcmp(a[0], "eval") && strcmp(a[0], "test") &&
	    strcmp(a[0], "reload"))
		return cli_usage_error(CMD, "unknown subcommand '%s'", a[0]);
	return cli_usage_error(CMD, "wrong number of arguments for '%s'", a[0]);
}
