/* gkm webhook: the admission webhook daemon. HTTPS (certificate and key
 * from files, swapped when they change), AdmissionReview v1 on /mutate and
 * /validate (webhook/reviewer.h) and, with --pod-placement, /mutate-pods
 * (webhook/pod_review.c, fed by watches of the caches), health and metrics
 * on a separate plain port, policies, trusted keys and settings reloaded
 * when their files change (a refused reload keeps the last good state). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission_review.h"
#include "cache_catalog.h"
#include "cli.h"
#include "cli_registry.h"
#include "cmd.h"
#include "engine.h"
#include "fsutil.h"
#include "health.h"
#include "https_server.h"
#include "log.h"
#include "loop.h"
#include "metrics.h"
#include "objstore_kube.h"
#include "placement_events.h"
#include "policy_watch.h"
#include "pull_secret.h"
#include "reviewer.h"
#include "trust.h"
#include "watched.h"
#include "workers.h"

#define CMD "gkm webhook"

static const char usage[] =
    "Usage: gkm webhook --tls-cert FILE --tls-key FILE [flags]\n"
    "\n"
    "Serve the admission webhook for GKMCache and ClusterGKMCache: AdmissionReview v1\n"
    "on POST /mutate (resolve the tag, verify signatures, run the admission policy,\n"
    "set annotation gkm.io/resolvedDigest) and POST /validate (refuse what policy\n"
    "forbids, malformed references, and a resolvedDigest set or changed by hand).\n"
    "Certificate, trusted keys, settings and policies are reloaded when their files\n"
    "change (the first three also on SIGHUP); a change that does not load keeps the\n"
    "last good one.\n"
    "\n"
    "  --listen ADDR              HTTPS address (default :8443)\n"
    "  --health-listen ADDR       /healthz, /readyz, /metrics over HTTP (default :8081;\n"
    "                             \"\" for none)\n"
    "  --tls-cert FILE            certificate chain, PEM (also --tls-cert-file)\n"
    "  --tls-key FILE             its private key, PEM (also --tls-key-file)\n"
    "  --trust-dir DIR            trusted public keys: every PEM public key in every\n"
    "                             file of DIR (a mounted Secret or ConfigMap)\n"
    "  --config PATH              settings: a YAML/JSON mapping, or a directory with one\n"
    "                             file per key (a mounted ConfigMap, also --config-dir);\n"
    "                             keys verify-enabled and allow-unsigned-images override\n"
    "                             the flags below; trust-keys-dir stands for --trust-dir\n"
    "                             when that is not given (read at start-up)\n"
    "  --verify-enabled BOOL      verify signatures (default true)\n"
    "  --allow-unsigned-images BOOL  admit images without signatures (default false)\n"
    "  --policy-dir DIR           policy files overriding the built-in ones (a mounted\n"
    "                             gkm-policies ConfigMap)\n"
    "  --deadline-ms MS           answer every review within MS (default 8000; keep it\n"
    "                             below the webhook configuration's timeoutSeconds)\n"
    "  --resolve-ttl S            how long a tag's digest is reused (default 30)\n"
    "  --verified-ttl S           how long a verified verdict is reused (default 600)\n"
    "  --rejected-ttl S           how long an unsigned/unverified verdict is reused\n"
    "                             (default 30)\n"
    "  --cache-entries N          entries per cache (default 4096)\n"
    "  --workers N                threads for registry checks (default 4)\n"
    "  --https-threads N          HTTPS threads (default 2)\n"
    "  --max-checks N             registry checks in flight (default 64)\n"
    "  --global-credentials-namespaces LIST  namespaces whose GKMCaches the registry\n"
    "                             credentials below serve (\"a,b\", \"*\": all; default:\n"
    "                             none); ClusterGKMCaches always, the others anonymously\n"
    "  --reload-interval-ms MS    how often files are checked for changes (default 2000)\n"
    "\n"
    "Pod placement (POST /mutate-pods, AdmissionReview v1 for Pods):\n"
    "  --pod-placement BOOL       serve /mutate-pods: node affinity for the caches a pod\n"
    "                             mounts (policies/placement.lua), image volumes that name\n"
    "                             a cache image verified and pinned (default false)\n"
    "  --kubeconfig FILE          where the caches are watched (default: in-cluster,\n"
    "                             else $KUBECONFIG); Events are recorded there too\n"
    "  --context NAME             kubeconfig context (default: the current one)\n"
    "  --exclude-namespaces LIST  pods of these namespaces are never changed (default\n"
    "                             kube-system,kube-public,kube-node-lease)\n"
    "  --event-interval-ms MS     Events about placements are written at most this\n"
    "                             often per cache and reason (default 2000)\n"
    "\n" CLI_REGISTRY_HELP
    "  In the webhook --timeout defaults to 3, --retries to 1, and no registry call\n"
    "  outlasts --deadline-ms. --key files are trusted besides --trust-dir's keys and\n"
    "  are reloaded the same way.\n";

enum {
	OPT_LISTEN = CLI_OPT_FIRST_FREE,
	OPT_HEALTH,
	OPT_CERT,
	OPT_KEY,
	OPT_TRUST,
	OPT_CONFIG,
	OPT_VERIFY,
	OPT_UNSIGNED,
	OPT_POLICY,
	OPT_DEADLINE,
	OPT_RESOLVE_TTL,
	OPT_VERIFIED_TTL,
	OPT_REJECTED_TTL,
	OPT_CACHE,
	OPT_WORKERS,
	OPT_HTTPS_THREADS,
	OPT_MAX_CHECKS,
	OPT_RELOAD,
	OPT_PLACEMENT,
	OPT_KUBECONFIG,
	OPT_CONTEXT,
	OPT_EXCLUDE,
	OPT_EVENT_INTERVAL,
	OPT_GLOBAL_CREDS,
};

#define EXCLUDE_MAX 64

struct webhook {
	const char *listen, *health_listen, *cert_file, *key_file, *policy_dir;
	struct trust_source trust_src;
	uint64_t reload_ms;
	struct loop *loop;
	struct workers *workers;
	struct engine_slot policy;
	struct policy_watch *policies;
	struct trust *trust;
	struct reviewer *reviewer;
	struct https_server *https;
	struct health_server *health;
	/* what was last tried, so a refused change is reported once */
	char cert_digest[132], trust_digest[65];
	struct metric *m_reloads, *m_cert_expiry, *m_refused;
	/* pod placement */
	bool placement;
	const char *kubeconfig, *context;
	const char *exclude[EXCLUDE_MAX + 1];
	char *exclude_buf;
	uint64_t event_interval_ms;
	struct objstore *store;
	struct cache_catalog catalog;
	struct placement_events *events;
	unsigned synced; /* cache lists complete (of 2) */
};

