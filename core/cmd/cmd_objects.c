/* Standalone mode's object commands: gkm apply, gkm get, gkm delete, on the
 * state directory `gkm up` watches. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cmd.h"
#include "fsutil.h"
#include "objstore.h"
#include "textfmt.h"
#include "yamljson.h"

#define DEFAULT_STATE "/var/lib/gkm/standalone"

struct kind_info {
	const char *kind, *plural, *shortname, *singular;
	bool namespaced;
};

static const struct kind_info kinds[] = {
    {"GKMCache", "gkmcaches", "gkmc", "gkmcache", true},
    {"ClusterGKMCache", "clustergkmcaches", "cgkmc", "clustergkmcache", false},
    {"GKMCacheNode", "gkmcachenodes", "gkmcn", "gkmcachenode", true},
    {"ClusterGKMCacheNode", "clustergkmcachenodes", "cgkmcn", "clustergkmcachenode", false},
};

static const struct kind_info *find_kind(const char *s)
{
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		const struct kind_info *k = &kinds[i];
		if (!strcasecmp(s, k->kind) || !strcmp(s, k->plural) || !strcmp(s, k->shortname) ||
		    !strcmp(s, k->singular))
			return k;
	}
	return NULL;
}

/* Common flag parsing: --state DIR, -n NS, -A, -f FILE, -o FMT. */
struct objargs {
	const char *state, *ns, *file, *output;
	bool all_ns;
	int argc;
	char **argv;
};

static int parse_objargs(int argc, char **argv, const char *cmd, const char *usage,
                         struct objargs *a)
{
	static const struct option opts[] = {
	    CLI_COMMON_OPTIONS,
	    {"state", required_argument, 0, 's'},
	    {"namespace", required_argument, 0, 'n'},
	    {"all-namespaces", no_argument, 0, 'A'},
	    {"filename", required_argument, 0, 'f'},
	    {"output", required_argument, 0, 'o'},
	    {0, 0, 0, 0},
	};
	int c;
	*a = (struct objargs){.state = DEFAULT_STATE};
	cli_reset();
	int exit_code;
	while ((c = cli_next(argc, argv, "hn:Af:o:", opts, cmd, usage, &exit_code)) != -1) {
		switch (c) {
		case 's':
			a->state = optarg;
			break;
		case 'n':
			if (!obj_valid_label(optarg))
				return cli_usage_error(cmd, "invalid namespace '%s'", optarg);
			a->ns = optarg;
			break;
		case 'A':
			a->all_ns = true;
			break;
		case 'f':
			a->file = optarg;
			break;
		case 'o':
			if (strcmp(optarg, "yaml") && strcmp(optarg, "json") &&
			    strcmp(optarg, "wide") && strcmp(optarg, "name"))
				return cli_usage_error(
				    cmd, "unknown output format '%s' (yaml, json, wide, name)",
				    optarg);
			a->output = optarg;
			break;
		default:
		}
	}
	if (exit_code >= 0)
		return exit_code == EXIT_OK ? -1 : EXIT_USAGE;
	a->argc = argc - optind;
	a->argv = argv + optind;
	return 0;
}

/* Check one document before it is stored: what the CRD schema would refuse. */
static int validate_doc(const cJSON *d, int idx, char *err, size_t errlen)
{
	const char *api = obj_str(d, "apiVersion"), *kind = obj_str(d, "kind");
	const char *name = obj_str(d, "metadata.name"), *image = obj_str(d, "spec.image");
	const struct kind_info *k = find_kind(kind);
	if (strcmp(api, GKM_API_VERSION) != 0 || !k || strcmp(k->kind, kind) != 0 ||
	    strstr(kind, "Node")) {
		snprintf(err, errlen,
		         "document %d: want apiVersion %s and kind GKMCache or "
		         "ClusterGKMCache, got '%s' '%s'",
		         idx, GKM_API_VERSION, api, kind);
		return -EINVAL;
	}
	if (!obj_valid_name(name)) {
		snprintf(err, errlen,
		         "document %d: metadata.name '%s' is not a valid DNS-1123 name", idx, name);
		return -EINVAL;
	}
	size_t n = strlen(image);
	if (n == 0 || n > 512 || strpbrk(image, " \t\n\r")) {
		snprintf(err, errlen,
		         "%s %s: spec.image is required: an image reference of at most 512 "
		         "characters without spaces",
		         kind, name);
		return -EINVAL;
	}
	return 0;
}

