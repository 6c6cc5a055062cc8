/* The gRPC side of the CSI plugin, on the gRPC core C API: a unix-socket
 * server whose worker threads answer unary calls through a handler (see
 * csi_node_call()). Every method path reaches the handler, so unknown ones
 * get the handler's answer (UNIMPLEMENTED) rather than gRPC's.
 *
 * The socket: a stale one (nobody accepting) is replaced, a live one is
 * refused (another plugin serves it), anything that is not a socket is
 * refused; the socket is made 0660 and removed again by csi_server_stop(). */
#ifndef GKM_CSI_SERVER_H
#define GKM_CSI_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "csi_node.h"

typedef void (*csi_server_handler)(void *ud, const char *method, const uint8_t *req, size_t len,
                                   struct csi_reply *reply);

struct csi_server;

/* endpoint: "unix:///abs/path.sock", "unix:/abs/path.sock" or "/abs/path.sock"
 * (the parent directory is created when missing). threads: handler threads
 * answering calls concurrently (1-64); two more threads drive gRPC itself.
 * Caller stops with csi_server_stop().
 * Errors: -EINVAL (bad endpoint), -ENAMETOOLONG (path too long for a unix
 * socket), -EADDRINUSE (a live server answers there), -EEXIST (the path is
 * not a socket), -EIO (gRPC could not listen). */
__attribute__((warn_unused_result)) int csi_server_start(const char *endpoint, unsigned threads,
                                                         csi_server_handler handler, void *ud,
                                                         struct csi_server **out);

/* Stop accepting calls, let the calls in flight finish (for at most
 * drain_ms, then cancel what is left), join the workers, remove the socket
 * and free s. Returns the number of calls cancelled at the deadline (0: a
 * clean drain), or -EBUSY when handlers were still running 5 s after the
 * cancel: then s is left as it is (the process is expected to exit) and
 * whatever the handlers use must not be freed. */
int csi_server_stop(struct csi_server *s, unsigned drain_ms);

/* The socket path in use (borrowed until csi_server_stop). */
const char *csi_server_path(const struct csi_server *s);

/* Parse an endpoint into its socket path. 0 or -EINVAL / -ENAMETOOLONG. */
__attribute__((warn_unused_result)) int csi_server_parse_endpoint(const char *endpoint, char *path,
                                                                  size_t size);

#endif
