/* kubetool: a test driver for the Kubernetes client (core/kube_*.c), used by
 * the end-to-end tests and the benchmark. One verb per invocation; results
 * and errors are JSON on stdout so tests can assert them:
 *
 *   kubetool get APIVERSION KIND NS NAME
 *   kubetool list APIVERSION KIND NS [--selector S] [--field S] [--limit N]
 *   kubetool create FILE | replace FILE          (JSON or YAML)
 *   kubetool apply FILE --manager M [--force] [--status]
 *   kubetool delete APIVERSION KIND NS NAME [--uid U] [--rv RV]
 *   kubetool event APIVERSION KIND NS NAME REASON MESSAGE [--type T]
 *   kubetool watch APIVERSION KIND NS [--selector S] [--seconds N] [--timeout-s N] [--stall-ms N]
 *       one JSON line per cache change, "synced" once listed, stats at the end
 *   kubetool lease NS NAME IDENTITY [--duration-ms N --renew-ms N --retry-ms N]
 *       prints "leading" / "stopped" / "holder ID" lines until SIGTERM
 *   kubetool controller BUNDLE_DIR MODULE --manager M [--config JSON]
 *       runs a Lua controller (kube_controller.h) from the policy bundle in
 *       BUNDLE_DIR until SIGTERM; prints its stats at the end
 *   kubetool bench APIVERSION KIND NS --expect N
 *       informer throughput and memory: waits until N objects are cached
 *
 * An error prints {"error":{"code":..,"reason":..,"message":..,"causes":[..]}}
 * and exits 1. The kubeconfig is $KUBECONFIG (or --kubeconfig F first). */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bundle.h"
#include "engine.h"
#include "kube_client.h"
#include "kube_controller.h"
#include "kube_config.h"
#include "kube_informer.h"
#include "kube_lease.h"
#include "log.h"
#include "loop.h"
#include "workers.h"

static struct kube_client *client;

static const char *opt(int argc, char **argv, const char *name)
{
	for (int i = 0; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return argv[i + 1];
	return NULL;
}

static int flag(int argc, char **argv, const char *name)
{
	for (int i = 0; i < argc; i++)
		if (!strcmp(argv[i], name))
			return 1;
	return 0;
}

static int fail(const struct kube_error *e, int rc)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *er = cJSON_AddObjectToObject(o, "error");
	cJSON_AddNumberToObject(er, "code", (double)e->http_code);
	cJSON_AddStringToObject(er, "reason", e->reason_text);
	cJSON_AddStringToObject(er, "message", e->message);
	cJSON_AddNumberToObject(er, "errno", -rc);
	cJSON *causes = cJSON_AddArrayToObject(er, "causes");
	for (unsigned i = 0; i < e->ncauses; i++) {
		cJSON *c = cJSON_CreateObject();
		cJSON_AddStringToObject(c, "reason", e->causes[i].reason);
		cJSON_AddStringToObject(c, "field", e->causes[i].field);
		cJSON_AddStringToObject(c, "message", e->causes[i].message);
		cJSON_AddItemToArray(causes, c);
	}
	char *s = cJSON_PrintUnformatted(o);
	printf("%s\n", s);
	free(s);
	cJSON_Delete(o);
	return 1;
}

static int print_obj(cJSON *o)
{
	char *s = cJSON_PrintUnformatted(o);
	printf("%s\n", s ? s : "null");
	free(s);
	cJSON_Delete(o);
	return 0;
}

static int resource(const char *av, const char *kind, struct kube_resource *r)
{
	struct kube_error e;
	int rc = kube_client_resource(client, av, kind, r, &e);
	if (rc < 0)
		fail(&e, rc);
	return rc;
}

static cJSON *read_doc(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return NULL;
	}
	char *buf = malloc(1 << 20);
	size_t n = fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	buf[n] = 0;
	cJSON *j = NULL;
	char err[256];
	if (kube_config_yaml_to_json(buf, n, &j, err, sizeof(err)) < 0)
		fprintf(stderr, "%s: %s\n", path, err);
	free(buf);
	return j;
}

static int doc_resource(const cJSON *doc, struct kube_resource *r)
{
	return resource(kube_obj_str(doc, NULL, "apiVersion"), kube_obj_str(doc, NULL, "kind"), r);
}

static int cmd_get(int argc, char **argv)
{
	struct kube_resource r;
	if (argc < 5 || resource(argv[1], argv[2], &r) < 0)
		return 2;
	cJSON *o = NULL;
	struct kube_error e;
	int rc = kube_client_get(client, &r, argv[3], argv[4], &o, &e);
	return rc < 0 ? fail(&e, rc) : print_obj(o);
}