static const char usage_apply[] =
    "Usage: gkm apply [--state DIR] [-n NAMESPACE] -f FILE\n\n"
    "Create or update GKMCache / ClusterGKMCache objects of standalone mode from a YAML\n"
    "(or JSON) file; FILE '-' reads standard input. `gkm up --state DIR` picks the change up.\n"
    "  --state DIR   the standalone state directory (default " DEFAULT_STATE ")\n";

int cmd_apply(int argc, char **argv)
{
	struct objargs a;
	struct objstore *s = NULL;
	cJSON *docs = NULL;
	char err[512];
	int rc = parse_objargs(argc, argv, "gkm apply", usage_apply, &a);
	if (rc)
		return rc < 0 ? EXIT_OK : rc;
	if (!a.file || a.argc)
		return cli_usage_error("gkm apply", "want -f FILE and no other arguments");
	char *text = NULL;
	size_t len = 0;
	if (strcmp(a.file, "-") == 0)
		rc = fsutil_read_file("/dev/stdin", 16u << 20, &text, &len);
	else
		rc = fsutil_read_file(a.file, 16u << 20, &text, &len);
	if (rc != 0) {
		fprintf(stderr, "gkm apply: %s: %s\n", a.file, strerror(-rc));
		return EXIT_FAIL;
	}
	rc = yamljson_parse(text, len, &docs, err, sizeof(err));
	free(text);
	if (rc != 0) {
		fprintf(stderr, "gkm apply: %s: %s\n", a.file, err);
		return EXIT_FAIL;
	}
	/* validate everything before writing anything */
	cJSON *d;
	int idx = 0;
	cJSON_ArrayForEach(d, docs)
	{
		if (validate_doc(d, ++idx, err, sizeof(err)) != 0) {
			fprintf(stderr, "gkm apply: %s: %s\n", a.file, err);
			cJSON_Delete(docs);
			return EXIT_FAIL;
		}
	}
	if (objstore_file_new(a.state, NULL, 0, &s) != 0) {
		fprintf(stderr, "gkm apply: cannot open state directory %s\n", a.state);
		cJSON_Delete(docs);
		return EXIT_FAIL;
	}
	rc = EXIT_OK;
	cJSON_ArrayForEach(d, docs)
	{
		const struct kind_info *k = find_kind(obj_str(d, "kind"));
		cJSON *meta = cJSON_GetObjectItemCaseSensitive(d, "metadata");
		if (k->namespaced && !*obj_str(d, "metadata.namespace"))
			cJSON_AddStringToObject(meta, "namespace", a.ns ? a.ns : "default");
		if (!k->namespaced)
			cJSON_DeleteItemFromObjectCaseSensitive(meta, "namespace");
		/* the digest annotation belongs to the webhook; nobody sets it by hand */
		cJSON_DeleteItemFromObjectCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(meta, "annotations"), "gkm.io/resolvedDigest");
		cJSON *stored = NULL, *before = NULL;
		char gerr[256];
		bool existed =
		    s->ops->get(s, GKM_API_VERSION, k->kind, obj_str(d, "metadata.namespace"),
		                obj_str(d, "metadata.name"), &before, gerr, sizeof(gerr)) == 0;
		bool same =
		    existed && cJSON_Compare(cJSON_GetObjectItemCaseSensitive(before, "spec"),
		                             cJSON_GetObjectItemCaseSensitive(d, "spec"), 1);
		cJSON_Delete(before);
		if (s->ops->apply(s, d, "gkm-apply", false, &stored, err, sizeof(err)) != 0) {
			fprintf(stderr, "gkm apply: %s\n", err);
			rc = EXIT_FAIL;
			continue;
		}
		printf("%s.%s/%s %s\n", k->singular, GKM_GROUP, obj_str(d, "metadata.name"),
		       !existed ? "created"
		       : same   ? "unchanged"
		                : "configured");
		cJSON_Delete(stored);
	}
	s->ops->free(s);
	cJSON_Delete(docs);
	return rc;
}

/* ---- get ---- */

struct collect {
	cJSON *items;
};

static void collect_event(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct collect *c = ud;
	if (t != OBJSTORE_DELETED)
		cJSON_AddItemToArray(c->items, cJSON_Duplicate(obj, 1));
}

