/* gkm csi: the CSI node plugin daemon (DaemonSet, next to the agent). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd.h"
#include "csi_node.h"
#include "csi_server.h"
#include "fsutil.h"
#include "health.h"
#include "log.h"
#include "loop.h"
#include "textfmt.h"

#define CMD "gkm csi"

static const char usage[] =
    "Usage: gkm csi --node-id NAME [flags]\n"
    "\n"
    "Serve the CSI node plugin (driver " CSI_DRIVER_NAME ") on a unix socket: mount the caches\n"
    "the agent marked ready into pods, read-only or as a private overlay, and\n"
    "record which pods use which cache.\n"
    "\n"
    "Flags:\n"
    "  --endpoint ADDR        unix:///path/csi.sock (default $CSI_ENDPOINT, else\n"
    "                         unix:///run/gkm/csi.sock)\n"
    "  --node-id NAME         this node's name, as NodeGetInfo reports it (default\n"
    "                         $NODE_NAME; --node-name is the same)\n"
    "  --root DIR             the agent's store root: ROOT/store, ROOT/caches\n"
    "                         (default /var/lib/gkm)\n"
    "  --run-dir DIR          volume state and usage: RUN_DIR/volumes, RUN_DIR/usage\n"
    "                         (default /run/gkm)\n"
    "  --config-dir DIR       the gkm-config ConfigMap as files: its store-dir, views-dir\n"
    "                         and usage-dir give the defaults of --root and --run-dir\n"
    "  --driver-name NAME     the CSI driver name (default " CSI_DRIVER_NAME ")\n"
    "  --state-dir DIR        upper layers of writable volumes (default ROOT/csi)\n"
    "  --health-listen ADDR   serve /healthz, /readyz, /metrics on [HOST]:PORT (default:\n"
    "                         none)\n"
    "  --writable-size-limit Q  what a pod may write into a writable volume (or an\n"
    "                         onMiss \"empty\" directory) unless its sizeLimit attribute\n"
    "                         says: a quantity of bytes (default 10Gi; 0: no limit).\n"
    "                         Enforced by a sparse ext4 image per volume on a loop\n"
    "                         device: past it the pod gets ENOSPC\n"
    "  --threads N            calls answered concurrently (default 4)\n"
    "  --drain-timeout SEC    on SIGTERM, how long calls in flight may finish (default 10)\n";

enum {
	OPT_ENDPOINT = CLI_OPT_FIRST_FREE,
	OPT_NODE_ID,
	OPT_ROOT,
	OPT_RUN_DIR,
	OPT_STATE_DIR,
	OPT_HEALTH,
	OPT_THREADS,
	OPT_DRAIN,
	OPT_CONFIG_DIR,
	OPT_DRIVER,
	OPT_SIZE_LIMIT,
};

/* The command line, with the defaults it leaves in place. */
struct csi_opts {
	const char *endpoint, *node_id, *root, *run_dir, *state_dir, *health, *config_dir, *driver;
	unsigned long long threads, drain;
	uint64_t size_limit;
	char cfg_root[PATH_MAX], cfg_run[PATH_MAX]; /* --root and --run-dir from --config-dir */
};

struct daemon {
	struct loop *loop;
	struct health_server *health;
	struct csi_node *node;
	struct csi_server *srv;
};

/* One key of the config directory (a ConfigMap mounted as files): the
 * value, surrounding whitespace trimmed. -ENOENT when the key is absent. */