static void reload_metric(struct webhook *w, const char *what, const char *result)
{
	metrics_add(w->m_reloads, METRICS_L(what, result), 1);
	metrics_set(w->m_refused, METRICS_L(what), strcmp(result, "refused") == 0 ? 1 : 0);
}

static int read_pair(const struct webhook *w, char **cert, size_t *cl, char **key, size_t *kl,
                     char *err, size_t errlen)
{
	int rc = fsutil_read_file(w->cert_file, WATCHED_MAX_FILE, cert, cl);
	if (rc != 0) {
		snprintf(err, errlen, "%s: %s", w->cert_file, strerror(-rc));
		return rc;
	}
	if ((rc = fsutil_read_file(w->key_file, WATCHED_MAX_FILE, key, kl)) != 0) {
		snprintf(err, errlen, "%s: %s", w->key_file, strerror(-rc));
		free(*cert);
	}
	return rc;
}

static int pair_digest(const struct webhook *w, char out[132], char *err, size_t errlen)
{
	char c[65], k[65];
	int rc;
	if ((rc = watched_digest(w->cert_file, c, err, errlen)) != 0 ||
	    (rc = watched_digest(w->key_file, k, err, errlen)) != 0)
		return rc;
	snprintf(out, 132, "%s:%s", c, k);
	return 0;
}

