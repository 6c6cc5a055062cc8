/* AMD GPUs through the KFD topology in sysfs, as the ROCm runtime itself
 * enumerates them: <root>/class/kfd/kfd/topology/nodes/<N>/properties holds
 * "key value" lines (gfx_target_version, vendor_id, device_id, location_id,
 * domain, unique_id, wave_front_size, simd_count ...); CPU nodes have
 * simd_count 0. Memory comes from the node's mem_banks, the driver version
 * from <root>/module/amdgpu/version (the packaged amdgpu driver) or, for the
 * in-kernel driver, the kernel release. No shelling out, no ROCm libraries. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "gpu_sources.h"

#define KFD_NODES "class/kfd/kfd/topology/nodes"
#define MAX_NODES 1024
#define MAX_FILE 65536
#define AMD_VENDOR_ID 0x1002

/* snprintf for paths: -ENAMETOOLONG instead of a silently cut path. */
__attribute__((format(printf, 3, 4))) static int pathf(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* Read at most cap-1 bytes of a small sysfs file into buf (NUL-terminated). */
static int read_small(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t used = 0;
	int r = 0;
	while (used + 1 < cap) {
		ssize_t n = read(fd, buf + used, cap - 1 - used);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0)
			break;
		used += (size_t)n;
	}
	close(fd);
	if (r < 0)
		return r;
	buf[used] = '\0';
	return 0;
}

static void trim(char *s)
{
	size_t n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
	size_t lead = strspn(s, " \t\r\n");
	if (lead)
		memmove(s, s + lead, n - lead + 1);
}

/* The value of "key <u64>" in a properties text: 1 found, 0 absent,
 * -EINVAL if the key is there with a value that is not a number. */
static int prop(const char *text, const char *key, unsigned long long *out)
{
	size_t klen = strlen(key);
	for (const char *line = text; line && *line;) {
		const char *nl = strchr(line, '\n');
		if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
			const char *v = line + klen + 1;
			if (!isdigit((unsigned char)*v))
				return -EINVAL;
			char *end = NULL;
			errno = 0;
			unsigned long long x = strtoull(v, &end, 10);
			if (errno || (*end && *end != '\n' && *end != '\r'))
				return -EINVAL;
			*out = x;
			return 1;
		}
		line = nl ? nl + 1 : NULL;
	}
	return 0;
}

int gpu_rocm_gfx_name(unsigned v, char *buf, size_t len)
{
	unsigned major = v / 10000, minor = (v / 100) % 100, step = v % 100;
	if (major < 6 || major > 99 || minor > 15 || step > 15)
		return -EINVAL;
	int n = snprintf(buf, len, "gfx%u%x%x", major, minor, step);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* Marketing names of Instinct accelerators by PCI device id (KFD has none). */
static const struct {
	unsigned id;
	const char *name;
} amd_names[] = {
    {0x738c, "AMD Instinct MI100"},        {0x7408, "AMD Instinct MI250X"},
    {0x740c, "AMD Instinct MI250X/MI250"}, {0x740f, "AMD Instinct MI210"},
    {0x74a0, "AMD Instinct MI300A"},       {0x74a1, "AMD Instinct MI300X"},
    {0x74a5, "AMD Instinct MI325X"},
};

static void gpu_name(const char *root, unsigned device_id, unsigned render_minor,
                     const char *kfd_name, struct gpu_info *g)
{
	for (size_t i = 0; i < sizeof(amd_names) / sizeof(amd_names[0]); i++)
		if (amd_names[i].id == device_id) {
			snprintf(g->name, sizeof(g->name), "%s", amd_names[i].name);
			return;
		}
	/* boards that carry a product name expose it on the DRM device */
	char path[4096], buf[sizeof(g->name)];
	if (render_minor &&
	    pathf(path, sizeof(path), "%s/class/drm/renderD%u/device/product_name", root,
	          render_minor) == 0 &&
	    read_small(path, buf, sizeof(buf)) == 0) {
		trim(buf);
		if (*buf) {
			snprintf(g->name, sizeof(g->name), "%s", buf);
			return;
		}
	}
	snprintf(g->name, sizeof(g->name), "AMD %s (0x%04x)", *kfd_name ? kfd_name : g->arch,
	         device_id);
}

static uint64_t node_memory(const char *node_dir)
{
	char path[4096], text[4096];
	uint64_t total = 0;
	for (int b = 0; b < 64; b++) {
		if (pathf(path, sizeof(path), "%s/mem_banks/%d/properties", node_dir, b) < 0 ||
		    read_small(path, text, sizeof(text)) < 0)
			break;
		unsigned long long heap = 0, size = 0;
		/* HSA heap types 1 and 2: frame buffer, public and private */
		if (prop(text, "heap_type", &heap) == 1 && (heap == 1 || heap == 2) &&
		    prop(text, "size_in_bytes", &size) == 1)
			total += size;
	}
	return total;
}

static void driver_version(const char *root, char *buf, size_t len)
{
	char path[4096], v[80];
	if (pathf(path, sizeof(path), "%s/module/amdgpu/version", root) == 0 &&
	    read_small(path, v, sizeof(v)) == 0) {
		trim(v);
		if (*v) {
			snprintf(buf, len, "%s", v);
			return;
		}
	}
	struct utsname u;
	if (uname(&u) == 0)
		snprintf(buf, len, "%s", u.release);
}

static int cmp_uint(const void *a, const void *b)
{
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
	return x < y ? -1 : x > y;
}

/* Numeric node directory names, sorted (the runtime's enumeration order). */
static int list_nodes(const char *dir, unsigned **out, size_t *count)
{
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	unsigned *ids = NULL;
	size_t n = 0, cap = 0;
	int r = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *s = e->d_name;
		if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 6)
			continue;
		if (n == MAX_NODES) {
			r = -E2BIG;
			break;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			unsigned *m = realloc(ids, cap * sizeof(*m));
			if (!m) {
				r = -ENOMEM;
				break;
			}
			ids = m;
		}
		ids[n++] = (unsigned)strtoul(s, NULL, 10);
	}
	closedir(d);
	if (r < 0) {
		free(ids);
		return r;
	}
	if (n)
		qsort(ids, n, sizeof(*ids), cmp_uint);
	*out = ids;
	*count = n;
	return 0;
}

