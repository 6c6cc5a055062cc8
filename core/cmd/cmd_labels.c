/* gkm labels: the Node labels that say where a cache is Ready (cache_label.h,
 * set by the operator through node_labels.h): print a cache's key, and
 * remove every label the operator's field manager owns (uninstall). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_label.h"
#include "cli.h"
#include "cmd.h"
#include "kube_client.h"
#include "node_labels.h"
#include "objstore_kube.h"

#define CMD "gkm labels"

static const char usage[] =
    "Usage: gkm labels key NAME [--namespace NS]\n"
    "       gkm labels remove [--kubeconfig FILE] [--context NAME] [--dry-run]\n"
    "\n"
    "The operator labels each Node with the caches Ready on it, so that pods can\n"
    "select them with node affinity: GKMCache NS/NAME as NS.gkmcache.gkm.io/NAME,\n"
    "ClusterGKMCache NAME as clustergkmcache.gkm.io/NAME, value \"ready\" (a name\n"
    "over 63 characters becomes its first 46, then '-' and 16 hex digits of its\n"
    "sha256). status.nodeLabel of each cache shows its key.\n"
    "\n"
    "  key      print the label key of ClusterGKMCache NAME, or of GKMCache NAME in\n"
    "           namespace NS\n"
    "  remove   remove every label the operator set, on every Node: a server-side\n"
    "           apply of an empty set under its field manager\n"
    "           " NODE_LABELS_MANAGER ", which leaves labels other managers own;\n"
    "           run it once the operator is gone (helm uninstall), or it sets them\n"
    "           again\n"
    "\n"
    "Flags:\n"
    "  -n, --namespace NS     the GKMCache's namespace (key)\n"
    "  --kubeconfig FILE      kubeconfig (default: in-cluster, else $KUBECONFIG)\n"
    "  --context NAME         kubeconfig context (default: the current one)\n"
    "  --dry-run              say what would be removed, change nothing\n";

static int do_key(const char *ns, const char *name)
{
	char key[CACHE_LABEL_KEY_MAX];
	if (cache_label_key(ns, name, key, sizeof(key)) != 0) {
		bool in_ns = ns && *ns;
		fprintf(stderr, CMD " key: '%s%s%s' is not a cache name a cluster would store\n",
		        in_ns ? ns : "", in_ns ? "/" : "", name);
		return EXIT_FAIL;
	}
	printf("%s\n", key);
	return EXIT_OK;
}

/* Remove what the manager owns on one Node; 0 or -errno with err set. */
static int remove_on(struct kube_client *kc, const struct kube_resource *r, const cJSON *node,
                     bool dry_run, size_t *removed, struct kube_error *err)
{
	char **owned = NULL;
	size_t n = 0;
	const char *name = obj_str(node, "metadata.name");
	int rc = node_labels_owned(node, &owned, &n);
	if (rc) {
		kube_error_set(err, KUBE_UNKNOWN, "out of memory");
		return rc;
	}
	if (n > 0 && !dry_run) {
		cJSON *obj = node_labels_apply_obj(name, obj_str(node, "metadata.uid"), NULL, 0);
		struct kube_apply_opts o = {.field_manager = NODE_LABELS_MANAGER, .force = true};
		rc = obj ? kube_client_apply(kc, r, NULL, name, obj, &o, NULL, err) : -ENOMEM;
		if (!obj)
			kube_error_set(err, KUBE_UNKNOWN, "out of memory");
		cJSON_Delete(obj);
	}
	for (size_t i = 0; !rc && i < n; i++)
		printf("%s: %s %s\n", name, dry_run ? "would remove" : "removed", owned[i]);
	if (!rc)
		*removed += n;
	node_labels_owned_free(owned, n);
	return rc;
}

