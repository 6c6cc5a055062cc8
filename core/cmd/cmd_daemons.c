/* The long-running commands that host the control loops:
 *   gkm agent     (DaemonSet)   the node agent, on the Kubernetes API
 *   gkm operator  (Deployment)  the status aggregator, leader-elected
 *   gkm up        (a host)      both loops on a state directory, no cluster
 * They share their flags and their life cycle (loop, workers, object store,
 * policies reloaded live, health endpoint, clean shutdown); only which loops
 * run and where the objects live differ. */
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
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
#include "kube_lease.h"
#include "log.h"
#include "objstore_kube.h"
#include "operator.h"
#include "policy_watch.h"
#include "pull_secret.h"
#include "textfmt.h"

enum role { ROLE_AGENT = 1, ROLE_OPERATOR = 2, ROLE_UP = ROLE_AGENT | ROLE_OPERATOR };

struct dflags {
	enum role role;
	const char *cmd;
	/* objects: a state directory (up) or the API server */
	const char *state, *kubeconfig, *context, *ns, *policy_cm;
	unsigned poll_ms;
	/* policies, health */
	const char *policy_dir, *health_listen;
	/* node side */
	char node[254];
	struct agent_opts ao;
	const char *trust_dir;
	bool verify;
	/* operator */
	bool leader_elect, resolve_digests, resolve_set, kserve;
	const char *global_creds; /* --global-credentials-namespaces */
	const char *agent_sa;     /* --agent-service-account */
	const char *identity, *lease_name;
	struct cli_registry reg;
};

struct daemon {
	struct dflags *f;
	struct loop *loop;
	struct workers *workers;
	struct objstore *os;
	struct engine_slot slot;
	struct policy_watch *pw;
	struct health_server *health;
	/* trusted keys: polled every TRUST_POLL_MS, swapped in whole on a change */
	struct trust_source trust_src;
	struct trust *trust;
	char trust_seen[65];
	struct agent *agent;
	struct operator_ *op;
	struct kube_lease *lease;
	bool lost_leadership;
	atomic_bool shutting_down; /* the loop ended: releasing the Lease is no loss */
	char run_dir[600];
	cJSON *policy_cm; /* the policies ConfigMap as last seen (NULL: none) */
};

/* ---- flags ---- */

enum {
	OPT_STATE = CLI_OPT_FIRST_FREE,
	OPT_KUBECONFIG,
	OPT_CONTEXT,
	OPT_NAMESPACE,
	OPT_POLICY_CM,
	OPT_POLL,
	OPT_POLICY_DIR,
	OPT_HEALTH,
	OPT_NODE,
	OPT_ROOT,
	OPT_RUN_DIR,
	OPT_GPU_SOURCE,
	OPT_GPU_FILE,
	OPT_SYSFS,
	OPT_NVML,
	OPT_MAX_PULLS,
	OPT_TRUST_DIR,
	OPT_VERIFY,
	OPT_LEADER,
	OPT_IDENTITY,
	OPT_LEASE,
	OPT_RESOLVE,
	OPT_KSERVE,
	OPT_GLOBAL_CREDS,
	OPT_AGENT_SA,
	OPT_STORE_HIGH,
	OPT_STORE_LOW,
	OPT_STORE_MAX,
	OPT_STORE_MIN_AGE,
};

static const struct option all_opts[] = {
    CLI_COMMON_OPTIONS,
    CLI_REGISTRY_OPTIONS,
    CLI_KEY_OPTION,
    {"state", required_argument, 0, OPT_STATE},
    {"kubeconfig", required_argument, 0, OPT_KUBECONFIG},
    {"context", required_argument, 0, OPT_CONTEXT},
    {"namespace", required_argument, 0, OPT_NAMESPACE},
    {"policy-configmap", required_argument, 0, OPT_POLICY_CM},
    {"poll-ms", required_argument, 0, OPT_POLL},
    {"policy-dir", required_argument, 0, OPT_POLICY_DIR},
    {"health-listen", required_argument, 0, OPT_HEALTH},
    {"node", required_argument, 0, OPT_NODE},
    {"root", required_argument, 0, OPT_ROOT},
    {"run-dir", required_argument, 0, OPT_RUN_DIR},
    {"gpu-source", required_argument, 0, OPT_GPU_SOURCE},
    {"gpu-file", required_argument, 0, OPT_GPU_FILE},
    {"sysfs-root", required_argument, 0, OPT_SYSFS},
    {"nvml-library", required_argument, 0, OPT_NVML},
    {"max-pulls", required_argument, 0, OPT_MAX_PULLS},
    {"trust-dir", required_argument, 0, OPT_TRUST_DIR},
    {"verify-enabled", required_argument, 0, OPT_VERIFY},
    {"leader-elect", required_argument, 0, OPT_LEADER},
    {"identity", required_argument, 0, OPT_IDENTITY},
    {"lease-name", required_argument, 0, OPT_LEASE},
    {"resolve-digests", required_argument, 0, OPT_RESOLVE},
    {"kserve", required_argument, 0, OPT_KSERVE},
    {"global-credentials-namespaces", required_argument, 0, OPT_GLOBAL_CREDS},
    {"agent-service-account", required_argument, 0, OPT_AGENT_SA},
    {"store-high-percent", required_argument, 0, OPT_STORE_HIGH},
    {"store-low-percent", required_argument, 0, OPT_STORE_LOW},
    {"store-max-bytes", required_argument, 0, OPT_STORE_MAX},
    {"store-min-age", required_argument, 0, OPT_STORE_MIN_AGE},
    {0, 0, 0, 0},
};