static void note_expiry(struct webhook *w, const char *cert, size_t cl, const char *key, size_t kl)
{
	int64_t not_after = 0;
	char err[256];
	if (https_check_pair(cert, cl, key, kl, &not_after, err, sizeof(err)) == 0)
		metrics_set(w->m_cert_expiry, NULL, (double)not_after);
}

static void reload_cert(struct webhook *w)
{
	char digest[132], err[512];
	char *cert = NULL, *key = NULL;
	size_t cl = 0, kl = 0;
	if (pair_digest(w, digest, err, sizeof(err)) != 0) {
		/* reported once, until the files are readable again */
		if (strcmp(w->cert_digest, "unreadable") != 0) {
			log_warn("TLS certificate or key unreadable; still serving the previous "
			         "pair",
			         "error", err);
			reload_metric(w, "certificate", "refused");
			snprintf(w->cert_digest, sizeof(w->cert_digest), "unreadable");
		}
		return;
	}
	if (strcmp(digest, w->cert_digest) == 0)
		return;
	memcpy(w->cert_digest, digest, sizeof(digest));
	if (read_pair(w, &cert, &cl, &key, &kl, err, sizeof(err)) != 0 ||
	    https_set_cert(w->https, cert, cl, key, kl, err, sizeof(err)) != 0) {
		/* a certificate written before its key mismatches for one turn */
		log_warn("new TLS certificate refused; still serving the previous one", "error",
		         err);
		reload_metric(w, "certificate", "refused");
	} else {
		note_expiry(w, cert, cl, key, kl);
		log_info("TLS certificate reloaded", "cert", w->cert_file);
		reload_metric(w, "certificate", "applied");
	}
	free(cert);
	free(key);
}

static void reload_trust(struct webhook *w)
{
	struct trust *t = NULL;
	bool unreadable = strcmp(w->trust_digest, "unreadable") == 0;
	int rc = trust_poll(&w->trust_src, w->trust, w->trust_digest, &t);
	if (rc < 0 && !(unreadable && strcmp(w->trust_digest, "unreadable") == 0))
		reload_metric(w, "trust", "refused");
	if (rc <= 0)
		return;
	reviewer_set_trust(w->reviewer, t);
	trust_unref(w->trust);
	w->trust = t;
	reload_metric(w, "trust", "applied");
}

/* Called by the policy watch after a reload was applied or refused. */
static void on_policies(void *ud, bool applied, const char *error)
{
	reload_metric(ud, "policy", applied ? "applied" : "refused");
}

static void tick(struct loop *l, void *ud)
{
	struct webhook *w = ud;
	health_beat(w->health, w->reload_ms * 5 > 10000 ? w->reload_ms * 5 : 10000);
	reload_cert(w);
	reload_trust(w);
	https_reap(w->https);
	if (!loop_add_timer(l, w->reload_ms, tick, w))
		log_error("cannot schedule the reload timer", "error", "out of memory");
}

static void on_hup(struct loop *l, void *ud)
{
	struct webhook *w = ud;
	log_info("SIGHUP: checking certificate and trust");
	reload_cert(w);
	reload_trust(w);
}

/* The trusted keys' directory a configuration directory names (the chart's
 * gkm-config ConfigMap has a key trust-keys-dir). 0 when there is one. */
static int config_trust_dir(const char *config, char *out, size_t cap)
{
	char path[4096], *val = NULL;
	size_t len = 0;
	if ((size_t)snprintf(path, sizeof(path), "%s/trust-keys-dir", config) >= sizeof(path) ||
	    fsutil_read_file(path, 4096, &val, &len) != 0)
		return -ENOENT;
	while (len && (val[len - 1] == '\n' || val[len - 1] == ' '))
		val[--len] = '\0';
	int rc = len && len < cap ? 0 : -EINVAL;
	if (rc == 0)
		memcpy(out, val, len + 1);
	free(val);
	return rc;
}