static int do_remove(const char *kubeconfig, const char *context, bool dry_run)
{
	struct objstore *os = NULL;
	cJSON *nodes = NULL;
	struct kube_resource r;
	struct kube_error e;
	char err[512];
	int code = EXIT_FAIL;
	memset(&e, 0, sizeof(e));
	if (objstore_kube_new(kubeconfig, context, NULL, "gkm", NULL, &os, err, sizeof(err)) != 0) {
		fprintf(stderr, CMD " remove: cannot reach the Kubernetes API: %s\n", err);
		return EXIT_FAIL;
	}
	struct kube_client *kc = objstore_kube_client(os);
	if (kube_resource_builtin("v1", "Node", &r) != 0 ||
	    kube_client_list(kc, &r, NULL, NULL, &nodes, NULL, 0, &e) != 0) {
		fprintf(stderr, CMD " remove: cannot list the Nodes: %s\n", e.message);
		goto out;
	}
	size_t removed = 0, touched = 0, failed = 0;
	const cJSON *node;
	cJSON_ArrayForEach(node, nodes)
	{
		size_t before = removed;
		memset(&e, 0, sizeof(e));
		if (remove_on(kc, &r, node, dry_run, &removed, &e) != 0) {
			fprintf(stderr, CMD " remove: %s: %s\n", obj_str(node, "metadata.name"),
			        e.message);
			failed++;
		}
		touched += removed > before;
	}
	printf("%s %zu label%s on %zu of %d Node%s", dry_run ? "would remove" : "removed", removed,
	       removed == 1 ? "" : "s", touched, cJSON_GetArraySize(nodes),
	       cJSON_GetArraySize(nodes) == 1 ? "" : "s");
	if (failed)
		printf("; %zu Node%s failed", failed, failed == 1 ? "" : "s");
	printf("\n");
	code = failed ? EXIT_FAIL : EXIT_OK;
out:
	cJSON_Delete(nodes);
	os->ops->free(os);
	return code;
}

int cmd_labels(int argc, char **argv)
{
	enum { OPT_KUBECONFIG = CLI_OPT_FIRST_FREE, OPT_CONTEXT, OPT_NAMESPACE, OPT_DRY_RUN };
	static const struct option opts[] = {
	    CLI_COMMON_OPTIONS,
	    {"kubeconfig", required_argument, 0, OPT_KUBECONFIG},
	    {"context", required_argument, 0, OPT_CONTEXT},
	    {"namespace", required_argument, 0, OPT_NAMESPACE},
	    {"dry-run", no_argument, 0, OPT_DRY_RUN},
	    {0, 0, 0, 0},
	};
	const char *kubeconfig = NULL, *context = NULL, *ns = NULL;
	bool dry_run = false;
	int c;
	cli_reset();
	int exit_code;
	while ((c = cli_next(argc, argv, "hn:", opts, CMD, usage, &exit_code)) != -1) {
		switch (c) {
		case OPT_KUBECONFIG:
			kubeconfig = optarg;
			break;
		case OPT_CONTEXT:
			context = optarg;
			break;
		case 'n':
		case OPT_NAMESPACE:
			ns = optarg;
			break;
		case OPT_DRY_RUN:
			dry_run = true;
			break;
		default:
		}
	}
	if (exit_code >= 0)
		return exit_code == EXIT_OK ? EXIT_OK : EXIT_USAGE;
	const char *verb = optind < argc ? argv[optind] : "";
	int rest = argc - optind - 1;
	if (!strcmp(verb, "key") && rest == 1)
		return do_key(ns, argv[optind + 1]);
	if (!strcmp(verb, "remove") && rest == 0 && !ns)
		return do_remove(kubeconfig, context, dry_run);
	if (!strcmp(verb, "key") || !strcmp(verb, "remove"))
		return cli_usage_error(CMD, "%s takes %s", verb,
		                       !strcmp(verb, "key") ? "one cache name (and --namespace NS)"
		                                            : "no arguments and no --namespace");
	return cli_usage_error(CMD, "%s%s%s: want key or remove (see --help)",
	                       *verb ? "unknown command '" : "no command", verb, *verb ? "'" : "");
}
