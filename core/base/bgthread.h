/* A background thread that sleeps in naps its owner can cut short: the
 * Kubernetes watch and lease threads. */
#ifndef GKM_BGTHREAD_H
#define GKM_BGTHREAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

struct bgthread {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* on CLOCK_MONOTONIC */
	atomic_bool stop;  /* set by bgthread_stop; the thread polls it */
};

/* Start fn(arg) on a new thread; 0 or -errno (nothing to stop then). */
__attribute__((warn_unused_result)) int bgthread_start(struct bgthread *t, void *(*fn)(void *),
                                                       void *arg);
/* From the thread: sleep ms, or less when stopped. false once stopping. */
bool bgthread_nap(struct bgthread *t, unsigned ms);
bool bgthread_stopping(struct bgthread *t);
/* From the owner: wake the thread, wait for it to return, release. */
void bgthread_stop(struct bgthread *t);

#endif