static int cmd_list(int argc, char **argv)
{
	struct kube_resource r;
	if (argc < 4 || resource(argv[1], argv[2], &r) < 0)
		return 2;
	struct kube_list_opts lo = {
	    .label_selector = opt(argc, argv, "--selector"),
	    .field_selector = opt(argc, argv, "--field"),
	};
	const char *lim = opt(argc, argv, "--limit");
	if (lim)
		lo.limit = (unsigned)strtoul(lim, NULL, 10);
	cJSON *items = NULL;
	char rv[128];
	struct kube_error e;
	const char *ns = strcmp(argv[3], "-") ? argv[3] : NULL;
	int rc = kube_client_list(client, &r, ns, &lo, &items, rv, sizeof(rv), &e);
	if (rc < 0)
		return fail(&e, rc);
	cJSON *out = cJSON_CreateObject();
	cJSON_AddStringToObject(out, "resourceVersion", rv);
	cJSON *names = cJSON_AddArrayToObject(out, "names");
	const cJSON *it;
	cJSON_ArrayForEach(it, items)
	    cJSON_AddItemToArray(names, cJSON_CreateString(kube_obj_name(it)));
	cJSON_Delete(items);
	return print_obj(out);
}

static int cmd_write(int argc, char **argv, const char *verb)
{
	if (argc < 2)
		return 2;
	cJSON *doc = read_doc(argv[1]);
	struct kube_resource r;
	if (!doc || doc_resource(doc, &r) < 0) {
		cJSON_Delete(doc);
		return 2;
	}
	cJSON *out = NULL;
	struct kube_error e;
	int rc;
	if (!strcmp(verb, "create")) {
		rc = kube_client_create(client, &r, NULL, doc, &out, &e);
	} else if (!strcmp(verb, "replace")) {
		rc = kube_client_replace(client, &r, NULL, NULL, doc, &out, &e);
	} else {
		struct kube_apply_opts ao = {
		    .field_manager = opt(argc, argv, "--manager"),
		    .force = flag(argc, argv, "--force"),
		    .status = flag(argc, argv, "--status"),
		};
		rc = kube_client_apply(client, &r, NULL, NULL, doc, &ao, &out, &e);
	}
	cJSON_Delete(doc);
	return rc < 0 ? fail(&e, rc) : print_obj(out);
}

static int cmd_delete(int argc, char **argv)
{
	struct kube_resource r;
	if (argc < 5 || resource(argv[1], argv[2], &r) < 0)
		return 2;
	struct kube_delete_opts d = {.uid = opt(argc, argv, "--uid"),
	                             .resource_version = opt(argc, argv, "--rv")};
	struct kube_error e;
	int rc = kube_client_delete(client, &r, argv[3], argv[4], &d, &e);
	if (rc < 0)
		return fail(&e, rc);
	printf("{\"deleted\":\"%s\"}\n", argv[4]);
	return 0;
}

static int cmd_event(int argc, char **argv)
{
	struct kube_resource r;
	if (argc < 7 || resource(argv[1], argv[2], &r) < 0)
		return 2;
	cJSON *o = NULL;
	struct kube_error e;
	int rc = kube_client_get(client, &r, argv[3], argv[4], &o, &e);
	if (rc < 0)
		return fail(&e, rc);
	struct kube_event ev = {.regarding = o,
	                        .reason = argv[5],
	                        .message = argv[6],
	                        .type = opt(argc, argv, "--type"),
	                        .component = "kubetool",
	                        .host = "test-node"};
	rc = kube_client_event(client, &ev, &e);
	cJSON_Delete(o);
	if (rc < 0)
		return fail(&e, rc);
	printf("{\"event\":\"%s\"}\n", argv[5]);
	return 0;
}

/* ---- watch ---- */

struct watchctx {
	struct kube_informer *inf;
	bool synced_said;
	unsigned long changes;
};

static void print_stats(const struct kube_watch_stats *s)
{
	printf(
	    "{\"stats\":{\"lists\":%llu,\"relists_gone\":%llu,\"connects\":%llu,\"failures\":%llu,"
	    "\"events\":%llu,\"bookmarks\":%llu,\"malformed\":%llu,\"skipped\":%llu,\"oversized\":%"
	    "llu}}\n",
	    (unsigned long long)s->lists, (unsigned long long)s->relists_gone,
	    (unsigned long long)s->connects, (unsigned long long)s->failures,
	    (unsigned long long)s->events, (unsigned long long)s->bookmarks,
	    (unsigned long long)s->malformed, (unsigned long long)s->skipped,
	    (unsigned long long)s->oversized);
	fflush(stdout);
}

