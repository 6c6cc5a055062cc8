/* gkm cache inspect: what a cache image holds and who signed it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "cache_image.h"
#include "cli.h"
#include "cmd.h"
#include "cache_env.h"
#include "cmd_cache.h"
#include "keyless.h"
#include "oci_sig.h"

/* ---- inspect ------------------------------------------------------------ */

static const char inspect_usage[] =
    "Usage: gkm cache inspect REF [-o table|json] [--entries] [--key FILE]...\n\n"
    "Show a cache image: targets, sizes, layers, entries, group-file paths and the\n"
    "signature state (verified when --key or keyless trust is given), with the\n"
    "identity and issuer each keyless signature's certificate names.\n\n"
    "  --entries         read the whole layer (digest-checked) to list the kernels and\n"
    "                    check group files; done anyway for layers up to 64 MiB\n"
    "  --no-signatures   do not look for signatures\n"
    "  --key FILE        a trusted public key (PEM; repeatable)\n"
    "  -o, --output FMT  table (default) or json\n\n" CLI_KEYLESS_HELP "\n" REGISTRY_HELP;

#define INSPECT_SCAN_MAX (64u << 20)

static int inspect_flag(struct cli *c, int opt, const char *arg)
{
	(void)arg;
	if (opt == OPT_ENTRIES)
		c->entries = true;
	else if (opt == OPT_NO_SIGS)
		c->no_sigs = true;
	else
		return 0;
	return 1;
}

static void print_targets(const cJSON *targets)
{
	printf("Targets:\n  %-8s %-14s %-5s %-4s %s\n", "BACKEND", "ARCH", "WARP", "PTX", "CUDA");
	const cJSON *t;
	cJSON_ArrayForEach(t, targets)
	{
		char arch[64] = "-", warp[16] = "-", ptx[16] = "-";
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(t, "arch");
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(t, "warp_size");
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(t, "ptx_version");
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(t, "backend");
		const cJSON *cu = cJSON_GetObjectItemCaseSensitive(t, "cuda_version");
		if (cJSON_IsNumber(a))
			snprintf(arch, sizeof(arch), "%d", a->valueint);
		else if (cJSON_IsString(a))
			snprintf(arch, sizeof(arch), "%s", a->valuestring);
		if (cJSON_IsNumber(w))
			snprintf(warp, sizeof(warp), "%d", w->valueint);
		if (cJSON_IsNumber(p))
			snprintf(ptx, sizeof(ptx), "%d", p->valueint);
		printf("  %-8s %-14s %-5s %-4s %s\n", cJSON_IsString(b) ? b->valuestring : "-",
		       arch, warp, ptx, cJSON_IsString(cu) ? cu->valuestring : "-");
	}
}

static void print_kernels(const cJSON *kernels)
{
	printf("Kernels:\n  %-36s %-54s %-8s %s\n", "NAME", "HASH DIR", "BACKEND", "ARCH");
	const cJSON *k;
	cJSON_ArrayForEach(k, kernels)
	{
		const cJSON *n = cJSON_GetObjectItemCaseSensitive(k, "name");
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(k, "dir");
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(k, "backend");
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(k, "arch");
		char arch[64] = "-";
		if (cJSON_IsNumber(a))
			snprintf(arch, sizeof(arch), "%d", a->valueint);
		else if (cJSON_IsString(a))
			snprintf(arch, sizeof(arch), "%s", a->valuestring);
		printf("  %-36s %-54s %-8s %s\n", cJSON_IsString(n) ? n->valuestring : "-",
		       cJSON_IsString(d) ? d->valuestring : "-",
		       cJSON_IsString(b) ? b->valuestring : "-", arch);
	}
}

/* All kernels of a meta, flattening vLLM entries. New array, caller frees. */
static cJSON *all_kernels(const struct cache_meta *m)
{
	cJSON *out = cJSON_Duplicate(m->kernels, 1);
	const cJSON *e;
	cJSON_ArrayForEach(e, m->vllm)
	{
		const cJSON *k;
		cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(e, "triton"))
		    cJSON_AddItemToArray(out, cJSON_Duplicate(k, 1));
	}
	return out;
}

static const struct option inspect_opts[] = {
    CLI_COMMON_OPTIONS,
    REGISTRY_OPTIONS,
    {"output", required_argument, 0, 'o'},
    {"entries", no_argument, 0, OPT_ENTRIES},
    {"no-signatures", no_argument, 0, OPT_NO_SIGS},
    {"key", required_argument, 0, CLI_OPT_KEY},
    CLI_KEYLESS_OPTIONS,
    {0, 0, 0, 0},
};

