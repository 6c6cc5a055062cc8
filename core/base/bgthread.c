#include "bgthread.h"

#include <errno.h>
#include <time.h>

int bgthread_start(struct bgthread *t, void *(*fn)(void *), void *arg)
{
	atomic_store(&t->stop, false);
	pthread_mutex_init(&t->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&t->cv, &ca);
	pthread_condattr_destroy(&ca);
	int rc = pthread_create(&t->th, NULL, fn, arg);
	if (rc != 0) {
		pthread_cond_destroy(&t->cv);
		pthread_mutex_destroy(&t->mu);
		return -rc;
	}
	return 0;
}

bool bgthread_nap(struct bgthread *t, unsigned ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&t->mu);
	while (!atomic_load(&t->stop))
		if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&t->mu);
	return !atomic_load(&t->stop);
}

bool bgthread_stopping(struct bgthread *t)
{
	return atomic_load(&t->stop);
}

void bgthread_stop(struct bgthread *t)
{
	pthread_mutex_lock(&t->mu);
	atomic_store(&t->stop, true);
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
	pthread_join(t->th, NULL);
	pthread_cond_destroy(&t->cv);
	pthread_mutex_destroy(&t->mu);
}