static int parse_bool_flag(const char *flag, const char *arg, bool *out)
{
	if (trust_parse_bool(arg, out) != 0)
		return cli_usage_error(CMD, "%s wants true or false, got '%s'", flag, arg);
	return 0;
}

static int parse_num(const char *flag, const char *arg, unsigned long long min,
                     unsigned long long max, unsigned long long *out)
{
	if (cli_parse_u64(arg, max, out) != 0 || *out < min)
		return cli_usage_error(CMD, "%s wants a number from %llu to %llu, got '%s'", flag,
		                       min, max, arg);
	return 0;
}

/* ---- the caches, for pod placement ---- */

static void on_cache(struct webhook *w, bool cluster, enum objstore_event_type t, const cJSON *obj)
{
	if (t == OBJSTORE_DELETED)
		cache_catalog_remove(&w->catalog, cluster, obj);
	else if (cache_catalog_put(&w->catalog, cluster, obj) == -ENOMEM)
		log_error("cannot record a cache for placement", "error", "out of memory", "name",
		          obj_str(obj, "metadata.name"));
}

static void on_gkmcache(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	on_cache(ud, false, t, obj);
}

static void on_clustergkmcache(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	on_cache(ud, true, t, obj);
}

static void on_caches_synced(void *ud)
{
	struct webhook *w = ud;
	if (++w->synced < 2)
		return;
	char n[24];
	snprintf(n, sizeof(n), "%zu", cache_catalog_len(&w->catalog));
	log_info("cache lists loaded; pod placement ready", "caches", n);
	if (w->reviewer)
		reviewer_set_catalog_synced(w->reviewer, true);
	if (w->health)
		health_set_ready(w->health, true, NULL);
}

static int start_placement(struct webhook *w, char *err, size_t errlen)
{
	static const char *const kinds[] = {"GKMCache", "ClusterGKMCache"};
	objstore_event_fn fns[] = {on_gkmcache, on_clustergkmcache};
	int rc = objstore_kube_new(w->kubeconfig, w->context, w->loop, "gkm-webhook", NULL,
	                           &w->store, err, errlen);
	if (rc != 0)
		return rc;
	for (int i = 0; i < 2; i++) {
		struct objstore_watch ow = {.api_version = GKM_API_VERSION,
		                            .kind = kinds[i],
		                            .on_event = fns[i],
		                            .on_synced = on_caches_synced,
		                            .ud = w,
		                            .no_cache = true};
		if ((rc = w->store->ops->watch(w->store, &ow)) != 0) {
			snprintf(err, errlen, "cannot watch %ss: %s", kinds[i], strerror(-rc));
			return rc;
		}
	}
	if ((rc = placement_events_new(w->loop, w->store, w->event_interval_ms, &w->events)) != 0)
		snprintf(err, errlen, "cannot start the Event writer: %s", strerror(-rc));
	return rc;
}