/* What inspect learned about one image, gathered before anything is printed. */
struct inspect {
	const char *refstr;
	struct oci_ref ref;
	struct oci_repo *repo;
	struct oci_image img;
	enum cache_format fmt;
	const char *sum_s, *entries, *size, *created, *identity; /* labels, borrowed from img */
	cJSON *summary;                                          /* sum_s parsed (NULL: not JSON) */
	bool scanned;
	struct cache_meta meta; /* the layers' scan */
	cJSON *kernels;
	struct cmd_cache_sigs sigs;
	char sigbuf[700];
};

static void inspect_clear(struct inspect *in)
{
	oci_sig_found_clear(&in->sigs.found);
	cJSON_Delete(in->summary);
	cJSON_Delete(in->kernels);
	cache_meta_clear(&in->meta);
	oci_image_clear(&in->img);
	oci_repo_free(in->repo);
	oci_ref_clear(&in->ref);
}

/* Read every layer (digest-checked) into in->meta. 0 or an exit code. */
static int inspect_scan(struct cli *c, struct inspect *in)
{
	struct oci_err e = {{0}};
	for (size_t i = 0; i < in->img.manifest.n_layers; i++) {
		struct oci_blob_reader *r = NULL;
		char what[32];
		snprintf(what, sizeof(what), "layer %zu", i);
		int lrc = oci_repo_blob_open(in->repo, &in->img.manifest.layers[i], what, &r, &e);
		if (lrc == 0) {
			lrc = cache_scan_layer(r, &in->meta, NULL, &e);
			oci_blob_close(r);
		}
		if (lrc)
			return cmd_cache_fail(c->cmd, in->refstr, &e, lrc);
	}
	in->scanned = true;
	in->kernels = all_kernels(&in->meta);
	return 0;
}

/* Fetch the image, read its labels, scan its layers when they are small
 * (or --entries) and check its signatures. 0 or an exit code. */
static int inspect_gather(struct cli *c, struct inspect *in)
{
	struct oci_err e = {{0}};
	struct oci_image *img = &in->img;
	int rc = cmd_cache_open_ref(c, in->refstr, false, &in->ref, &in->repo);
	if (rc)
		return rc;
	if ((rc =
	         oci_repo_fetch_image(in->repo, oci_ref_reference(&in->ref), c->platform, img, &e)))
		return cmd_cache_fail(c->cmd, in->refstr, &e, rc);
	in->fmt = cache_format_of_labels(oci_config_labels(&img->config));
	in->sum_s = cache_env_label(oci_config_labels(&img->config), in->fmt, "summary");
	in->summary = in->sum_s ? cJSON_Parse(in->sum_s) : NULL;
	if (cache_meta_init(&in->meta, in->fmt))
		return EXIT_FAIL;
	if ((c->entries || cmd_cache_layers_bytes(img) <= INSPECT_SCAN_MAX) &&
	    img->manifest.n_layers > 0 && (rc = inspect_scan(c, in)))
		return rc;
	if (!c->no_sigs)
		cmd_cache_sig_check(c, in->repo, img->top_digest, &in->sigs);
	in->entries = cache_env_label(oci_config_labels(&img->config), in->fmt, "entry-count");
	in->size = cache_env_label(oci_config_labels(&img->config), in->fmt, "cache-size-bytes");
	in->identity = cache_env_label(oci_config_labels(&img->config), in->fmt, "identity");
	const cJSON *cr = cJSON_GetObjectItemCaseSensitive(img->config.root, "created");
	if (cJSON_IsString(cr))
		in->created = cr->valuestring;
	cmd_cache_sig_summary(&in->sigs, in->sigbuf, sizeof(in->sigbuf));
	return 0;
}

static void add_scan_json(cJSON *o, const struct inspect *in)
{
	const struct cache_meta *meta = &in->meta;
	cJSON *sc = cJSON_AddObjectToObject(o, "scan");
	cJSON_AddNumberToObject(sc, "files", (double)meta->files);
	cJSON_AddNumberToObject(sc, "bytes", (double)meta->bytes);
	cJSON_AddNumberToObject(sc, "entries", (double)meta->entries);
	cJSON_AddItemToObject(sc, "targets", cJSON_Duplicate(meta->targets, 1));
	cJSON_AddItemToObject(sc, "kernels", cJSON_Duplicate(in->kernels, 1));
	cJSON *g = cJSON_AddObjectToObject(sc, "groupFiles");
	cJSON_AddNumberToObject(g, "total", (double)meta->groups);
	cJSON_AddNumberToObject(g, "absolute", (double)meta->abs_groups);
	if (meta->abs_groups)
		cJSON_AddStringToObject(g, "buildRoot", meta->abs_group_root);
}

