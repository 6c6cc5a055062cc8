/* gkm gpus: print the GPUs of this node as the agent sees them. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd.h"
#include "gpu_sources.h"

static const char usage[] =
    "Usage: gkm gpus [--source nvml|rocm|file|auto] [--file F] [--sysfs-root D] [-o table|json]\n"
    "\n"
    "Show the GPUs of this node (model, arch, driver, fabric clique) and the id\n"
    "sets they group into, exactly as the agent reports them.\n"
    "\n"
    "  --source SRC        nvml (NVIDIA), rocm (AMD, KFD sysfs), file, or auto:\n"
    "                      every source present on the node (default; file when\n"
    "                      --file is given)\n"
    "  --file F            read the inventory from the JSON file F (the shape\n"
    "                      'gkm gpus -o json' prints)\n"
    "  --sysfs-root D      where sysfs is mounted (default /sys)\n"
    "  --nvml-library L    the NVML library to load (default libnvidia-ml.so.1)\n"
    "  -o, --output FMT    table (default) or json\n";

enum { OPT_SOURCE = CLI_OPT_FIRST_FREE, OPT_FILE, OPT_SYSFS, OPT_NVML };

static void human_bytes(uint64_t b, char *buf, size_t len)
{
	if (!b) {
		snprintf(buf, len, "-");
		return;
	}
	const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	size_t u = 0;
	while (v >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f%s", v, unit[u]);
}

/* A table whose columns are as wide as their widest cell: an arch with
 * target features ("gfx90a:sramecc+:xnack-") or a long product name must
 * not push the columns after it out of line. */
#define COLS_MAX 9
#define CELL_MAX 128

struct table {
	size_t ncols, nrows;
	char (*cells)[COLS_MAX][CELL_MAX]; /* row 0: the header */
};

static void table_print(const struct table *t)
{
	size_t w[COLS_MAX] = {0};
	for (size_t r = 0; r < t->nrows; r++)
		for (size_t c = 0; c < t->ncols; c++)
			if (strlen(t->cells[r][c]) > w[c])
				w[c] = strlen(t->cells[r][c]);
	for (size_t r = 0; r < t->nrows; r++) {
		for (size_t c = 0; c + 1 < t->ncols; c++)
			printf("%-*s ", (int)w[c], t->cells[r][c]);
		printf("%s\n", t->cells[r][t->ncols - 1]);
	}
}

static void cells(char row[COLS_MAX][CELL_MAX], size_t n, ...)
{
	va_list ap;
	va_start(ap, n);
	for (size_t c = 0; c < n; c++) {
		const char *v = va_arg(ap, const char *);
		snprintf(row[c], CELL_MAX, "%s", v && *v ? v : "-");
	}
	va_end(ap);
}

static void group_ids(const cJSON *grp, char *ids, size_t len)
{
	size_t used = 0;
	const cJSON *id;
	ids[0] = '\0';
	cJSON_ArrayForEach(id, cJSON_GetObjectItem(grp, "ids"))
	{
		int n = snprintf(ids + used, len - used, "%s%d", used ? "," : "", id->valueint);
		if (n < 0 || (size_t)n >= len - used) {
			/* long id lists end in an ellipsis rather than overflow */
			snprintf(ids + len - 4, 4, "...");
			break;
		}
		used += (size_t)n;
	}
}

static int print_table(const struct gpu_probe *p, const cJSON *groups)
{
	if (p->count == 0) {
		printf("No GPUs found (source: %s).\n", p->source);
		return 0;
	}
	size_t ngroups = (size_t)cJSON_GetArraySize(groups);
	struct table t = {.ncols = 9, .nrows = 1 + p->count};
	t.cells = calloc(1 + (p->count > ngroups ? p->count : ngroups), sizeof(*t.cells));
	if (!t.cells)
		return -ENOMEM;
	cells(t.cells[0], 9, "ID", "VENDOR", "NAME", "ARCH", "DRIVER", "CUDA", "MEMORY", "PCI",
	      "CLIQUE");
	for (size_t i = 0; i < p->count; i++) {
		const struct gpu_info *g = &p->gpus[i];
		char id[16], mem[24], clique[64], arch[96];
		snprintf(id, sizeof(id), "%d", g->index);
		human_bytes(g->memory_bytes, mem, sizeof(mem));
		gpu_info_clique(g, clique, sizeof(clique));
		snprintf(arch, sizeof(arch), "%s%s%s", g->arch, g->features[0] ? ":" : "",
		         g->features);
		cells(t.cells[1 + i], 9, id, g->vendor, g->name, arch, g->driver_version,
		      g->cuda_driver_version, mem, g->pci_bus_id, clique);
	}
	table_print(&t);
	printf("\n");
	t.ncols = 5;
	t.nrows = 1 + ngroups;
	cells(t.cells[0], 5, "GROUP IDS", "TYPE", "ARCH", "DRIVER", "CLIQUE");
	size_t r = 1;
	const cJSON *grp;
	cJSON_ArrayForEach(grp, groups)
	{
		char ids[64];
		group_ids(grp, ids, sizeof(ids));
		cells(t.cells[r++], 5, ids,
		      cJSON_GetStringValue(cJSON_GetObjectItem(grp, "gpuType")),
		      cJSON_GetStringValue(cJSON_GetObjectItem(grp, "arch")),
		      cJSON_GetStringValue(cJSON_GetObjectItem(grp, "driverVersion")),
		      cJSON_GetStringValue(cJSON_GetObjectItem(grp, "fabricClique")));
	}
	table_print(&t);
	free(t.cells);
	return 0;
}

