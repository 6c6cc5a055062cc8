/* Commands whose libraries only they need live in a module (a shared object
 * next to the binary) loaded when the command runs, so that the other daemons
 * do not map those libraries: `gkm csi` and gRPC. */
#ifndef GKM_MODULE_H
#define GKM_MODULE_H

/* Load the module NAME and call its NAME_main(argc, argv). The module is
 * <exe dir>/<exe name>-NAME.so (the build tree) or, installed,
 * <exe dir>/../lib/gkm/<exe name>-NAME.so. When it cannot be loaded, says so
 * on stderr and returns EXIT_NOT_BUILT. */
int module_run(const char *name, int argc, char **argv);

#endif