static void add_sigs_json(cJSON *o, const struct inspect *in)
{
	const struct cmd_cache_sigs *sigs = &in->sigs;
	cJSON *sg = cJSON_AddObjectToObject(o, "signatures");
	cJSON_AddBoolToObject(sg, "checked", sigs->looked);
	if (sigs->looked && sigs->rc == 0) {
		cJSON_AddNumberToObject(sg, "found", (double)sigs->found.n);
		cJSON_AddNumberToObject(sg, "simpleSigning", (double)sigs->found.n_simple);
		cJSON_AddNumberToObject(sg, "bundles", (double)sigs->found.n_bundle);
		cJSON_AddBoolToObject(sg, "referrersAPI", sigs->found.referrers_api);
	}
	if (sigs->verified_tried)
		cJSON_AddBoolToObject(sg, "verified", sigs->verify_rc == 0);
	else
		cJSON_AddNullToObject(sg, "verified");
	cJSON_AddStringToObject(sg, "state", in->sigbuf);
	if (sigs->verified_tried && sigs->verify_rc == 0 && sigs->verdict.rule[0]) {
		cJSON_AddStringToObject(sg, "identity", sigs->verdict.identity);
		cJSON_AddStringToObject(sg, "issuer", sigs->verdict.issuer);
		cJSON_AddStringToObject(sg, "rule", sigs->verdict.rule);
	}
	cJSON *claims = cJSON_AddArrayToObject(sg, "keyless");
	for (size_t i = 0; sigs->looked && sigs->rc == 0 && i < sigs->found.n; i++) {
		char id[256], iss[256];
		if (sig_keyless_claims(&sigs->found.c[i], id, sizeof(id), iss, sizeof(iss)))
			continue;
		cJSON *one = cJSON_CreateObject();
		cJSON_AddStringToObject(one, "source", sigs->found.c[i].source);
		cJSON_AddStringToObject(one, "identity", id);
		cJSON_AddStringToObject(one, "issuer", iss);
		cJSON_AddItemToArray(claims, one);
	}
}

/* Who each keyless signature's certificate says signed (claims, verified
 * or not: the verdict above says which one verified). */
static void print_signers(const struct cmd_cache_sigs *sigs)
{
	for (size_t i = 0; sigs->looked && sigs->rc == 0 && i < sigs->found.n; i++) {
		char id[256], iss[256];
		if (sig_keyless_claims(&sigs->found.c[i], id, sizeof(id), iss, sizeof(iss)) == 0)
			printf("Signed by:    %s (issuer %s; %s)\n", id, iss,
			       sigs->found.c[i].source);
	}
}

/* "triton 3.4.0; vllm code hash a3c7..., ..." from the identity label: the
 * runtime versions the cache hits under. */
static void print_identity(const char *label)
{
	cJSON *id = label ? cJSON_Parse(label) : NULL, *f, *v;
	if (!cJSON_IsObject(id) || !id->child) {
		printf("Identity:     %s\n", label ? "unreadable label" : "not recorded");
		cJSON_Delete(id);
		return;
	}
	printf("Identity:     ");
	cJSON_ArrayForEach(f, id)
	{
		printf("%s%s", f == id->child ? "" : "; ", f->string);
		cJSON_ArrayForEach(v, f) if (cJSON_IsString(v)) printf(" %s", v->valuestring);
	}
	printf("\n");
	cJSON_Delete(id);
}

/* The variables a pod needs to read the image, as the pod webhook sets
 * them for a container that mounts it at <mountPath>. */
static size_t env_of(const struct inspect *in, struct cache_env_tree *t)
{
	return cache_env_trees(oci_config_labels(&in->img.config), t, CACHE_ENV_TREES_MAX);
}

static void print_env(const struct inspect *in)
{
	struct cache_env_tree t[CACHE_ENV_TREES_MAX];
	size_t n = env_of(in, t);
	if (!n)
		printf("Runtime env:  none known (no cache labels)\n");
	for (size_t i = 0; i < n; i++)
		printf("%s%s=<mountPath>%s%s\n",
		       i ? "              " : "Runtime env:  ", t[i].variable,
		       t[i].subpath[0] ? "/" : "", t[i].subpath);
}