/* "a,b,c" into w->exclude (NULL-terminated). */
static int parse_exclude(struct webhook *w, const char *list)
{
	free(w->exclude_buf);
	if (!(w->exclude_buf = strdup(list)))
		return -ENOMEM;
	size_t n = 0;
	char *save = NULL;
	for (char *t = strtok_r(w->exclude_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		while (*t == ' ')
			t++;
		if (!*t)
			continue;
		if (n == EXCLUDE_MAX)
			return cli_usage_error(CMD, "--exclude-namespaces names more than %d",
			                       EXCLUDE_MAX);
		if (!obj_valid_label(t))
			return cli_usage_error(CMD, "--exclude-namespaces: '%s' is not a namespace",
			                       t);
		w->exclude[n++] = t;
	}
	w->exclude[n] = NULL;
	return 0;
}

/* What start-up needs besides struct webhook: the reviewer's and the HTTPS
 * server's options, the registry flags, and the first certificate pair. */
struct setup {
	struct reviewer_opts ro;
	struct https_opts ho;
	unsigned long long nworkers;
	struct cli_registry creg;
	char trust_dir[4096]; /* --config's trust-keys-dir */
	char *cert, *key;     /* the pair read at start-up */
	size_t cl, kl;
};

/* A flag with a number: 0, or the exit status of a usage error. Anything
 * else is a registry flag (cli_registry.h). */
static int set_num_flag(struct webhook *w, struct setup *s, int c, const char *arg)
{
	struct reviewer_opts *ro = &s->ro;
	unsigned long long v;
	int rc = 0;
	switch (c) {
	case OPT_DEADLINE:
		if (!(rc = parse_num("--deadline-ms", arg, 100, 60000, &v)))
			ro->deadline_ms = v;
		break;
	case OPT_RESOLVE_TTL:
		if (!(rc = parse_num("--resolve-ttl", arg, 0, 86400, &v)))
			ro->resolve_ttl_ms = v * 1000;
		break;
	case OPT_VERIFIED_TTL:
		if (!(rc = parse_num("--verified-ttl", arg, 0, 86400 * 7, &v)))
			ro->verified_ttl_ms = v * 1000;
		break;
	case OPT_REJECTED_TTL:
		if (!(rc = parse_num("--rejected-ttl", arg, 0, 86400, &v)))
			ro->rejected_ttl_ms = v * 1000;
		break;
	case OPT_CACHE:
		if (!(rc = parse_num("--cache-entries", arg, 16, 1u << 20, &v)))
			ro->cache_entries = v;
		break;
	case OPT_WORKERS:
		rc = parse_num("--workers", arg, 1, 64, &s->nworkers);
		break;
	case OPT_HTTPS_THREADS:
		if (!(rc = parse_num("--https-threads", arg, 1, 64, &v)))
			s->ho.threads = (unsigned)v;
		break;
	case OPT_MAX_CHECKS:
		if (!(rc = parse_num("--max-checks", arg, 1, 4096, &v)))
			ro->max_jobs = (unsigned)v;
		break;
	case OPT_RELOAD:
		if (!(rc = parse_num("--reload-interval-ms", arg, 50, 3600000, &v)))
			w->reload_ms = v;
		break;
	case OPT_EVENT_INTERVAL:
		if (!(rc = parse_num("--event-interval-ms", arg, 10, 600000, &v)))
			w->event_interval_ms = v;
		break;
	default:
		if ((rc = cli_registry_flag(&s->creg, c, arg, CMD)) != 0)
			rc = rc < 0 ? EXIT_USAGE : 0;
	}
	return rc;
}

/* One flag: 0, or the exit status of a usage error. */
static int set_flag(struct webhook *w, struct setup *s, int c, const char *arg)
{
	int rc = 0;
	switch (c) {
	case OPT_LISTEN:
		w->listen = arg;
		break;
	case OPT_HEALTH:
		w->health_listen = arg;
		break;
	case OPT_CERT:
		w->cert_file = arg;
		break;
	case OPT_KEY:
		w->key_file = arg;
		break;
	case OPT_TRUST:
		w->trust_src.trust_dir = arg;
		break;
	case OPT_CONFIG:
		w->trust_src.config_path = arg;
		break;
	case OPT_VERIFY:
		rc =
		    parse_bool_flag("--verify-enabled", arg, &w->trust_src.defaults.verify_enabled);
		break;
	case OPT_UNSIGNED:
		rc = parse_bool_flag("--allow-unsigned-images", arg,
		                     &w->trust_src.defaults.allow_unsigned);
		break;
	case OPT_POLICY:
		w->policy_dir = arg;
		break;
	case OPT_PLACEMENT:
		rc = parse_bool_flag("--pod-placement", arg, &w->placement);
		break;
	case OPT_KUBECONFIG:
		w->kubeconfig = arg;
		break;
	case OPT_CONTEXT:
		w->context = arg;
		break;
	case OPT_EXCLUDE:
		rc = parse_exclude(w, arg);
		break;
	case OPT_GLOBAL_CREDS:
		if (!pull_secret_global_valid(arg))
			rc = cli_usage_error(CMD,
			                     "--global-credentials-namespaces '%s': want namespace "
			                     "names separated by commas, or *",
			                     arg);
		s->ro.global_credentials = arg;
		break;
	default:
		rc = set_num_flag(w, s, c, arg);
	}
	return rc;
}

/* The command line into w and s. -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct webhook *w, struct setup *s)
{
	static const struct option opts[] = {
	    CLI_COMMON_OPTIONS,
	    {"listen", required_argument, 0, OPT_LISTEN},
	    {"health-listen", required_argument, 0, OPT_HEALTH},
	    {"tls-cert", required_argument, 0, OPT_CERT},
	    {"tls-cert-file", required_argument, 0, OPT_CERT},
	    {"tls-key", required_argument, 0, OPT_KEY},
	    {"tls-key-file", required_argument, 0, OPT_KEY},
	    {"trust-dir", required_argument, 0, OPT_TRUST},
	    {"config", required_argument, 0, OPT_CONFIG},
	    {"config-dir", required_argument, 0, OPT_CONFIG},
	    {"verify-enabled", required_argument, 0, OPT_VERIFY},
	    {"allow-unsigned-images", required_argument, 0, OPT_UNSIGNED},
	    {"policy-dir", required_argument, 0, OPT_POLICY},
	    {"deadline-ms", required_argument, 0, OPT_DEADLINE},
	    {"resolve-ttl", required_argument, 0, OPT_RESOLVE_TTL},
	    {"verified-ttl", required_argument, 0, OPT_VERIFIED_TTL},
	    {"rejected-ttl", required_argument, 0, OPT_REJECTED_TTL},
	    {"cache-entries", required_argument, 0, OPT_CACHE},
	    {"workers", required_argument, 0, OPT_WORKERS},
	    {"https-threads", required_argument, 0, OPT_HTTPS_THREADS},
	    {"max-checks", required_argument, 0, OPT_MAX_CHECKS},
	    {"reload-interval-ms", required_argument, 0, OPT_RELOAD},
	    {"pod-placement", required_argument, 0, OPT_PLACEMENT},
	    {"kubeconfig", required_argument, 0, OPT_KUBECONFIG},
	    {"context", required_argument, 0, OPT_CONTEXT},
	    {"exclude-namespaces", required_argument, 0, OPT_EXCLUDE},
	    {"event-interval-ms", required_argument, 0, OPT_EVENT_INTERVAL},
	    {"global-credentials-namespaces", required_argument, 0, OPT_GLOBAL_CREDS},
	    CLI_REGISTRY_OPTIONS,
	    CLI_KEY_OPTION,
	    {0, 0, 0, 0},
	};
	int c, rc = 0, quit = -1;
	cli_reset();
	while ((c = cli_next(argc, argv, "h", opts, CMD, usage, &quit)) != -1)
		if ((rc = set_flag(w, s, c, optarg)) != 0)
			return rc < 0 ? EXIT_FAIL : rc; /* -ENOMEM from parse_exclude */
	if (quit >= 0)
		return quit;
	if (optind < argc)
		return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
	if (!w->cert_file || !w->key_file)
		return cli_usage_error(CMD, "--tls-cert and --tls-key are required");
	return -1;
}

