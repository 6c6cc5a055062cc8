/* The webhook's HTTPS listener: libmicrohttpd with TLS (GnuTLS inside MHD),
 * its own threads, requests answered asynchronously.
 *
 * A request's whole body is handed to the handler on an MHD thread; the
 * handler answers with https_reply(), at once or later from any thread.
 * Until then the connection is suspended (MHD_suspend_connection), so MHD's
 * threads never wait for an answer.
 *
 * The certificate can be replaced while serving: https_set_cert() checks the
 * new pair, starts a new MHD daemon on the same listening socket and
 * quiesces the old one, which keeps its open connections until they finish
 * (its answers carry "Connection: close" so clients reconnect and see the new
 * certificate). https_reap() stops drained old daemons. https_set_cert(),
 * https_reap() and https_stop() are called from one thread (the loop). */
#ifndef GKM_HTTPS_SERVER_H
#define GKM_HTTPS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct https_server;
struct https_request;

/* Called on an MHD thread with the complete body of a POST (borrowed until
 * https_reply()). Must lead to exactly one https_reply() for rq. */
typedef void (*https_handler)(struct https_request *rq, const char *path, const char *body,
                              size_t len, void *ud);

struct https_opts {
	const char *listen;  /* ":8443", "127.0.0.1:0", "[::1]:8443" */
	unsigned threads;    /* MHD threads (1 when 0) */
	size_t max_body;     /* larger bodies get 413 */
	unsigned conn_limit; /* concurrent connections (default 1024) */
	unsigned timeout_s;  /* idle connection timeout (default 30) */
	unsigned drain_s;    /* longest an old daemon keeps idle connections (default 30) */
	https_handler handler;
	void *ud;
};

/* Bind the listening socket and start serving with the given PEM
 * certificate chain and key (copied). err says why on failure: the address,
 * or what is wrong with the certificate. Caller stops with https_stop(). */
__attribute__((warn_unused_result)) int https_start(const struct https_opts *o, const char *cert,
                                                    size_t cert_len, const char *key,
                                                    size_t key_len, struct https_server **out,
                                                    char *err, size_t errlen);

/* Serve new connections with this pair. 0 when swapped, -EINVAL with err
 * when the pair is refused (unparsable, key does not match), -errno when the
 * new daemon could not start; the current pair keeps serving on failure. */
__attribute__((warn_unused_result)) int https_set_cert(struct https_server *s, const char *cert,
                                                       size_t cert_len, const char *key,
                                                       size_t key_len, char *err, size_t errlen);

/* Check a PEM certificate chain and key without serving them: both parse,
 * and the key belongs to the first certificate. *not_after (may be NULL)
 * gets the certificate's expiry (Unix seconds). 0 or -EINVAL with err. */
__attribute__((warn_unused_result)) int https_check_pair(const char *cert, size_t cert_len,
                                                         const char *key, size_t key_len,
                                                         int64_t *not_after, char *err,
                                                         size_t errlen);

/* Stop old daemons whose requests are answered and whose connections are
 * gone (or idle past drain_s). Returns how many old daemons remain. */
unsigned https_reap(struct https_server *s);

/* Stop everything: stop accepting, give answers already given up to 2 s to
 * reach their clients, then close. Every handed-out request must have been
 * answered. */
void https_stop(struct https_server *s);

uint16_t https_port(const struct https_server *s);
/* Requests handed to the handler and not answered yet. */
unsigned https_pending(const struct https_server *s);

/* Answer rq (any thread, exactly once). Takes ownership of body (malloc'd,
 * may be NULL when len is 0). rq must not be used afterwards. */
void https_reply(struct https_request *rq, unsigned status, const char *content_type, char *body,
                 size_t len);

/* Monotonic nanoseconds at which rq's headers arrived. */
uint64_t https_request_started_ns(const struct https_request *rq);

#endif