static int config_value(const char *dir, const char *key, char *out, size_t size)
{
	char path[PATH_MAX], *text = NULL;
	size_t len = 0;
	int n = snprintf(path, sizeof(path), "%s/%s", dir, key);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	int rc = fsutil_read_file(path, PATH_MAX, &text, &len);
	if (rc)
		return rc;
	char *s = text, *e = text + len;
	while (s < e && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
		s++;
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		e--;
	rc = (size_t)(e - s) < size ? 0 : -ENAMETOOLONG;
	if (rc == 0) {
		memcpy(out, s, (size_t)(e - s));
		out[e - s] = '\0';
	}
	free(text);
	return rc;
}

/* The directory that holds key's path as its entry base (and key2's as
 * base2, when given): "/var/lib/gkm/store" with base "store" gives
 * "/var/lib/gkm". -ENOENT when key is not configured, -EINVAL when the
 * paths do not have that shape. */
static int config_parent(const char *dir, const char *key, const char *base, const char *key2,
                         const char *base2, char *out, size_t size)
{
	char v[PATH_MAX], v2[PATH_MAX];
	int rc = config_value(dir, key, v, sizeof(v));
	if (rc)
		return rc;
	size_t n = strlen(v), bl = strlen(base);
	if (v[0] != '/' || n <= bl + 1 || strcmp(v + n - bl, base) != 0 || v[n - bl - 1] != '/')
		return -EINVAL;
	v[n - bl - 1] = '\0';
	if (key2) {
		rc = config_value(dir, key2, v2, sizeof(v2));
		if (rc == 0) {
			size_t n2 = strlen(v2), b2 = strlen(base2);
			if (n2 <= b2 + 1 || strcmp(v2 + n2 - b2, base2) != 0 ||
			    v2[n2 - b2 - 1] != '/' || strncmp(v2, v, n2 - b2 - 1) != 0 ||
			    strlen(v) != n2 - b2 - 1)
				return -EINVAL;
		} else if (rc != -ENOENT) {
			return rc;
		}
	}
	if (strlen(v) >= size)
		return -ENAMETOOLONG;
	memcpy(out, v, strlen(v) + 1);
	return 0;
}

static void beat(struct loop *l, void *ud)
{
	struct daemon *d = ud;
	health_beat(d->health, 10000);
	if (!loop_stopping(l) && loop_add_timer(l, 1000, beat, d) == 0)
		log_error("cannot re-arm the health heartbeat");
}

static void handle(void *ud, const char *method, const uint8_t *req, size_t len,
                   struct csi_reply *reply)
{
	csi_node_call(ud, method, req, len, reply);
}

static void on_shutdown(struct loop *l, int signo, void *ud)
{
	(void)l;
	(void)signo; /* the loop logs it */
	struct daemon *d = ud;
	health_set_ready(d->health, false, "shutting down");
}

/* One flag into o: 0, or the exit status of a usage error. */
static int set_flag(struct csi_opts *o, int opt, const char *arg)
{
	switch (opt) {
	case OPT_ENDPOINT:
		o->endpoint = arg;
		break;
	case OPT_NODE_ID:
		o->node_id = arg;
		break;
	case OPT_ROOT:
		o->root = arg;
		break;
	case OPT_RUN_DIR:
		o->run_dir = arg;
		break;
	case OPT_STATE_DIR:
		o->state_dir = arg;
		break;
	case OPT_CONFIG_DIR:
		o->config_dir = arg;
		break;
	case OPT_DRIVER:
		if (!csi_node_valid_driver(arg))
			return cli_usage_error(
			    CMD, "--driver-name '%s' is not a valid CSI driver name", arg);
		o->driver = arg;
		break;
	case OPT_HEALTH:
		o->health = arg;
		break;
	case OPT_THREADS:
		if (cli_parse_u64(arg, 64, &o->threads) != 0 || o->threads == 0)
			return cli_usage_error(CMD, "--threads wants 1 to 64, not '%s'", arg);
		break;
	case OPT_SIZE_LIMIT:
		if (quantity_parse_bytes(arg, &o->size_limit) != 0)
			return cli_usage_error(CMD,
			                       "--writable-size-limit wants a quantity of bytes "
			                       "(10Gi, 500Mi; 0: none), not '%s'",
			                       arg);
		break;
	case OPT_DRAIN:
		if (cli_parse_u64(arg, 3600, &o->drain) != 0)
			return cli_usage_error(
			    CMD, "--drain-timeout wants 0 to 3600 seconds, not '%s'", arg);
		break;
	default:
		break;
	}
	return 0;
}

/* --root and --run-dir, where not given, from the config directory's
 * store-dir, views-dir and usage-dir. 0, or the exit status of a usage
 * error. */
static int dirs_from_config(struct csi_opts *o)
{
	if (o->config_dir && !o->root) {
		int e = config_parent(o->config_dir, "store-dir", "store", "views-dir", "caches",
		                      o->cfg_root, sizeof(o->cfg_root));
		if (e < 0 && e != -ENOENT)
			return cli_usage_error(CMD,
			                       "%s: store-dir and views-dir must be ROOT/store and "
			                       "ROOT/caches of one ROOT (%s)",
			                       o->config_dir, strerror(-e));
		o->root = e == 0 ? o->cfg_root : NULL;
	}
	if (o->config_dir && !o->run_dir) {
		int e = config_parent(o->config_dir, "usage-dir", "usage", NULL, NULL, o->cfg_run,
		                      sizeof(o->cfg_run));
		if (e < 0 && e != -ENOENT)
			return cli_usage_error(CMD, "%s: usage-dir must be RUN_DIR/usage (%s)",
			                       o->config_dir, strerror(-e));
		o->run_dir = e == 0 ? o->cfg_run : NULL;
	}
	return 0;
}

/* The command line into o, checked. -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct csi_opts *o)
{
	static const struct option opts[] = {
	    CLI_COMMON_OPTIONS,
	    {"endpoint", required_argument, 0, OPT_ENDPOINT},
	    {"node-id", required_argument, 0, OPT_NODE_ID},
	    {"node-name", required_argument, 0, OPT_NODE_ID},
	    {"config-dir", required_argument, 0, OPT_CONFIG_DIR},
	    {"driver-name", required_argument, 0, OPT_DRIVER},
	    {"root", required_argument, 0, OPT_ROOT},
	    {"run-dir", required_argument, 0, OPT_RUN_DIR},
	    {"state-dir", required_argument, 0, OPT_STATE_DIR},
	    {"health-listen", required_argument, 0, OPT_HEALTH},
	    {"threads", required_argument, 0, OPT_THREADS},
	    {"drain-timeout", required_argument, 0, OPT_DRAIN},
	    {"writable-size-limit", required_argument, 0, OPT_SIZE_LIMIT},
	    {0, 0, 0, 0},
	};
	int opt, exit_code, rc;
	cli_reset();
	while ((opt = cli_next(argc, argv, "h", opts, CMD, usage, &exit_code)) != -1)
		if ((rc = set_flag(o, opt, optarg)) != 0)
			return rc;
	if (exit_code >= 0)
		return exit_code == EXIT_OK ? EXIT_OK : EXIT_USAGE;
	if (optind < argc)
		return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
	if (!o->node_id || !*o->node_id)
		return cli_usage_error(CMD, "--node-id is required (or set NODE_NAME)");
	if (!o->endpoint || !*o->endpoint)
		o->endpoint = "unix:///run/gkm/csi.sock";
	char sock[256];
	int perr = csi_server_parse_endpoint(o->endpoint, sock, sizeof(sock));
	if (perr == -ENAMETOOLONG)
		return cli_usage_error(CMD, "--endpoint '%s' is too long for a unix socket path",
		                       o->endpoint);
	if (perr)
		return cli_usage_error(CMD, "--endpoint '%s' is not unix:///absolute/path",
		                       o->endpoint);
	if ((rc = dirs_from_config(o)) != 0)
		return rc;
	o->root = o->root ? o->root : "/var/lib/gkm";
	o->run_dir = o->run_dir ? o->run_dir : "/run/gkm";
	if (o->root[0] != '/' || o->run_dir[0] != '/' || (o->state_dir && o->state_dir[0] != '/'))
		return cli_usage_error(CMD,
		                       "--root, --run-dir and --state-dir must be absolute paths");
	return -1;
}

/* The node service, the health endpoint and the CSI socket, then the loop
 * until a signal ends it. EXIT_OK when the loop ended well. */
static int serve(struct daemon *d, const struct csi_opts *o)
{
	struct csi_node_config cfg = {
	    .node_id = o->node_id,
	    .root = o->root,
	    .run_dir = o->run_dir,
	    .state_dir = o->state_dir,
	    .version = GKM_VERSION,
	    .driver = o->driver,
	    .size_limit = o->size_limit,
	};
	int err;
	if ((err = csi_node_new(&cfg, &d->node)) != 0) {
		log_error("cannot start the CSI node service", "run_dir", o->run_dir, "error",
		          strerror(-err));
		return EXIT_FAIL;
	}
	if ((err = health_start(o->health, &d->health)) != 0) {
		log_error("cannot serve health endpoint", "listen", o->health, "error",
		          strerror(-err));
		return EXIT_FAIL;
	}
	if (d->health) {
		char port[8];
		snprintf(port, sizeof(port), "%u", (unsigned)health_port(d->health));
		log_info("health endpoint listening", "port", port);
		health_beat(d->health, 10000);
		if (loop_add_timer(d->loop, 1000, beat, d) == 0)
			return EXIT_FAIL;
	}
	err = csi_server_start(o->endpoint, (unsigned)o->threads, handle, d->node, &d->srv);
	if (err) {
		log_error("cannot serve CSI", "endpoint", o->endpoint, "error",
		          err == -EADDRINUSE ? "another process serves this socket"
		                             : strerror(-err));
		return EXIT_FAIL;
	}
	health_set_ready(d->health, true, NULL);
	loop_on_shutdown(d->loop, on_shutdown, d);
	log_info("CSI node plugin ready", "node", o->node_id, "root", o->root, "run_dir",
	         o->run_dir);
	if ((err = loop_run(d->loop)) != 0) {
		log_error("event loop failed", "error", strerror(-err));
		return EXIT_FAIL;
	}
	return EXIT_OK;
}

/* Calls in flight get drain seconds to finish. The exit status: rc, or
 * EXIT_FAIL when calls were cut short. */
static int stop(struct daemon *d, unsigned long long drain, int rc)
{
	if (d->srv) {
		int stopped = csi_server_stop(d->srv, (unsigned)drain * 1000u);
		if (stopped == -EBUSY) {
			/* Handlers still use node: exit without tearing it down. */
			log_error("CSI node plugin stopped with calls still running");
			return EXIT_FAIL;
		}
		if (stopped > 0)
			rc = EXIT_FAIL;
	}
	health_stop(d->health);
	csi_node_free(d->node);
	loop_free(d->loop);
	log_info("CSI node plugin stopped");
	return rc;
}

int csi_main(int argc, char **argv)
{
	struct csi_opts o = {
	    .endpoint = getenv("CSI_ENDPOINT"),
	    .node_id = getenv("NODE_NAME"),
	    .driver = CSI_DRIVER_NAME,
	    .threads = 4,
	    .drain = 10,
	    .size_limit = 10ull << 30, /* what most model servers' kernel caches need, with room */
	};
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	struct daemon d = {0};
	/* First, so that every thread started later has the signals blocked. */
	if ((rc = loop_new(&d.loop)) != 0) {
		log_error("cannot create the event loop", "error", strerror(-rc));
		return EXIT_FAIL;
	}
	return stop(&d, o.drain, serve(&d, &o));
}
