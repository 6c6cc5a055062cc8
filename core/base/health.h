/* The /healthz, /readyz and /metrics HTTP endpoint every daemon serves
 * (libmicrohttpd, its own thread; it never touches Lua). */
#ifndef GKM_HEALTH_H
#define GKM_HEALTH_H

#include <stdbool.h>
#include <stdint.h>

struct health_server;

/* listen: "HOST:PORT" or ":PORT" (all addresses); port 0 picks a free one.
 * NULL or "": no endpoint (*out is NULL, which every function below accepts).
 * Caller stops with health_stop(). Starts not ready: /readyz answers 503. */
__attribute__((warn_unused_result)) int health_start(const char *listen,
                                                     struct health_server **out);
void health_stop(struct health_server *h);

/* reason is shown by /readyz while not ready (copied). */
void health_set_ready(struct health_server *h, bool ready, const char *reason);
/* The daemon is alive as long as its loop beats: call from a loop timer.
 * /healthz fails when no beat came for stale_ms (0 disables the check). */
void health_beat(struct health_server *h, uint64_t stale_ms);
uint16_t health_port(const struct health_server *h); /* 0 without endpoint */

#endif
