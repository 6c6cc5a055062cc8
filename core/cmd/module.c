#include "module.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"

typedef int (*module_main)(int argc, char **argv);

int module_run(const char *name, int argc, char **argv)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		fprintf(stderr, "gkm %s: cannot find the gkm binary to load its module: %s\n", name,
		        strerror(n < 0 ? errno : ENOENT));
		return EXIT_NOT_BUILT;
	}
	exe[n] = '\0';
	char *slash = strrchr(exe, '/');
	*slash = '\0';
	const char *dir = exe, *base = slash + 1;
	char tried[2][PATH_MAX + 64], first_error[512] = "";
	snprintf(tried[0], sizeof(tried[0]), "%s/%s-%s.so", dir, base, name);
	snprintf(tried[1], sizeof(tried[1]), "%s/../lib/gkm/%s-%s.so", dir, base, name);
	void *h = NULL;
	const char *path = tried[0];
	for (int i = 0; i < 2 && !h; i++) {
		path = tried[i];
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		/* a module that exists but does not load says more than one that is absent */
		if (!h && (!*first_error || access(tried[i], F_OK) == 0))
			snprintf(first_error, sizeof(first_error), "%s", dlerror());
	}
	if (!h) {
		fprintf(stderr,
		        "gkm %s: cannot load the module that implements it (%s or %s): %s\n", name,
		        tried[0], tried[1], first_error);
		return EXIT_NOT_BUILT;
	}
	char sym[64];
	snprintf(sym, sizeof(sym), "%s_main", name);
	module_main fn;
	*(void **)&fn = dlsym(h, sym);
	if (!fn) {
		fprintf(stderr, "gkm %s: %s has no %s: %s\n", name, path, sym, dlerror());
		return EXIT_NOT_BUILT;
	}
	return fn(argc, argv);
}

int cmd_csi(int argc, char **argv)
{
	return module_run("csi", argc, argv);
}