/* What follows from the flags together: the trusted keys' sources, and
 * registry calls that end before the review's deadline. */
static void settle_options(struct webhook *w, struct setup *s)
{
	s->ro.registry = s->creg.reg;
	if (!w->trust_src.trust_dir && w->trust_src.config_path &&
	    config_trust_dir(w->trust_src.config_path, s->trust_dir, sizeof(s->trust_dir)) == 0)
		w->trust_src.trust_dir = s->trust_dir;
	w->trust_src.key_files = s->creg.keys;
	w->trust_src.nkey_files = s->creg.nkeys;
	unsigned secs = s->ro.deadline_ms >= 2000 ? (unsigned)(s->ro.deadline_ms / 1000) : 1;
	struct oci_registry_opts *rg = &s->ro.registry;
	if (rg->request_timeout_s > secs)
		rg->request_timeout_s = secs;
	if (rg->stall_timeout_s > rg->request_timeout_s)
		rg->stall_timeout_s = rg->request_timeout_s;
	if (rg->connect_timeout_s > rg->request_timeout_s)
		rg->connect_timeout_s = rg->request_timeout_s;
}

static void register_metrics(struct webhook *w)
{
	w->m_reloads = metrics_counter("gkm_webhook_reloads_total",
	                               "Reloads of certificate, trust configuration and policies, "
	                               "by result (applied, unchanged, refused)",
	                               "what,result");
	w->m_refused = metrics_gauge("gkm_webhook_reload_refused",
	                             "1 while the newest version of a watched source is refused "
	                             "and the previous one is in use",
	                             "what");
	placement_events_metric();
	w->m_cert_expiry = metrics_gauge("gkm_webhook_certificate_expiry_timestamp_seconds",
	                                 "notAfter of the serving certificate (Unix time)", NULL);
}