#define HELP_KUBE                                                                                  \
	"  --kubeconfig FILE      kubeconfig (default: in-cluster, else $KUBECONFIG)\n"            \
	"  --context NAME         kubeconfig context (default: the current one)\n"                 \
	"  --namespace NS         where gkm runs: its policies ConfigMap and Lease\n"              \
	"                         (default $POD_NAMESPACE, else gkm)\n"                            \
	"  --policy-configmap N   the ConfigMap of Lua policies (default gkm-policies)\n"
#define HELP_COMMON                                                                                \
	"  --global-credentials-namespaces LIST\n"                                                 \
	"                         namespaces whose GKMCaches without spec.pullSecrets the\n"       \
	"                         registry credentials below serve (\"a,b\", \"*\": all; "         \
	"default:\n"                                                                               \
	"                         none, gkm up: all); ClusterGKMCaches always; the others\n"       \
	"                         read anonymously\n"                                              \
	"  --policy-dir DIR       Lua policies from a directory instead (reloaded on change)\n"    \
	"  --health-listen ADDR   /healthz, /readyz, /metrics (default :8081, gkm up: none;\n"     \
	"                         \"\" for none)\n"
#define HELP_NODE                                                                                  \
	"  --node NAME            this node's name (default $NODE_NAME, else the host name)\n"     \
	"  --gpu-source SRC       auto, nvml, rocm or file (default auto)\n"                       \
	"  --gpu-file FILE        GPU inventory JSON for --gpu-source file (see gkm gpus)\n"       \
	"  --sysfs-root DIR       root of the AMD KFD topology (default /sys)\n"                   \
	"  --nvml-library PATH    NVML library (default libnvidia-ml.so.1)\n"                      \
	"  --max-pulls N          concurrent pulls (default 2); a registry that cannot be\n"       \
	"                         reached holds one at most, and a failed pull or image read\n"    \
	"                         is tried again after a backoff that holds none (--retries\n"     \
	"                         only resumes cut downloads)\n"                                   \
	"  --store-high-percent N when the store's file system is N% full or more, the\n"          \
	"                         images no pod on the node mounts are evicted, least\n"           \
	"                         recently used first, down to --store-low-percent (default\n"     \
	"                         85; 100: never)\n"                                               \
	"  --store-low-percent N  (default 80)\n"                                                  \
	"  --store-max-bytes Q    the most the store's images may take, a quantity of bytes\n"     \
	"                         (\"200Gi\"); a pull that would go over it first evicts\n"        \
	"                         unused ones (default 0: no cap)\n"                               \
	"  --store-min-age S      an image used or pulled less than S seconds ago is not\n"        \
	"                         evicted (default 120)\n"                                         \
	"  --trust-dir DIR        trusted public keys: every PEM key of every file in DIR\n"       \
	"                         (with --key: a signature is required before extracting)\n"       \
	"  --verify-enabled BOOL  verify signatures on the node too (default true)\n" CLI_KEY_HELP

static const char usage_agent[] =
    "Usage: gkm agent [flags]\n\n"
    "The node agent (DaemonSet): probes this node's GPUs; for every GKMCache and\n"
    "ClusterGKMCache checks the image against them, pulls, verifies and extracts it\n"
    "when a GPU can use it, publishes the view the CSI plugin mounts, and reports\n"
    "per-GPU results in this node's GKMCacheNode / ClusterGKMCacheNode status.\n\n" HELP_NODE
    "  --root DIR             store and cache views (default /var/lib/gkm)\n"
    "  --run-dir DIR          the CSI plugin's usage records (default /run/gkm)\n" HELP_KUBE
        HELP_COMMON CLI_REGISTRY_HELP;