static cJSON *list_objects(struct objstore *s, const struct kind_info *k, const char *ns)
{
	struct collect c = {.items = cJSON_CreateArray()};
	struct objstore_watch w = {.api_version = GKM_API_VERSION,
	                           .kind = k->kind,
	                           .namespace_ = k->namespaced ? ns : NULL,
	                           .on_event = collect_event,
	                           .ud = &c};
	if (s->ops->watch(s, &w) != 0) {
		cJSON_Delete(c.items);
		return NULL;
	}
	return c.items;
}

static void age(const char *ts, char *buf, size_t len)
{
	int64_t t;
	if (rfc3339_parse(ts, &t) != 0) {
		snprintf(buf, len, "<unknown>");
		return;
	}
	long d = (long)difftime(time(NULL), (time_t)t);
	if (d < 0)
		d = 0;
	if (d < 120)
		snprintf(buf, len, "%lds", d);
	else if (d < 7200)
		snprintf(buf, len, "%ldm", d / 60);
	else if (d < 172800)
		snprintf(buf, len, "%ldh", d / 3600);
	else
		snprintf(buf, len, "%ldd", d / 86400);
}

static const char *condition_status(const cJSON *obj, const char *type)
{
	const cJSON *conds = cJSON_GetObjectItemCaseSensitive(
	                cJSON_GetObjectItemCaseSensitive(obj, "status"), "conditions"),
	            *c;
	cJSON_ArrayForEach(c, conds)
	{
		if (!strcmp(obj_str(c, "type"), type))
			return obj_str(c, "status");
	}
	return "";
}

static int status_int(const cJSON *obj, const char *field)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(obj, "status"), field);
	return cJSON_IsNumber(v) ? (int)v->valuedouble : 0;
}

static void print_table(const struct kind_info *k, const cJSON *items, bool show_ns)
{
	const cJSON *o;
	bool cache = !strstr(k->kind, "Node");
	if (show_ns)
		printf("%-16s ", "NAMESPACE");
	if (cache)
		printf("%-24s %-22s %-9s %-7s %-7s %-7s %-13s %s\n", "NAME", "DIGEST", "VERIFIED",
		       "READY", "NODES", "FAILED", "INCOMPATIBLE", "AGE");
	else
		printf("%-24s %-16s %-6s %-7s %s\n", "NAME", "NODE", "GPUS", "CACHES", "AGE");
	cJSON_ArrayForEach(o, items)
	{
		char a[32];
		age(obj_str(o, "metadata.creationTimestamp"), a, sizeof(a));
		if (show_ns)
			printf("%-16s ", obj_str(o, "metadata.namespace"));
		if (cache) {
			const char *digest = obj_str(o, "status.resolvedDigest");
			char d[32];
			snprintf(d, sizeof(d), "%.19s%s", digest, strlen(digest) > 19 ? "..." : "");
			const char *verified = condition_status(o, "Verified");
			printf("%-24s %-22s %-9s %-7s %d/%-5d %-7d %-13d %s\n",
			       obj_str(o, "metadata.name"), *d ? d : "<none>",
			       *verified ? verified : "Unknown",
			       *condition_status(o, "Ready") ? condition_status(o, "Ready")
			                                     : "False",
			       status_int(o, "readyNodes"), status_int(o, "totalNodes"),
			       status_int(o, "failedNodes"), status_int(o, "incompatibleNodes"), a);
		} else {
			const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "status");
			printf("%-24s %-16s %-6d %-7d %s\n", obj_str(o, "metadata.name"),
			       obj_str(o, "spec.nodeName"),
			       cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(st, "gpus")),
			       cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(st, "caches")),
			       a);
		}
	}
}

static const char usage_get[] =
    "Usage: gkm get [--state DIR] [-n NS | -A] KIND [NAME] [-o yaml|json|wide|name]\n\n"
    "Show standalone objects and their status. KIND: gkmc, cgkmc, gkmcn, cgkmcn (or the\n"
    "full names), as kubectl would print them.\n";