/* Policies, trusted keys and the certificate pair, as they are at start-up.
 * 0, or -1 with the problem printed. */
static int load_sources(struct webhook *w, struct setup *s)
{
	char err[1200];
	if (policy_watch_start(w->loop, &w->policy, w->policy_dir, (unsigned)w->reload_ms, NULL,
	                       on_policies, w, &w->policies, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD ": policies: %s\n", err);
		return -1;
	}
	if (trust_load(&w->trust_src, &w->trust, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD ": trust: %s\n", err);
		return -1;
	}
	memcpy(w->trust_digest, w->trust->digest, sizeof(w->trust_digest));
	if (w->trust->s.verify_enabled && w->trust->nkeys == 0)
		log_warn("signature verification is on but no trusted keys are configured: "
		         "signed images will be refused",
		         "trust_dir", w->trust_src.trust_dir ? w->trust_src.trust_dir : "(none)");
	if (read_pair(w, &s->cert, &s->cl, &s->key, &s->kl, err, sizeof(err)) != 0 ||
	    pair_digest(w, w->cert_digest, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD ": TLS: %s\n", err);
		return -1;
	}
	return 0;
}

/* The cache watches (with --pod-placement), the workers and the reviewer.
 * 0, or -1 with the problem printed. */
static int start_reviewer(struct webhook *w, struct setup *s)
{
	char err[1200];
	int rc;
	if (w->placement && start_placement(w, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD ": pod placement: %s\n", err);
		return -1;
	}
	if ((rc = workers_new(w->loop, (unsigned)s->nworkers, &w->workers)) != 0) {
		fprintf(stderr, CMD ": cannot start workers: %s\n", strerror(-rc));
		return -1;
	}
	s->ro.loop = w->loop;
	s->ro.workers = w->workers;
	s->ro.policy = &w->policy;
	if (w->placement) {
		s->ro.catalog = &w->catalog;
		s->ro.exclude_namespaces = w->exclude;
		s->ro.events = w->events;
	}
	if ((rc = reviewer_new(&s->ro, w->trust, &w->reviewer)) != 0) {
		fprintf(stderr, CMD ": %s\n", strerror(-rc));
		return -1;
	}
	return 0;
}

/* The health endpoint, HTTPS and the reload timer. 0, or -1 with the
 * problem printed. */
static int start_serving(struct webhook *w, struct setup *s)
{
	char err[1200];
	int rc;
	if ((rc = health_start(w->health_listen, &w->health)) != 0) {
		fprintf(stderr, CMD ": cannot serve health on '%s': %s\n", w->health_listen,
		        strerror(-rc));
		return -1;
	}
	s->ho.listen = w->listen;
	s->ho.handler = reviewer_handle;
	s->ho.ud = w->reviewer;
	if (https_start(&s->ho, s->cert, s->cl, s->key, s->kl, &w->https, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD ": HTTPS: %s\n", err);
		return -1;
	}
	note_expiry(w, s->cert, s->cl, s->key, s->kl);
	loop_on_reload(w->loop, on_hup, w);
	if (!loop_add_timer(w->loop, w->reload_ms, tick, w)) {
		fprintf(stderr, CMD ": out of memory\n");
		return -1;
	}
	health_beat(w->health, w->reload_ms * 5 > 10000 ? w->reload_ms * 5 : 10000);
	/* with placement, ready once the cache lists are loaded (on_caches_synced) */
	if (w->placement)
		health_set_ready(w->health, false, "loading the cache lists for pod placement");
	else
		health_set_ready(w->health, true, NULL);
	return 0;
}