static const char usage_operator[] =
    "Usage: gkm operator [flags]\n\n"
    "The operator (Deployment): aggregates the node reports of every cache into its\n"
    "status, resolves digests where no webhook runs, checks each cache's signature\n"
    "where it has trusted keys, records Events, removes the node objects of\n"
    "deleted nodes, and labels each Node with the caches Ready on it\n"
    "(NS.gkmcache.gkm.io/NAME=ready, clustergkmcache.gkm.io/NAME=ready; see\n"
    "`gkm labels`). Leader-elected.\n\n"
    "  --leader-elect BOOL    take part in leader election (default true)\n"
    "  --identity ID          this replica's identity (default $POD_NAME, else host name)\n"
    "  --lease-name NAME      the Lease (default gkm-operator)\n"
    "  --verify-enabled BOOL  whether signatures are verified (default true); false:\n"
    "                         Verified says VerificationDisabled\n"
    "  --trust-dir DIR        trusted public keys: every PEM key of every file in DIR;\n"
    "                         with keys (or --key) the operator checks each cache's\n"
    "                         signature itself and Verified says what it found\n"
    "  --resolve-digests BOOL resolve tags to digests here, for clusters without the\n"
    "                         admission webhook (default: true when --verify-enabled "
    "false)\n"
    "  --agent-service-account NS/NAME\n"
    "                         the node agents' ServiceAccount: the operator keeps, in\n"
    "                         each namespace where caches name pull Secrets, a Role\n"
    "                         that may get exactly those (gkm-agent-pull-secrets) bound\n"
    "                         to it (default: none kept)\n"
    "  --kserve BOOL          kernel caches of KServe LocalModelCaches (annotation\n"
    "                         gkm.io/kernel-cache-image): a ClusterGKMCache each, placed\n"
    "                         in the node groups' storage (default false)\n" CLI_KEY_HELP HELP_KUBE
        HELP_COMMON CLI_REGISTRY_HELP;

static const char usage_up[] =
    "Usage: gkm up [--state DIR] [flags]\n\n"
    "Run the whole gkm pipeline on this machine without a cluster: the agent checks\n"
    "each cache against this machine's GPUs, pulls, verifies and extracts it; the\n"
    "operator aggregates the status. Objects live in DIR/objects (edit them with\n"
    "`gkm apply -f`, read them with `gkm get`), the store in DIR/store, the cache\n"
    "views (what the CSI plugin would mount) in DIR/caches.\n\n"
    "  --state DIR            state directory (default /var/lib/gkm/standalone)\n"
    "  --poll-ms MS           how often DIR is scanned for changes (default 250)\n" HELP_NODE
        HELP_COMMON CLI_REGISTRY_HELP;

