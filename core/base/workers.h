/* A small pool of threads for blocking work (registry downloads, extraction,
 * signature checks). work() runs on a worker thread and must not touch Lua or
 * loop-owned state; done() then runs on the loop thread with the same ud. */
#ifndef GKM_WORKERS_H
#define GKM_WORKERS_H

#include "loop.h"

struct workers;

/* Caller frees with workers_free(), which waits for queued and running jobs. */
__attribute__((warn_unused_result)) int workers_new(struct loop *l, unsigned nthreads,
                                                    struct workers **out);
void workers_free(struct workers *w);

/* 0 or -errno (-ESHUTDOWN after workers_free started). done may be NULL. */
__attribute__((warn_unused_result)) int workers_submit(struct workers *w, void (*work)(void *ud),
                                                       loop_fn done, void *ud);

/* Jobs queued or running, for metrics and tests. */
unsigned workers_pending(struct workers *w);

#endif