/* The properties a GPU node must have, and the optional ones. */
struct node_props {
	unsigned long long gfx, simd, vendor, device, location, domain, unique, wave, minor;
};

static int parse_node(const char *text, const char *where, struct node_props *np, char *err,
                      size_t errlen)
{
	static const struct {
		const char *key;
		size_t off;
		bool required;
	} keys[] = {
	    {"gfx_target_version", offsetof(struct node_props, gfx), true},
	    {"simd_count", offsetof(struct node_props, simd), true},
	    {"vendor_id", offsetof(struct node_props, vendor), false},
	    {"device_id", offsetof(struct node_props, device), false},
	    {"location_id", offsetof(struct node_props, location), false},
	    {"domain", offsetof(struct node_props, domain), false},
	    {"unique_id", offsetof(struct node_props, unique), false},
	    {"wave_front_size", offsetof(struct node_props, wave), false},
	    {"drm_render_minor", offsetof(struct node_props, minor), false},
	};
	memset(np, 0, sizeof(*np));
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		unsigned long long *v = (unsigned long long *)((char *)np + keys[i].off);
		int r = prop(text, keys[i].key, v);
		if (r < 0 || (r == 0 && keys[i].required)) {
			snprintf(err, errlen, "%s: %s %s", where, keys[i].key,
			         r < 0 ? "is not a number" : "is missing");
			return -EINVAL;
		}
	}
	return 0;
}

int gpu_rocm_probe(const char *sysfs_root, struct gpu_probe **out, char *err, size_t errlen)
{
	const char *root = sysfs_root ? sysfs_root : "/sys";
	char dir[4096], path[4096], driver[80] = "";
	unsigned *nodes = NULL;
	size_t count = 0;
	struct gpu_probe *p = NULL;
	char *text = NULL;

	int r = pathf(dir, sizeof(dir), "%s/" KFD_NODES, root);
	if (r < 0) {
		snprintf(err, errlen, "sysfs root too long");
		return r;
	}
	r = list_nodes(dir, &nodes, &count);
	if (r < 0) {
		snprintf(err, errlen, "%s: %s", dir, r == -E2BIG ? "too many nodes" : strerror(-r));
		return r == -ENOTDIR ? -ENOENT : r;
	}
	driver_version(root, driver, sizeof(driver));
	text = malloc(MAX_FILE);
	r = text ? gpu_probe_new("rocm", &p) : -ENOMEM;
	int ordinal = 0;
	for (size_t i = 0; r == 0 && i < count; i++) {
		char node_dir[4096];
		/* dir fits in 4096 with room for the longest suffix below */
		r = pathf(node_dir, sizeof(node_dir) - 64, "%s/%u", dir, nodes[i]);
		if (r == 0)
			r = pathf(path, sizeof(path), "%s/properties", node_dir);
		if (r == 0)
			r = read_small(path, text, MAX_FILE);
		if (r < 0) {
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
			break;
		}
		struct node_props np;
		r = parse_node(text, path, &np, err, errlen);
		if (r < 0)
			break;
		if (np.simd == 0 || np.gfx == 0)
			continue; /* a CPU node */
		if (np.vendor && np.vendor != AMD_VENDOR_ID)
			continue;

		struct gpu_info g;
		gpu_info_init(&g);
		g.device_index = ordinal++;
		snprintf(g.vendor, sizeof(g.vendor), "amd");
		snprintf(g.backend, sizeof(g.backend), "hip");
		if (np.gfx > 999999 ||
		    gpu_rocm_gfx_name((unsigned)np.gfx, g.arch, sizeof(g.arch))) {
			snprintf(err, errlen, "%s: gfx_target_version %llu is not a GFX target",
			         path, np.gfx);
			r = -EINVAL;
			break;
		}
		g.gfx_target_version = (unsigned)np.gfx;
		g.warp_size = (np.wave == 32 || np.wave == 64) ? (int)np.wave
		              : np.gfx >= 100000               ? 32
		                                               : 64;
		snprintf(g.driver_version, sizeof(g.driver_version), "%s", driver);
		if (np.unique)
			snprintf(g.uuid, sizeof(g.uuid), "GPU-%016llx", np.unique);
		if (np.location)
			snprintf(g.pci_bus_id, sizeof(g.pci_bus_id), "%04llx:%02llx:%02llx.%llx",
			         np.domain & 0xffff, (np.location >> 8) & 0xff,
			         (np.location >> 3) & 0x1f, np.location & 0x7);
		char kfd_name[64] = "";
		if (pathf(path, sizeof(path), "%s/name", node_dir) == 0 &&
		    read_small(path, kfd_name, sizeof(kfd_name)) == 0)
			trim(kfd_name);
		gpu_name(root, (unsigned)(np.device & 0xffff), (unsigned)(np.minor & 0xffff),
		         kfd_name, &g);
		g.memory_bytes = node_memory(node_dir);
		r = gpu_probe_add(p, &g);
		if (r < 0)
			snprintf(err, errlen, "%s", strerror(-r));
	}
	if (r == 0) {
		*out = p;
		p = NULL;
	}
	gpu_probe_free(p);
	free(text);
	free(nodes);
	return r;
}