static void host_name(char *buf, size_t len)
{
	char host[256] = "";
	size_t j = 0;
	gethostname(host, sizeof(host) - 1);
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

static int parse_bool(const char *cmd, const char *flag, const char *v, bool *out)
{
	if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes"))
		*out = true;
	else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no"))
		*out = false;
	else
		return cli_usage_error(cmd, "%s wants true or false, got '%s'", flag, v);
	return 0;
}

/* Options a role does not take are refused by name. */
static bool role_takes(enum role r, int opt)
{
	switch (opt) {
	case OPT_STATE:
	case OPT_POLL:
		return r == ROLE_UP;
	case OPT_KUBECONFIG:
	case OPT_CONTEXT:
	case OPT_NAMESPACE:
	case OPT_POLICY_CM:
		return r != ROLE_UP;
	case OPT_NODE:
	case OPT_GPU_SOURCE:
	case OPT_GPU_FILE:
	case OPT_SYSFS:
	case OPT_NVML:
	case OPT_MAX_PULLS:
	case OPT_STORE_HIGH:
	case OPT_STORE_LOW:
	case OPT_STORE_MAX:
	case OPT_STORE_MIN_AGE:
		return r & ROLE_AGENT;
	case OPT_ROOT:
	case OPT_RUN_DIR:
		return r == ROLE_AGENT;
	case OPT_LEADER:
	case OPT_IDENTITY:
	case OPT_LEASE:
	case OPT_RESOLVE:
	case OPT_KSERVE:
	case OPT_AGENT_SA:
		return r == ROLE_OPERATOR;
	default:
		return true;
	}
}

static void set_defaults(struct dflags *f)
{
	const char *env;
	host_name(f->node, sizeof(f->node));
	if ((env = getenv("NODE_NAME")) && obj_valid_name(env))
		snprintf(f->node, sizeof(f->node), "%s", env);
	/* the namespace the chart and the README install into */
	f->ns = getenv("POD_NAMESPACE") ? getenv("POD_NAMESPACE") : "gkm";
	f->identity = getenv("POD_NAME");
	f->policy_cm = "gkm-policies";
	f->lease_name = "gkm-operator";
	f->leader_elect = true;
	f->verify = true;
	/* one machine, one user: its credentials serve every namespace there */
	f->global_creds = f->role == ROLE_UP ? "*" : "";
	f->health_listen = f->role == ROLE_UP ? NULL : ":8081";
	f->state = "/var/lib/gkm/standalone";
	f->poll_ms = 250;
	f->ao.gpu_source = "auto";
	f->ao.root = "/var/lib/gkm";
	f->ao.run_dir = "/run/gkm";
	f->ao.store_high_percent = AGENT_STORE_HIGH_PERCENT;
	f->ao.store_low_percent = AGENT_STORE_LOW_PERCENT;
	f->ao.store_min_age_s = AGENT_STORE_MIN_AGE_S;
	cli_registry_init(&f->reg, false);
}

/* The flag parsers below take one flag each: 0 taken, EXIT_USAGE when its
 * value is wrong (said), -1 when it is not one of theirs. */

/* Where the objects and the policies come from, and the health endpoint. */
static int objects_flag(struct dflags *f, int opt, const char *arg)
{
	unsigned long long v;
	switch (opt) {
	case OPT_STATE:
		f->state = arg;
		return 0;
	case OPT_KUBECONFIG:
		f->kubeconfig = arg;
		return 0;
	case OPT_CONTEXT:
		f->context = arg;
		return 0;
	case OPT_NAMESPACE:
		if (!obj_valid_label(arg))
			return cli_usage_error(f->cmd, "--namespace '%s' is not a namespace name",
			                       arg);
		f->ns = arg;
		return 0;
	case OPT_POLICY_CM:
		if (!obj_valid_name(arg))
			return cli_usage_error(f->cmd,
			                       "--policy-configmap '%s' is not a valid name", arg);
		f->policy_cm = arg;
		return 0;
	case OPT_POLL:
		if (cli_parse_u64(arg, 60000, &v) != 0 || v < 10)
			return cli_usage_error(f->cmd, "--poll-ms wants 10 to 60000, got '%s'",
			                       arg);
		f->poll_ms = (unsigned)v;
		return 0;
	case OPT_POLICY_DIR:
		f->policy_dir = arg;
		return 0;
	case OPT_HEALTH:
		f->health_listen = arg; /* "": none */
		return 0;
	case OPT_GLOBAL_CREDS:
		if (!pull_secret_global_valid(arg))
			return cli_usage_error(f->cmd,
			                       "--global-credentials-namespaces '%s': want "
			                       "namespace names separated by commas, or *",
			                       arg);
		f->global_creds = arg;
		return 0;
	default:
		return -1;
	}
}

/* The node agent's: this node, its GPUs, its store and pulls. */
static int node_flag(struct dflags *f, int opt, const char *arg)
{
	unsigned long long v;
	switch (opt) {
	case OPT_NODE:
		if (!obj_valid_name(arg))
			return cli_usage_error(f->cmd, "--node '%s' is not a valid node name", arg);
		snprintf(f->node, sizeof(f->node), "%s", arg);
		return 0;
	case OPT_ROOT:
		f->ao.root = arg;
		return 0;
	case OPT_RUN_DIR:
		f->ao.run_dir = arg;
		return 0;
	case OPT_GPU_SOURCE:
		if (strcmp(arg, "auto") && strcmp(arg, "nvml") && strcmp(arg, "rocm") &&
		    strcmp(arg, "file"))
			return cli_usage_error(f->cmd,
			                       "--gpu-source wants auto, nvml, rocm or file");
		f->ao.gpu_source = arg;
		return 0;
	case OPT_GPU_FILE:
		f->ao.gpu_file = arg;
		return 0;
	case OPT_SYSFS:
		f->ao.sysfs_root = arg;
		return 0;
	case OPT_NVML:
		f->ao.nvml_lib = arg;
		return 0;
	case OPT_MAX_PULLS:
		if (cli_parse_u64(arg, 64, &v) != 0 || v == 0)
			return cli_usage_error(f->cmd, "--max-pulls wants 1 to 64, got '%s'", arg);
		f->ao.max_pulls = (unsigned)v;
		return 0;
	default:
		return -1;
	}
}

/* The agent's store budget. */
static int store_flag(struct dflags *f, int opt, const char *arg)
{
	unsigned long long v;
	uint64_t q;
	switch (opt) {
	case OPT_STORE_HIGH:
		if (cli_parse_u64(arg, 100, &v) != 0 || v < 2)
			return cli_usage_error(
			    f->cmd, "--store-high-percent wants 2 to 100, got '%s'", arg);
		f->ao.store_high_percent = (unsigned)v;
		return 0;
	case OPT_STORE_LOW:
		if (cli_parse_u64(arg, 99, &v) != 0 || v < 1)
			return cli_usage_error(f->cmd,
			                       "--store-low-percent wants 1 to 99, got '%s'", arg);
		f->ao.store_low_percent = (unsigned)v;
		return 0;
	case OPT_STORE_MAX:
		if (quantity_parse_bytes(arg, &q) != 0)
			return cli_usage_error(
			    f->cmd,
			    "--store-max-bytes wants a quantity of bytes (200Gi, "
			    "500G, 0 for no cap), got '%s'",
			    arg);
		f->ao.store_max_bytes = q;
		return 0;
	case OPT_STORE_MIN_AGE:
		if (cli_parse_u64(arg, 86400 * 365, &v) != 0)
			return cli_usage_error(f->cmd, "--store-min-age wants seconds, got '%s'",
			                       arg);
		f->ao.store_min_age_s = (unsigned)v;
		return 0;
	default:
		return -1;
	}
}

/* Trust, and the operator's: leadership, digests, KServe, pull Secrets. */
static int operator_flag(struct dflags *f, int opt, const char *arg)
{
	int rc;
	switch (opt) {
	case OPT_TRUST_DIR:
		f->trust_dir = arg;
		return 0;
	case OPT_VERIFY:
		return parse_bool(f->cmd, "--verify-enabled", arg, &f->verify);
	case OPT_LEADER:
		return parse_bool(f->cmd, "--leader-elect", arg, &f->leader_elect);
	case OPT_IDENTITY:
		f->identity = arg;
		return 0;
	case OPT_RESOLVE:
		if ((rc = parse_bool(f->cmd, "--resolve-digests", arg, &f->resolve_digests)))
			return rc;
		f->resolve_set = true;
		return 0;
	case OPT_KSERVE:
		return parse_bool(f->cmd, "--kserve", arg, &f->kserve);
	case OPT_AGENT_SA: {
		const char *sl = strchr(arg, '/');
		char ns[64];
		snprintf(ns, sizeof(ns), "%.*s", sl ? (int)(sl - arg) : 0, arg);
		if (!sl || !obj_valid_label(ns) || !obj_valid_name(sl + 1))
			return cli_usage_error(
			    f->cmd, "--agent-service-account '%s': want NAMESPACE/NAME", arg);
		f->agent_sa = arg;
		return 0;
	}
	case OPT_LEASE:
		if (!obj_valid_name(arg))
			return cli_usage_error(f->cmd, "--lease-name '%s' is not a valid name",
			                       arg);
		f->lease_name = arg;
		return 0;
	default:
		return -1;
	}
}

static int parse(struct dflags *f, int argc, char **argv, const char *usage)
{
	int c, rc;
	set_defaults(f);
	cli_reset();
	int exit_code;
	while ((c = cli_next(argc, argv, "h", all_opts, f->cmd, usage, &exit_code)) != -1) {
		if (c >= CLI_OPT_FIRST_FREE && c < CLI_OPT_AUTHFILE && !role_takes(f->role, c))
			return cli_usage_error(f->cmd, "unknown flag '%s' for this command",
			                       argv[optind - 1]);
		if ((rc = objects_flag(f, c, optarg)) < 0 && (rc = node_flag(f, c, optarg)) < 0 &&
		    (rc = store_flag(f, c, optarg)) < 0 && (rc = operator_flag(f, c, optarg)) < 0)
			rc = cli_registry_flag(&f->reg, c, optarg, f->cmd) < 0 ? EXIT_USAGE : 0;
		if (rc)
			return rc;
	}
	if (exit_code >= 0)
		return exit_code == EXIT_OK ? -1 : EXIT_USAGE;
	if (optind != argc)
		return cli_usage_error(f->cmd, "unexpected argument '%s'", argv[optind]);
	if (f->ao.gpu_file && !strcmp(f->ao.gpu_source, "auto"))
		f->ao.gpu_source = "file";
	if (!strcmp(f->ao.gpu_source, "file") && !f->ao.gpu_file)
		return cli_usage_error(f->cmd, "--gpu-source file needs --gpu-file");
	if (f->ao.store_low_percent >= f->ao.store_high_percent)
		return cli_usage_error(
		    f->cmd,
		    "--store-low-percent (%u) must be below --store-high-percent "
		    "(%u)",
		    f->ao.store_low_percent, f->ao.store_high_percent);
	if (!f->identity)
		f->identity = f->node;
	return 0;
}

/* ---- trusted keys ---- */

#define TRUST_POLL_MS 2000

/* --key files and every PEM key of every file in --trust-dir (a file that
 * holds none is refused, as the webhook refuses it), with --verify-enabled.
 * 0, or -errno with the reason printed. */
static int load_trust(struct daemon *d)
{
	struct dflags *f = d->f;
	char err[512] = "";
	d->trust_src.trust_dir = f->trust_dir;
	d->trust_src.key_files = f->reg.keys;
	d->trust_src.nkey_files = f->reg.nkeys;
	d->trust_src.defaults.verify_enabled = f->verify;
	int rc = trust_load(&d->trust_src, &d->trust, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s: trusted keys: %s\n", f->cmd, err[0] ? err : strerror(-rc));
		return rc;
	}
	memcpy(d->trust_seen, d->trust->digest, sizeof(d->trust_seen));
	if (f->verify && d->trust->nkeys == 0 && (f->role & ROLE_AGENT))
		log_warn(
		    "signature verification is on but no key is trusted: nothing is made Ready "
		    "until keys are given (--trust-dir, --key) or --verify-enabled false is set");
	return 0;
}

/* A key removed from the trust ConfigMap stops working without a restart;
 * one added starts working. */
static void trust_tick(struct loop *l, void *ud)
{
	struct daemon *d = ud;
	struct trust *t = NULL;
	if (trust_poll(&d->trust_src, d->trust, d->trust_seen, &t) == 1) {
		trust_unref(d->trust);
		d->trust = t;
		if (d->agent)
			agent_set_trust(d->agent, t);
		/* gkm up's operator checks nothing itself: its agent does */
		if (d->op && d->f->verify && d->f->role == ROLE_OPERATOR)
			operator_set_trust(d->op, t);
	}
	loop_add_timer(l, TRUST_POLL_MS, trust_tick, d);
}

/* ---- policies from a ConfigMap ---- */

static void on_policy_cm(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct daemon *d = ud;
	cJSON_Delete(d->policy_cm);
	d->policy_cm = t == OBJSTORE_DELETED ? NULL : cJSON_Duplicate(obj, 1);
	if (t == OBJSTORE_DELETED) {
		cJSON *none = cJSON_CreateObject();
		policy_watch_load_map(d->pw, none); /* back to the built-in policies */
		cJSON_Delete(none);
		return;
	}
	const cJSON *data = cJSON_GetObjectItemCaseSensitive(obj, "data");
	cJSON *empty = data ? NULL : cJSON_CreateObject();
	policy_watch_load_map(d->pw, data ? data : empty);
	cJSON_Delete(empty);
}

/* What became of a policy change, where users look: an Event on the
 * ConfigMap and annotations on it (written by the operator only, so a
 * thousand agents do not say it a thousand times; they log and count). */
struct policy_report {
	struct objstore *os;
	cJSON *cm;
	bool applied;
	char error[1024], digest[80], generation[24];
};

static void policy_report_work(void *ud)
{
	struct policy_report *r = ud;
	char err[256];
	cJSON *obj = cJSON_CreateObject();
	cJSON_AddStringToObject(obj, "apiVersion", "v1");
	cJSON_AddStringToObject(obj, "kind", "ConfigMap");
	cJSON *meta = cJSON_AddObjectToObject(obj, "metadata");
	cJSON_AddStringToObject(meta, "name", obj_str(r->cm, "metadata.name"));
	cJSON_AddStringToObject(meta, "namespace", obj_str(r->cm, "metadata.namespace"));
	cJSON *ann = cJSON_AddObjectToObject(meta, "annotations");
	cJSON_AddStringToObject(ann, "gkm.io/policy-status", r->applied ? "Applied" : "Refused");
	cJSON_AddStringToObject(ann, "gkm.io/policy-error", r->applied ? "" : r->error);
	cJSON_AddStringToObject(ann, "gkm.io/policy-digest", r->digest);
	cJSON_AddStringToObject(ann, "gkm.io/policy-generation", r->generation);
	if (r->os->ops->apply(r->os, obj, "gkm-operator", false, NULL, err, sizeof(err)) != 0)
		log_warn("cannot annotate the policies ConfigMap", "error", err);
	r->os->ops->event(r->os, r->cm, r->applied ? "Normal" : "Warning",
	                  r->applied ? "PoliciesApplied" : "PoliciesRefused",
	                  r->applied ? "the policies are in force" : r->error, "gkm-operator");
	cJSON_Delete(obj);
}

static void policy_report_done(struct loop *l, void *ud)
{
	struct policy_report *r = ud;
	(void)l;
	cJSON_Delete(r->cm);
	free(r);
}

static void on_policies(void *ud, bool applied, const char *error)
{
	struct daemon *d = ud;
	if (!applied)
		log_error("policy change refused; the previous policies stay in force", "error",
		          error);
	if (applied && d->agent)
		agent_policies_changed(d->agent);
	if (applied && d->op)
		operator_policies_changed(d->op);
	if (d->f->role != ROLE_OPERATOR || !d->policy_cm || !d->op)
		return;
	struct policy_report *r = calloc(1, sizeof(*r));
	if (!r)
		return;
	r->os = d->os;
	r->cm = cJSON_Duplicate(d->policy_cm, 1);
	r->applied = applied;
	snprintf(r->error, sizeof(r->error), "%s", error ? error : "");
	snprintf(r->digest, sizeof(r->digest), "%s",
	         d->slot.current ? engine_digest(d->slot.current) : "");
	snprintf(r->generation, sizeof(r->generation), "%llu",
	         (unsigned long long)d->slot.generation);
	if (workers_submit(d->workers, policy_report_work, policy_report_done, r) != 0)
		policy_report_done(d->loop, r);
}

/* SIGHUP: probe the GPUs again (a GPU was added or its driver upgraded). */
static void on_sighup(struct loop *l, void *ud)
{
	struct daemon *d = ud;
	(void)l;
	if (d->agent) {
		log_info("SIGHUP: probing the GPUs again");
		agent_reprobe(d->agent);
	}
}

/* ---- leadership ---- */

static void start_operator_on_loop(struct loop *l, void *ud)
{
	struct daemon *d = ud;
	(void)l;
	struct operator_opts oo = {.global_credentials = d->f->global_creds,
	                           .agent_service_account = d->f->agent_sa,
	                           .resolve_digests =
	                               d->f->resolve_set ? d->f->resolve_digests : !d->f->verify,
	                           .verification_enabled = d->f->verify,
	                           .watch_nodes = true,
	                           .kserve = d->f->kserve,
	                           .registry = &d->f->reg.reg,
	                           .trust = d->f->verify ? d->trust : NULL};
	if (d->op)
		return;
	int rc = operator_start(d->loop, d->workers, d->os, &d->slot, &oo, &d->op);
	if (rc) {
		log_error("cannot start the operator loop", "error", strerror(-rc));
		loop_stop(d->loop);
	}
}

static void lost_on_loop(struct loop *l, void *ud)
{
	struct daemon *d = ud;
	/* as controllers do: a replica that lost the lease exits and restarts
	 * clean rather than racing the new leader */
	log_error("lost leadership; exiting");
	d->lost_leadership = true;
	loop_stop(l);
}

static void lease_started(void *ud)
{
	struct daemon *d = ud;
	log_info("became the leader", "identity", d->f->identity);
	loop_post(d->loop, start_operator_on_loop, d);
}

/* Lease thread. Also called when the shutdown releases the Lease: that is
 * no lost leadership. */
static void lease_stopped(void *ud)
{
	struct daemon *d = ud;
	if (!atomic_load(&d->shutting_down))
		loop_post(d->loop, lost_on_loop, d);
}

/* ---- life cycle ---- */

static void ready_tick(struct loop *l, void *ud)
{
	struct daemon *d = ud;
	bool ready = (!d->agent || agent_ready(d->agent)) &&
	             (!d->op ? (d->f->role & ROLE_OPERATOR) == 0 || d->lease != NULL
	                     : operator_ready(d->op));
	health_set_ready(d->health, ready, ready ? NULL : "waiting for the first sync");
	health_beat(d->health, 30000);
	loop_add_timer(l, 1000, ready_tick, d);
}

/* The objects: a state directory (gkm up) or the API server. 0 or -1, said. */
static int open_objects(struct daemon *d)
{
	struct dflags *f = d->f;
	char err[1024];
	int rc;
	if (f->role != ROLE_UP) {
		if (objstore_kube_new(f->kubeconfig, f->context, d->loop,
		                      f->role == ROLE_AGENT ? "gkm-agent" : "gkm-operator", f->node,
		                      &d->os, err, sizeof(err)) != 0) {
			fprintf(stderr, "%s: cannot reach the Kubernetes API: %s\n", f->cmd, err);
			return -1;
		}
		return 0;
	}
	snprintf(d->run_dir, sizeof(d->run_dir), "%s/run", f->state);
	f->ao.root = f->state;
	f->ao.run_dir = d->run_dir;
	if ((rc = fsutil_mkdirs(d->run_dir, 0755)) ||
	    (rc = objstore_file_new(f->state, d->loop, f->poll_ms, &d->os))) {
		fprintf(stderr, "%s: cannot use state directory %s: %s\n", f->cmd, f->state,
		        strerror(-rc));
		return -1;
	}
	return 0;
}

/* The policies: --policy-dir, or the ConfigMap watched (gkm up: its state
 * directory's). A broken bundle at start-up is fatal; later reloads are
 * not. 0 or -1, said. */
static int start_policies(struct daemon *d)
{
	struct dflags *f = d->f;
	char err[1024], status_file[700] = "";
	int rc;
	if (f->role == ROLE_UP)
		snprintf(status_file, sizeof(status_file), "%s/policy-status.json", f->state);
	if (policy_watch_start(d->loop, &d->slot, f->policy_dir, 2000, status_file, on_policies, d,
	                       &d->pw, err, sizeof(err)) != 0) {
		fprintf(stderr, "%s: policies refused at start-up: %s\n", f->cmd, err);
		return -1;
	}
	if (f->role == ROLE_UP || f->policy_dir)
		return 0;
	char sel[300];
	snprintf(sel, sizeof(sel), "metadata.name=%s", f->policy_cm);
	struct objstore_watch cw = {.api_version = "v1",
	                            .kind = "ConfigMap",
	                            .namespace_ = f->ns,
	                            .field_selector = sel,
	                            .on_event = on_policy_cm,
	                            .ud = d};
	if ((rc = d->os->ops->watch(d->os, &cw))) {
		fprintf(stderr, "%s: cannot watch ConfigMap %s/%s: %s\n", f->cmd, f->ns,
		        f->policy_cm, strerror(-rc));
		return -1;
	}
	return 0;
}

/* The operator of gkm operator: at once, or when this replica leads. */
static int start_operator_role(struct daemon *d)
{
	struct dflags *f = d->f;
	if (!f->leader_elect) {
		start_operator_on_loop(d->loop, d);
		return 0;
	}
	struct kube_lease_opts lo = {.ns = f->ns,
	                             .name = f->lease_name,
	                             .identity = f->identity,
	                             .on_started = lease_started,
	                             .on_stopped = lease_stopped,
	                             .ud = d};
	int rc = kube_lease_start(objstore_kube_client(d->os), &lo, &d->lease);
	if (rc)
		fprintf(stderr, "%s: cannot start leader election: %s\n", f->cmd, strerror(-rc));
	return rc ? -1 : 0;
}

/* The control loops the role runs. 0 or -1, said. */
static int start_loops(struct daemon *d)
{
	struct dflags *f = d->f;
	int rc;
	if (f->role & ROLE_AGENT) {
		f->ao.node = f->node;
		f->ao.global_credentials = f->global_creds;
		f->ao.trust = d->trust;
		f->ao.registry = &f->reg.reg;
		f->ao.owner_node_refs = f->role == ROLE_AGENT;
		if (!f->verify)
			log_warn("signature verification on the node is off (--verify-enabled "
			         "false); the admission webhook remains the gate");
		if ((rc = agent_start(d->loop, d->workers, d->os, &d->slot, &f->ao, &d->agent))) {
			fprintf(stderr, "%s: cannot start the agent: %s\n", f->cmd, strerror(-rc));
			return -1;
		}
	}
	if (f->role == ROLE_OPERATOR)
		return start_operator_role(d);
	if (f->role == ROLE_UP) {
		struct operator_opts oo = {.global_credentials = f->global_creds,
		                           .resolve_digests = true,
		                           .verification_enabled = f->verify,
		                           .registry = &f->reg.reg};
		if ((rc = operator_start(d->loop, d->workers, d->os, &d->slot, &oo, &d->op))) {
			fprintf(stderr, "%s: cannot start the operator: %s\n", f->cmd,
			        strerror(-rc));
			return -1;
		}
	}
	return 0;
}

/* Stop everything started, in the order that lets work in flight end. */
static void daemon_stop(struct daemon *d)
{
	atomic_store(&d->shutting_down, true);
	if (d->agent)
		agent_quiesce(d->agent);
	if (d->op)
		operator_quiesce(d->op);
	kube_lease_stop(d->lease); /* releases the Lease: a successor starts at once */
	workers_free(d->workers);
	if (d->loop)
		loop_drain(d->loop);
	agent_stop(d->agent);
	operator_stop(d->op);
	health_stop(d->health);
	policy_watch_stop(d->pw);
	if (d->os)
		d->os->ops->free(d->os);
	engine_slot_clear(&d->slot);
	trust_unref(d->trust);
	cJSON_Delete(d->policy_cm);
	cli_registry_clear(&d->f->reg);
	loop_free(d->loop);
}

static int run(struct dflags *f)
{
	struct daemon d = {.f = f};
	int rc, code = EXIT_FAIL;
	engine_slot_init(&d.slot, NULL);
	if (load_trust(&d) != 0)
		goto out;
	if ((rc = loop_new(&d.loop)) || (rc = workers_new(d.loop, 4, &d.workers))) {
		fprintf(stderr, "%s: cannot start: %s\n", f->cmd, strerror(-rc));
		goto out;
	}
	if (open_objects(&d) || start_policies(&d))
		goto out;
	if ((rc = health_start(f->health_listen, &d.health))) {
		fprintf(stderr, "%s: cannot listen on %s: %s\n", f->cmd, f->health_listen,
		        strerror(-rc));
		goto out;
	}
	if (start_loops(&d))
		goto out;
	if (d.health)
		loop_add_timer(d.loop, 0, ready_tick, &d);
	loop_on_reload(d.loop, on_sighup, &d);
	loop_add_timer(d.loop, TRUST_POLL_MS, trust_tick, &d);
	log_info("running", "command", f->cmd, "node", f->node);
	rc = loop_run(d.loop);
	code = rc == 0 && !d.lost_leadership ? EXIT_OK : EXIT_FAIL;
out:
	daemon_stop(&d);
	return code;
}

static int daemon_main(enum role role, const char *cmd, const char *usage, int argc, char **argv)
{
	struct dflags f;
	memset(&f, 0, sizeof(f));
	f.role = role;
	f.cmd = cmd;
	int rc = parse(&f, argc, argv, usage);
	if (rc) {
		cli_registry_clear(&f.reg);
		return rc < 0 ? EXIT_OK : rc;
	}
	return run(&f);
}

int cmd_agent(int argc, char **argv)
{
	return daemon_main(ROLE_AGENT, "gkm agent", usage_agent, argc, argv);
}

int cmd_operator(int argc, char **argv)
{
	return daemon_main(ROLE_OPERATOR, "gkm operator", usage_operator, argc, argv);
}

int cmd_up(int argc, char **argv)
{
	return daemon_main(ROLE_UP, "gkm up", usage_up, argc, argv);
}