int cmd_get(int argc, char **argv)
{
	struct objargs a;
	struct objstore *s = NULL;
	int rc = parse_objargs(argc, argv, "gkm get", usage_get, &a);
	if (rc)
		return rc < 0 ? EXIT_OK : rc;
	if (a.argc < 1 || a.argc > 2)
		return cli_usage_error("gkm get", "want KIND [NAME]");
	const struct kind_info *k = find_kind(a.argv[0]);
	if (!k)
		return cli_usage_error("gkm get", "unknown kind '%s' (gkmc, cgkmc, gkmcn, cgkmcn)",
		                       a.argv[0]);
	const char *ns = a.all_ns ? NULL : (a.ns ? a.ns : "default");
	if (objstore_file_new(a.state, NULL, 0, &s) != 0) {
		fprintf(stderr, "gkm get: cannot open state directory %s\n", a.state);
		return EXIT_FAIL;
	}
	cJSON *items = list_objects(s, k, ns), *o, *next;
	s->ops->free(s);
	if (!items)
		return EXIT_FAIL;
	if (a.argc == 2) {
		for (o = items->child; o; o = next) {
			next = o->next;
			if (strcmp(obj_str(o, "metadata.name"), a.argv[1]) != 0)
				cJSON_Delete(cJSON_DetachItemViaPointer(items, o));
		}
		if (!items->child) {
			fprintf(stderr, "Error from server (NotFound): %s.%s \"%s\" not found\n",
			        k->plural, GKM_GROUP, a.argv[1]);
			cJSON_Delete(items);
			return EXIT_FAIL;
		}
	}
	const cJSON *out = items;
	cJSON *list = NULL;
	if (a.argc == 2)
		out = items->child;
	if (a.output && (!strcmp(a.output, "yaml") || !strcmp(a.output, "json")) && a.argc < 2) {
		list = cJSON_CreateObject();
		cJSON_AddStringToObject(list, "apiVersion", "v1");
		cJSON_AddStringToObject(list, "kind", "List");
		cJSON_AddItemToObject(list, "items", cJSON_Duplicate(items, 1));
		out = list;
	}
	if (a.output && !strcmp(a.output, "yaml")) {
		char *y = yamljson_emit(out);
		fputs(y ? y : "", stdout);
		free(y);
	} else if (a.output && !strcmp(a.output, "json")) {
		char *j = cJSON_Print(out);
		printf("%s\n", j ? j : "");
		free(j);
	} else if (a.output && !strcmp(a.output, "name")) {
		cJSON_ArrayForEach(o, items)
		{
			printf("%s.%s/%s\n", k->singular, GKM_GROUP, obj_str(o, "metadata.name"));
		}
	} else if (!items->child) {
		fprintf(stderr, "No resources found%s%s.\n",
		        ns && k->namespaced ? " in namespace " : "", ns && k->namespaced ? ns : "");
	} else {
		print_table(k, items, a.all_ns && k->namespaced);
	}
	cJSON_Delete(list);
	cJSON_Delete(items);
	return EXIT_OK;
}

static const char usage_delete[] =
    "Usage: gkm delete [--state DIR] [-n NS] KIND NAME\n\n"
    "Delete a standalone GKMCache or ClusterGKMCache; `gkm up` releases its files\n"
    "once no pod uses them.\n";

int cmd_delete(int argc, char **argv)
{
	struct objargs a;
	struct objstore *s = NULL;
	char err[256];
	int rc = parse_objargs(argc, argv, "gkm delete", usage_delete, &a);
	if (rc)
		return rc < 0 ? EXIT_OK : rc;
	if (a.argc != 2)
		return cli_usage_error("gkm delete", "want KIND NAME");
	const struct kind_info *k = find_kind(a.argv[0]);
	if (!k)
		return cli_usage_error("gkm delete", "unknown kind '%s'", a.argv[0]);
	if (objstore_file_new(a.state, NULL, 0, &s) != 0) {
		fprintf(stderr, "gkm delete: cannot open state directory %s\n", a.state);
		return EXIT_FAIL;
	}
	rc = s->ops->remove(s, GKM_API_VERSION, k->kind, a.ns ? a.ns : "default", a.argv[1], err,
	                    sizeof(err));
	s->ops->free(s);
	if (rc != 0) {
		fprintf(stderr, "gkm delete: %s\n", err);
		return EXIT_FAIL;
	}
	printf("%s.%s \"%s\" deleted\n", k->singular, GKM_GROUP, a.argv[1]);
	return EXIT_OK;
}