struct gpus_flags {
	const char *source, *file, *sysfs, *nvml;
	bool json;
};

/* The flags, checked together. -1 to go on, else the exit code (said). */
static int gpus_parse(int argc, char **argv, struct gpus_flags *f)
{
	static const struct option opts[] = {
	    CLI_COMMON_OPTIONS,
	    {"source", required_argument, 0, OPT_SOURCE},
	    {"file", required_argument, 0, OPT_FILE},
	    {"sysfs-root", required_argument, 0, OPT_SYSFS},
	    {"nvml-library", required_argument, 0, OPT_NVML},
	    {"output", required_argument, 0, 'o'},
	    {0, 0, 0, 0},
	};
	const char *cmd = "gkm gpus";
	int opt;
	cli_reset();
	int exit_code;
	while ((opt = cli_next(argc, argv, "ho:", opts, cmd, usage, &exit_code)) != -1) {
		switch (opt) {
		case OPT_SOURCE:
			f->source = optarg;
			break;
		case OPT_FILE:
			f->file = optarg;
			break;
		case OPT_SYSFS:
			f->sysfs = optarg;
			break;
		case OPT_NVML:
			f->nvml = optarg;
			break;
		case 'o':
			if (strcmp(optarg, "json") == 0)
				f->json = true;
			else if (strcmp(optarg, "table") == 0)
				f->json = false;
			else
				return cli_usage_error(
				    cmd, "invalid --output '%s' (want table or json)", optarg);
			break;
		default:
		}
	}
	if (exit_code >= 0)
		return exit_code == EXIT_OK ? EXIT_OK : EXIT_USAGE;
	if (optind < argc)
		return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
	if (!f->source)
		f->source = f->file ? "file" : "auto";
	if (strcmp(f->source, "file") == 0 && !f->file)
		return cli_usage_error(cmd, "--source file needs --file F");
	if (f->file && strcmp(f->source, "file") != 0)
		return cli_usage_error(cmd, "--file goes with --source file, not '%s'", f->source);
	return -1;
}

/* Probe the source the flags name. -1 with *out set, else the exit code. */
static int gpus_probe(const struct gpus_flags *f, struct gpu_probe **out)
{
	const char *cmd = "gkm gpus";
	char err[512] = "";
	int r;
	if (strcmp(f->source, "nvml") == 0)
		r = gpu_nvml_probe(f->nvml, out, err, sizeof(err));
	else if (strcmp(f->source, "rocm") == 0)
		r = gpu_rocm_probe(f->sysfs, out, err, sizeof(err));
	else if (strcmp(f->source, "file") == 0)
		r = gpu_file_probe(f->file, out, err, sizeof(err));
	else if (strcmp(f->source, "auto") == 0)
		r = gpu_probe_auto(f->nvml, f->sysfs, out, err, sizeof(err));
	else
		return cli_usage_error(cmd, "invalid --source '%s' (want nvml, rocm, file or auto)",
		                       f->source);
	if (r < 0) {
		fprintf(stderr, "%s: %s probe failed: %s\n", cmd, f->source, err);
		return EXIT_FAIL;
	}
	return -1;
}

int cmd_gpus(int argc, char **argv)
{
	const char *cmd = "gkm gpus";
	struct gpus_flags f = {0};
	struct gpu_probe *p = NULL;
	int rc = gpus_parse(argc, argv, &f);
	if (rc >= 0 || (rc = gpus_probe(&f, &p)) >= 0)
		return rc;
	rc = EXIT_OK;
	cJSON *doc = gpu_probe_to_json(p);
	if (!doc) {
		fprintf(stderr, "%s: out of memory\n", cmd);
		rc = EXIT_FAIL;
		goto out;
	}
	if (f.json) {
		char *s = cJSON_Print(doc);
		if (!s) {
			fprintf(stderr, "%s: out of memory\n", cmd);
			rc = EXIT_FAIL;
			goto out;
		}
		printf("%s\n", s);
		free(s);
	} else {
		if (print_table(p, cJSON_GetObjectItem(doc, "groups")) != 0) {
			fprintf(stderr, "%s: out of memory\n", cmd);
			rc = EXIT_FAIL;
			goto out;
		}
		for (size_t i = 0; i < p->nwarnings; i++)
			fprintf(stderr, "warning: %s\n", p->warnings[i]);
	}
out:
	cJSON_Delete(doc);
	gpu_probe_free(p);
	return rc;
}