static void print_inspect_json(const struct inspect *in)
{
	const struct oci_image *img = &in->img;
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "reference", in->refstr);
	cJSON_AddStringToObject(o, "digest", img->top_digest);
	cJSON_AddStringToObject(o, "manifestDigest", img->desc.digest);
	cJSON_AddStringToObject(o, "mediaType", img->top_media_type);
	cJSON_AddStringToObject(o, "format",
	                        in->fmt == CACHE_AUTO ? "unknown" : cache_format_name(in->fmt));
	if (in->created)
		cJSON_AddStringToObject(o, "created", in->created);
	const cJSON *labels = oci_config_labels(&img->config);
	cJSON_AddItemToObject(o, "labels",
	                      labels ? cJSON_Duplicate(labels, 1) : cJSON_CreateObject());
	struct cache_env_tree env[CACHE_ENV_TREES_MAX];
	size_t nenv = env_of(in, env);
	cJSON *ev = cJSON_AddArrayToObject(o, "runtimeEnv");
	for (size_t i = 0; i < nenv; i++) {
		cJSON *e = cJSON_CreateObject();
		cJSON_AddItemToArray(ev, e);
		cJSON_AddStringToObject(e, "name", env[i].variable);
		cJSON_AddStringToObject(e, "subPath", env[i].subpath);
	}
	cJSON *id = in->identity ? cJSON_Parse(in->identity) : NULL;
	cJSON_AddItemToObject(o, "identity", cJSON_IsObject(id) ? id : cJSON_CreateObject());
	if (!cJSON_IsObject(id))
		cJSON_Delete(id);
	cJSON_AddNumberToObject(o, "entryCount", in->entries ? strtod(in->entries, NULL) : 0);
	cJSON_AddNumberToObject(o, "cacheSizeBytes", in->size ? strtod(in->size, NULL) : 0);
	cJSON *t = in->summary ? cJSON_GetObjectItemCaseSensitive(in->summary, "targets") : NULL;
	cJSON_AddItemToObject(o, "targets", t ? cJSON_Duplicate(t, 1) : cJSON_CreateArray());
	cJSON *ls = cJSON_AddArrayToObject(o, "layers");
	for (size_t i = 0; i < img->manifest.n_layers; i++)
		cJSON_AddItemToArray(ls, oci_desc_to_json(&img->manifest.layers[i]));
	if (in->scanned)
		add_scan_json(o, in);
	add_sigs_json(o, in);
	cli_print_json(o);
}

static void print_layers(const struct inspect *in)
{
	char hs[32];
	printf("Layers:\n  %-2s %-48s %-10s %s\n", "#", "MEDIA TYPE", "SIZE", "DIGEST");
	for (size_t i = 0; i < in->img.manifest.n_layers; i++) {
		const struct oci_desc *l = &in->img.manifest.layers[i];
		cmd_cache_human((uint64_t)l->size, hs, sizeof(hs));
		printf("  %-2zu %-48s %-10s %s\n", i, l->media_type, hs, l->digest);
	}
	if (in->scanned) {
		cmd_cache_human(in->meta.bytes, hs, sizeof(hs));
		printf("Layer scan:   %" PRIu64 " files, %s, %" PRIu64 " entries\n", in->meta.files,
		       hs, in->meta.entries);
		if (cJSON_GetArraySize(in->kernels) > 0)
			print_kernels(in->kernels);
		cmd_cache_print_groups(&in->meta, stdout);
	} else {
		printf("Layer scan:   skipped (layers over 64 MiB; use --entries)\n");
	}
}

static void print_inspect_table(const struct inspect *in)
{
	const struct oci_image *img = &in->img;
	char hs[32];
	printf("Image:        %s\nDigest:       %s\n", in->refstr, img->top_digest);
	if (strcmp(img->top_digest, img->desc.digest) != 0)
		printf("Manifest:     %s (picked from the index)\n", img->desc.digest);
	printf("Format:       %s\n",
	       in->fmt == CACHE_AUTO ? "unknown (no cache labels)" : cache_format_name(in->fmt));
	if (in->created)
		printf("Created:      %s\n", in->created);
	print_identity(in->identity);
	if (in->entries)
		printf("Entries:      %s\n", in->entries);
	if (in->size) {
		cmd_cache_human((uint64_t)strtoull(in->size, NULL, 10), hs, sizeof(hs));
		printf("Cache size:   %s (%s bytes)\n", hs, in->size);
	}
	const cJSON *t =
	    in->summary ? cJSON_GetObjectItemCaseSensitive(in->summary, "targets") : NULL;
	if (t)
		print_targets(t);
	else if (in->sum_s)
		printf("Summary:      %s (not valid JSON)\n", in->sum_s);
	print_env(in);
	print_layers(in);
	printf("Signatures:   %s\n", in->sigbuf);
	print_signers(&in->sigs);
}

static int cache_inspect_cmd(struct cli *c, int argc, char **argv)
{
	if (optind + 1 != argc)
		return cli_usage_error(c->cmd, "want one image reference");
	struct inspect in = {.refstr = argv[optind]};
	int rc = inspect_gather(c, &in);
	if (rc == 0) {
		if (strcmp(c->output, "json") == 0)
			print_inspect_json(&in);
		else
			print_inspect_table(&in);
		rc = in.sigs.verified_tried && in.sigs.verify_rc ? EXIT_FAIL : EXIT_OK;
	}
	inspect_clear(&in);
	return rc;
}

const struct cmd_cache_sub cmd_cache_inspect_sub = {
    .name = "inspect",
    .run = cache_inspect_cmd,
    .summary = "show targets, sizes, entries and signature state",
    .usage = inspect_usage,
    .opts = inspect_opts,
    .shortopts = "ho:",
    .own = inspect_flag,
};