static void on_change(struct kube_informer *inf, enum kube_event_type t, const cJSON *obj, void *ud)
{
	struct watchctx *w = ud;
	w->changes++;
	printf("{\"type\":\"%s\",\"name\":\"%s\",\"rv\":\"%s\",\"cached\":%zu}\n",
	       kube_event_type_name(t), kube_obj_name(obj),
	       kube_obj_rv(obj) ? kube_obj_rv(obj) : "", kube_informer_len(inf));
	if (!w->synced_said && kube_informer_synced(inf)) {
		w->synced_said = true;
		printf("{\"synced\":%zu}\n", kube_informer_len(inf));
	}
	fflush(stdout);
}

static void poll_synced(struct loop *l, void *ud)
{
	struct watchctx *w = ud;
	if (!w->synced_said && kube_informer_synced(w->inf)) {
		w->synced_said = true;
		printf("{\"synced\":%zu}\n", kube_informer_len(w->inf));
		fflush(stdout);
	}
	if (!loop_stopping(l))
		loop_add_timer(l, 50, poll_synced, w);
}

static void stop_cb(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

static void on_shutdown(struct loop *l, int signo, void *ud)
{
	(void)l;
	(void)signo;
	struct watchctx *w = ud;
	const struct kube_watch_stats *s = kube_informer_stats(w->inf);
	if (s)
		print_stats(s);
	kube_informer_stop(w->inf);
	w->inf = NULL;
}

static int cmd_watch(int argc, char **argv)
{
	struct kube_resource r;
	if (argc < 4 || resource(argv[1], argv[2], &r) < 0)
		return 2;
	struct loop *l = NULL;
	if (loop_new(&l) < 0)
		return 1;
	struct watchctx w = {0};
	struct kube_informer_opts o = {
	    .watch = {.resource = r,
	              .ns = strcmp(argv[3], "-") ? argv[3] : NULL,
	              .label_selector = opt(argc, argv, "--selector"),
	              .backoff_initial_ms = 200,
	              .backoff_max_ms = 2000},
	    .loop = l,
	    .on_change = on_change,
	    .ud = &w,
	};
	const char *t = opt(argc, argv, "--timeout-s");
	if (t)
		o.watch.timeout_s = (unsigned)strtoul(t, NULL, 10);
	if ((t = opt(argc, argv, "--stall-ms")))
		o.watch.stall_timeout_ms = (unsigned)strtoul(t, NULL, 10);
	int rc = kube_informer_start(client, &o, &w.inf);
	if (rc < 0) {
		fprintf(stderr, "informer: %s\n", strerror(-rc));
		loop_free(l);
		return 1;
	}
	loop_on_shutdown(l, on_shutdown, &w);
	loop_add_timer(l, 50, poll_synced, &w);
	const char *secs = opt(argc, argv, "--seconds");
	if (secs)
		loop_add_timer(l, strtoull(secs, NULL, 10) * 1000, stop_cb, NULL);
	rc = loop_run(l);
	loop_free(l);
	return rc < 0 ? 1 : 0;
}

/* ---- lease ---- */

static void lease_started(void *ud)
{
	(void)ud;
	printf("leading\n");
	fflush(stdout);
}

static void lease_stopped(void *ud)
{
	(void)ud;
	printf("stopped\n");
	fflush(stdout);
}

static void lease_holder(const char *id, void *ud)
{
	(void)ud;
	printf("holder %s\n", id);
	fflush(stdout);
}

static void lease_shutdown(struct loop *l, int signo, void *ud)
{
	(void)l;
	(void)signo;
	kube_lease_stop(ud);
}

static int cmd_lease(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	struct loop *l = NULL;
	if (loop_new(&l) < 0)
		return 1;
	struct kube_lease_opts o = {
	    .ns = argv[1],
	    .name = argv[2],
	    .identity = argv[3],
	    .on_started = lease_started,
	    .on_stopped = lease_stopped,
	    .on_new_leader = lease_holder,
	};
	const char *v;
	if ((v = opt(argc, argv, "--duration-ms")))
		o.lease_duration_ms = (unsigned)strtoul(v, NULL, 10);
	if ((v = opt(argc, argv, "--renew-ms")))
		o.renew_deadline_ms = (unsigned)strtoul(v, NULL, 10);
	if ((v = opt(argc, argv, "--retry-ms")))
		o.retry_period_ms = (unsigned)strtoul(v, NULL, 10);
	struct kube_lease *le = NULL;
	int rc = kube_lease_start(client, &o, &le);
	if (rc < 0) {
		fprintf(stderr, "lease: %s\n", strerror(-rc));
		loop_free(l);
		return 2;
	}
	loop_on_shutdown(l, lease_shutdown, le);
	rc = loop_run(l);
	loop_free(l);
	return rc < 0 ? 1 : 0;
}

/* ---- controller ---- */

static void ctl_shutdown(struct loop *l, int signo, void *ud)
{
	(void)l;
	(void)signo;
	struct kube_controller **cp = ud;
	if (!*cp)
		return; /* the second run of the loop, to finish posted work */
	struct kube_controller_stats st = kube_controller_stats(*cp);
	printf("{\"stats\":{\"reconciles\":%llu,\"reconcile_errors\":%llu,\"actions\":%llu,"
	       "\"action_errors\":%llu,\"requeues\":%llu}}\n",
	       (unsigned long long)st.reconciles, (unsigned long long)st.reconcile_errors,
	       (unsigned long long)st.actions, (unsigned long long)st.action_errors,
	       (unsigned long long)st.requeues);
	fflush(stdout);
	kube_controller_stop(*cp);
	*cp = NULL;
}

static int cmd_controller(int argc, char **argv)
{
	const char *manager = opt(argc, argv, "--manager");
	const char *cfg = opt(argc, argv, "--config");
	if (argc < 3 || !manager)
		return 2;
	char err[1024];
	struct bundle *b = NULL;
	if (bundle_from_dir(argv[1], &b, err, sizeof(err)) < 0) {
		fprintf(stderr, "bundle: %s\n", err);
		return 2;
	}
	struct engine_slot slot;
	engine_slot_init(&slot, &engine_limits_default);
	struct engine_error ee;
	int rc = engine_slot_load(&slot, b, &ee);
	bundle_free(b);
	if (rc < 0) {
		fprintf(stderr, "engine: %s\n", ee.message);
		return 2;
	}
	cJSON *config = cfg ? cJSON_Parse(cfg) : NULL;
	struct loop *l = NULL;
	struct workers *w = NULL;
	struct kube_controller *c = NULL;
	rc = 1;
	if (loop_new(&l) < 0 || workers_new(l, 2, &w) < 0)
		goto out;
	struct kube_controller_opts o = {
	    .loop = l,
	    .workers = w,
	    .client = client,
	    .engine = &slot,
	    .module = argv[2],
	    .config = config,
	    .field_manager = manager,
	    .component = "kubetool",
	    .host = "test-node",
	};
	if (kube_controller_start(&o, &c, err, sizeof(err)) < 0) {
		fprintf(stderr, "controller: %s\n", err);
		goto out;
	}
	printf("{\"started\":\"%s\"}\n", argv[2]);
	fflush(stdout);
	loop_on_shutdown(l, ctl_shutdown, &c);
	rc = loop_run(l) < 0 ? 1 : 0;
out:
	if (w) {
		workers_free(w); /* waits for running actions; their completions are posted */
		loop_post(l, stop_cb, NULL);
		loop_run(l); /* run those completions so nothing is left behind */
	}
	loop_free(l);
	cJSON_Delete(config);
	engine_slot_clear(&slot);
	return rc;
}

/* ---- bench: events/s into the informer cache, memory per object ---- */

struct benchctx {
	struct kube_informer *inf;
	size_t expect;
	unsigned long want_events;
	unsigned long long e0;
	struct timespec t0, t1;
	struct mallinfo2 m0;
	int phase; /* 0 listing, 1 watching */
};

static double since(const struct timespec *a)
{
	struct timespec b;
	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(b.tv_sec - a->tv_sec) + (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

static void bench_poll(struct loop *l, void *ud)
{
	struct benchctx *b = ud;
	const struct kube_watch_stats *s = kube_informer_stats(b->inf);
	if (b->phase == 0 && kube_informer_synced(b->inf) &&
	    kube_informer_len(b->inf) >= b->expect) {
		double secs = since(&b->t0);
		struct mallinfo2 m1 = mallinfo2();
		size_t n = kube_informer_len(b->inf);
		size_t heap = m1.uordblks - b->m0.uordblks;
		printf("{\"objects\":%zu,\"list_seconds\":%.3f,\"heap_bytes\":%zu,"
		       "\"bytes_per_object\":%.0f}\n",
		       n, secs, heap, (double)heap / (double)n);
		fflush(stdout);
		if (!b->want_events) {
			loop_stop(l);
			return;
		}
		b->phase = 1;
		b->e0 = atomic_load(&s->events);
		clock_gettime(CLOCK_MONOTONIC, &b->t1);
		printf("{\"ready\":true}\n");
		fflush(stdout);
	} else if (b->phase == 1 && atomic_load(&s->events) - b->e0 >= b->want_events) {
		/* let the last posted drain land in the cache first */
		kube_informer_drain(b->inf);
		printf("{\"watch_events\":%llu,\"watch_seconds\":%.3f,\"objects\":%zu}\n",
		       (unsigned long long)(atomic_load(&s->events) - b->e0), since(&b->t1),
		       kube_informer_len(b->inf));
		fflush(stdout);
		loop_stop(l);
		return;
	}
	loop_add_timer(l, 2, bench_poll, b);
}

static int cmd_bench(int argc, char **argv)
{
	struct kube_resource r;
	const char *exp = opt(argc, argv, "--expect");
	if (argc < 4 || !exp || resource(argv[1], argv[2], &r) < 0)
		return 2;
	struct loop *l = NULL;
	if (loop_new(&l) < 0)
		return 1;
	struct benchctx b = {.expect = strtoull(exp, NULL, 10)};
	const char *we = opt(argc, argv, "--then-events");
	if (we)
		b.want_events = strtoul(we, NULL, 10);
	struct kube_informer_opts o = {
	    .watch = {.resource = r, .ns = strcmp(argv[3], "-") ? argv[3] : NULL},
	    .loop = l,
	    .ud = &b,
	};
	b.m0 = mallinfo2();
	clock_gettime(CLOCK_MONOTONIC, &b.t0);
	int rc = kube_informer_start(client, &o, &b.inf);
	if (rc < 0) {
		loop_free(l);
		return 1;
	}
	loop_add_timer(l, 2, bench_poll, &b);
	loop_run(l);
	kube_informer_stop(b.inf);
	/* drains still posted hold the informer: run them before freeing the loop */
	loop_post(l, stop_cb, NULL);
	loop_run(l);
	loop_free(l);
	return 0;
}

int main(int argc, char **argv)
{
	const char *kc = NULL;
	if (argc > 2 && !strcmp(argv[1], "--kubeconfig")) {
		kc = argv[2];
		argc -= 2;
		argv += 2;
	}
	if (argc < 2) {
		fprintf(stderr, "usage: kubetool [--kubeconfig F] VERB ARGS...\n");
		return 2;
	}
	enum log_level lvl = LOG_INFO;
	if (getenv("KUBETOOL_LOG") && log_parse_level(getenv("KUBETOOL_LOG"), &lvl) < 0)
		lvl = LOG_INFO;
	log_init(lvl, false);
	struct kube_config *cfg = NULL;
	char err[512];
	if (kube_config_load(kc, NULL, &cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "kubetool: %s\n", err);
		return 2;
	}
	if (kube_client_new(cfg, NULL, &client) < 0)
		return 2;
	const char *verb = argv[1];
	argc--;
	argv++;
	int rc;
	if (!strcmp(verb, "get"))
		rc = cmd_get(argc, argv);
	else if (!strcmp(verb, "list"))
		rc = cmd_list(argc, argv);
	else if (!strcmp(verb, "create") || !strcmp(verb, "replace") || !strcmp(verb, "apply"))
		rc = cmd_write(argc, argv, verb);
	else if (!strcmp(verb, "delete"))
		rc = cmd_delete(argc, argv);
	else if (!strcmp(verb, "event"))
		rc = cmd_event(argc, argv);
	else if (!strcmp(verb, "watch"))
		rc = cmd_watch(argc, argv);
	else if (!strcmp(verb, "lease"))
		rc = cmd_lease(argc, argv);
	else if (!strcmp(verb, "controller"))
		rc = cmd_controller(argc, argv);
	else if (!strcmp(verb, "bench"))
		rc = cmd_bench(argc, argv);
	else {
		fprintf(stderr, "kubetool: unknown verb %s\n", verb);
		rc = 2;
	}
	kube_client_free(client);
	kube_config_free(cfg);
	return rc;
}