/* Serve until a signal ends the loop: the exit status. */
static int run(struct webhook *w)
{
	char port[8], hport[8], nkeys[24];
	snprintf(port, sizeof(port), "%u", https_port(w->https));
	snprintf(hport, sizeof(hport), "%u", health_port(w->health));
	snprintf(nkeys, sizeof(nkeys), "%zu", w->trust->nkeys);
	log_info("webhook serving", "https_port", port, "health_port", hport, "policy",
	         engine_digest(w->policy.current), "keys", nkeys, "verify_enabled",
	         w->trust->s.verify_enabled ? "true" : "false", "allow_unsigned",
	         w->trust->s.allow_unsigned ? "true" : "false", "pod_placement",
	         w->placement ? "true" : "false");
	int rc = loop_run(w->loop);
	health_set_ready(w->health, false, "shutting down");
	return rc == 0 ? EXIT_OK : EXIT_FAIL;
}

static void clean_up(struct webhook *w, struct setup *s)
{
	/* finish running registry checks and decide the reviews waiting for
	 * them; answer whatever still waits */
	if (w->reviewer)
		reviewer_refuse_new(w->reviewer);
	workers_free(w->workers);
	placement_events_free(w->events);
	if (w->loop)
		loop_drain(w->loop);
	if (w->reviewer)
		reviewer_close(w->reviewer);
	https_stop(w->https);
	health_stop(w->health);
	reviewer_free(w->reviewer);
	trust_unref(w->trust);
	policy_watch_stop(w->policies);
	engine_slot_clear(&w->policy);
	if (w->store)
		w->store->ops->free(w->store);
	cache_catalog_clear(&w->catalog);
	free(w->exclude_buf);
	loop_free(w->loop);
	free(s->cert);
	free(s->key);
	cli_registry_clear(&s->creg);
}

int cmd_webhook(int argc, char **argv)
{
	struct webhook w = {.listen = ":8443",
	                    .health_listen = ":8081",
	                    .reload_ms = 2000,
	                    .event_interval_ms = 2000};
	struct setup s = {
	    .ro =
	        {
	            .deadline_ms = 8000,
	            .resolve_ttl_ms = 30000,
	            .verified_ttl_ms = 600000,
	            .rejected_ttl_ms = 30000,
	            .cache_entries = 4096,
	            .max_jobs = 64,
	        },
	    .ho = {.threads = 2, .max_body = ADMISSION_MAX_BYTES},
	    .nworkers = 4,
	};
	int rc, exit_code = EXIT_FAIL;
	w.trust_src.defaults.verify_enabled = true;
	cache_catalog_init(&w.catalog);
	if (parse_exclude(&w, "kube-system,kube-public,kube-node-lease") != 0)
		return EXIT_FAIL;
	cli_registry_init(&s.creg, false);
	s.creg.reg.connect_timeout_s = 3;
	s.creg.reg.retries = 1;
	s.creg.reg.backoff_ms = 200;
	if ((rc = parse_args(argc, argv, &w, &s)) >= 0) {
		cli_registry_clear(&s.creg);
		free(w.exclude_buf);
		return rc;
	}
	settle_options(&w, &s);
	engine_slot_init(&w.policy, NULL);
	register_metrics(&w);
	if ((rc = loop_new(&w.loop)) != 0) {
		fprintf(stderr, CMD ": cannot create the event loop: %s\n", strerror(-rc));
		return EXIT_FAIL;
	}
	/* start-up problems are fatal: nothing is served on a half configuration */
	if (load_sources(&w, &s) == 0 && start_reviewer(&w, &s) == 0 && start_serving(&w, &s) == 0)
		exit_code = run(&w);
	clean_up(&w, &s);
	return exit_code;
}
