/* gkm up: standalone mode. The agent and the operator loops of a cluster
 * install, in one process, on one machine, with objects kept as files in a
 * state directory instead of an API server. `gkm apply/get/delete` edit and
 * read that directory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "cli.h"
#include "cli_registry.h"
#include "cmd.h"
#include "fsutil.h"
#include "health.h"
#include "log.h"
#include "operator.h"
#include "policy_watch.h"

#define CMD "gkm up"

static const char usage[] =
    "Usage: gkm up [--state DIR] [flags]\n\n"
    "Run the whole gkm pipeline on this machine without a cluster: the agent checks\n"
    "each cache against this machine's GPUs, pulls, verifies and extracts it; the\n"
    "operator aggregates the status. Objects live in DIR/objects (edit them with\n"
    "`gkm apply -f`, read them with `gkm get`), the store in DIR/store, the cache\n"
    "views (what the CSI plugin would mount) in DIR/caches.\n\n"
    "  --state DIR          state directory (default /var/lib/gkm/standalone)\n"
    "  --node NAME          node name in status (default: this host's name)\n"
    "  --gpu-source SRC     auto, nvml, rocm or file (default auto)\n"
    "  --gpus-file FILE     GPU inventory JSON for --gpu-source file (see gkm gpus)\n"
    "  --sysfs-root DIR     root of the AMD KFD topology (default /sys)\n"
    "  --policy-dir DIR     Lua policies overriding the built-in ones; reloaded on change\n"
    "  --max-pulls N        concurrent pulls (default 2)\n"
    "  --health-listen ADDR serve /healthz, /readyz, /metrics (e.g. 127.0.0.1:8081)\n"
    "  --poll-ms MS         how often DIR is scanned for changes (default 250)\n" CLI_REGISTRY_HELP;

struct up {
	struct agent *agent;
	struct operator_ *op;
	struct health_server *health;
	uint64_t ready_timer;
};

static void on_policies(void *ud, bool applied, const char *error)
{
	struct up *u = ud;
	if (!applied) {
		log_error("policy change refused; the previous policies stay in force", "error",
		          error);
		return;
	}
	agent_policies_changed(u->agent);
	operator_policies_changed(u->op);
}

static void ready_tick(struct loop *l, void *ud)
{
	struct up *u = ud;
	bool ready = agent_ready(u->agent) && operator_ready(u->op);
	health_set_ready(u->health, ready, ready ? NULL : "waiting for the first sync");
	health_beat(u->health, 30000);
	u->ready_timer = loop_add_timer(l, 1000, ready_tick, u);
}

static void default_node(char *buf, size_t len)
{
	char host[256] = "";
	gethostname(host, sizeof(host) - 1);
	size_t j = 0;
	for (size_t i = 0; host[i] && j + 1 < len; i++) {
		char c = host[i];
		if (c >= 'A' && c <= 'Z')
			c = (char)(c - 'A' + 'a');
		if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')
			buf[j++] = c;
	}
	buf[j] = '\0';
	if (!obj_valid_name(buf))
		snprintf(buf, len, "standalone");
}

int cmd_up(int argc, char **argv)
{
	enum {
		OPT_STATE = CLI_OPT_FIRST_FREE,
		OPT_NODE,
		OPT_GPU_SOURCE,
		OPT_GPUS_FILE,
		OPT_SYSFS,
		OPT_POLICY_DIR,
		OPT_MAX_PULLS,
		OPT_HEALTH,
		OPT_POLL,
	};
	static const struct option opts[] = {
	    CLI_COMMON_OPTIONS,
	    CLI_REGISTRY_OPTIONS,
	    {"state", required_argument, 0, OPT_STATE},
	    {"node", required_argument, 0, OPT_NODE},
	    {"gpu-source", required_argument, 0, OPT_GPU_SOURCE},
	    {"gpus-file", required_argument, 0, OPT_GPUS_FILE},
	    {"sysfs-root", required_argument, 0, OPT_SYSFS},
	    {"policy-dir", required_argument, 0, OPT_POLICY_DIR},
	    {"max-pulls", required_argument, 0, OPT_MAX_PULLS},
	    {"health-listen", required_argument, 0, OPT_HEALTH},
	    {"poll-ms", required_argument, 0, OPT_POLL},
	    {0, 0, 0, 0},
	};
	const char *state = "/var/lib/gkm/standalone", *policy_dir = NULL, *health_listen = NULL;
	char node[254];
	struct agent_opts ao = {.gpu_source = "auto"};
	struct cli_registry reg;
	unsigned long long v, poll_ms = 250;
	int c, rc;
	default_node(node, sizeof(node));
	cli_registry_init(&reg, false);
	cli_reset();
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case OPT_STATE:
			state = optarg;
			break;
		case OPT_NODE:
			if (!obj_valid_name(optarg))
				return cli_usage_error(CMD, "--node '%s' is not a valid node name",
				                       optarg);
			snprintf(node, sizeof(node), "%s", optarg);
			break;
		case OPT_GPU_SOURCE:
			if (strcmp(optarg, "auto") && strcmp(optarg, "nvml") &&
			    strcmp(optarg, "rocm") && strcmp(optarg, "file"))
				return cli_usage_error(
				    CMD, "--gpu-source wants auto, nvml, rocm or file");
			ao.gpu_source = optarg;
			break;
		case OPT_GPUS_FILE:
			ao.gpu_file = optarg;
			break;
		case OPT_SYSFS:
			ao.sysfs_root = optarg;
			break;
		case OPT_POLICY_DIR:
			policy_dir = optarg;
			break;
		case OPT_MAX_PULLS:
			if (cli_parse_u64(optarg, 64, &v) != 0 || v == 0)
				return cli_usage_error(CMD, "--max-pulls wants 1 to 64, got '%s'",
				                       optarg);
			ao.max_pulls = (unsigned)v;
			break;
		case OPT_HEALTH:
			health_listen = optarg;
			break;
		case OPT_POLL:
			if (cli_parse_u64(optarg, 60000, &poll_ms) != 0 || poll_ms < 10)
				return cli_usage_error(CMD, "--poll-ms wants 10 to 60000, got '%s'",
				                       optarg);
			break;
		default:
			rc = cli_registry_flag(&reg, c, optarg, CMD);
			if (rc < 0)
				return EXIT_USAGE;
			if (rc > 0)
				break;
			switch (cli_common(c, optarg, CMD, usage)) {
			case CLI_EXIT_OK:
				return EXIT_OK;
			case CLI_EXIT_USAGE:
				return EXIT_USAGE;
			case CLI_CONTINUE:
				break;
			}
		}
	}
	if (optind != argc)
		return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
	if (!strcmp(ao.gpu_source, "file") && !ao.gpu_file)
		return cli_usage_error(CMD, "--gpu-source file needs --gpus-file");
	if (ao.gpu_file && !strcmp(ao.gpu_source, "auto"))
		ao.gpu_source = "file";

	struct loop *l = NULL;
	struct workers *w = NULL;
	struct objstore *os = NULL;
	struct sig_keyset *keys = NULL;
	struct policy_watch *pw = NULL;
	struct engine_slot slot;
	struct up u = {0};
	char run_dir[600], status_file[600], err[1024];
	int exit_code = EXIT_FAIL;
	engine_slot_init(&slot, NULL);
	snprintf(run_dir, sizeof(run_dir), "%s/run", state);
	snprintf(status_file, sizeof(status_file), "%s/policy-status.json", state);
	if (cli_registry_keyset(&reg, CMD, &keys) != 0) {
		cli_registry_clear(&reg);
		return EXIT_FAIL;
	}
	if ((rc = fsutil_mkdirs(run_dir, 0755)) != 0) {
		fprintf(stderr, CMD ": cannot create %s: %s\n", run_dir, strerror(-rc));
		goto out;
	}
	if ((rc = loop_new(&l)) || (rc = workers_new(l, 4, &w)) ||
	    (rc = objstore_file_new(state, l, (unsigned)poll_ms, &os))) {
		fprintf(stderr, CMD ": cannot start: %s\n", strerror(-rc));
		goto out;
	}
	if (policy_watch_start(l, &slot, policy_dir, 2000, status_file, on_policies, &u, &pw, err,
	                       sizeof(err)) != 0) {
		fprintf(stderr, CMD ": policies refused at start-up: %s\n", err);
		goto out;
	}
	if (health_listen && (rc = health_start(health_listen, &u.health)) != 0) {
		fprintf(stderr, CMD ": cannot listen on %s: %s\n", health_listen, strerror(-rc));
		goto out;
	}
	ao.node = node;
	ao.root = state;
	ao.run_dir = run_dir;
	ao.keys = keys;
	ao.registry = &reg.reg;
	struct operator_opts oo = {
	    .resolve_digests = true, .verification_enabled = keys != NULL, .registry = &reg.reg};
	if ((rc = agent_start(l, w, os, &slot, &ao, &u.agent)) ||
	    (rc = operator_start(l, w, os, &slot, &oo, &u.op))) {
		fprintf(stderr, CMD ": cannot start the loops: %s\n", strerror(-rc));
		goto out;
	}
	if (u.health)
		u.ready_timer = loop_add_timer(l, 0, ready_tick, &u);
	log_info("gkm up: running", "state", state, "node", node, "verify", keys ? "on" : "off");
	rc = loop_run(l);
	exit_code = rc == 0 ? EXIT_OK : EXIT_FAIL;
out:
	if (u.agent)
		agent_quiesce(u.agent);
	if (u.op)
		operator_quiesce(u.op);
	workers_free(w);
	if (l)
		loop_drain(l);
	agent_stop(u.agent);
	operator_stop(u.op);
	health_stop(u.health);
	policy_watch_stop(pw);
	if (os)
		os->ops->free(os);
	engine_slot_clear(&slot);
	sig_keyset_free(keys);
	cli_registry_clear(&reg);
	loop_free(l);
	return exit_code;
}
