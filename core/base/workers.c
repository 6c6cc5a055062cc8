#include "workers.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct job {
	struct job *next;
	void (*work)(void *);
	loop_fn done;
	void *ud;
};

struct workers {
	struct loop *loop;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *head, **tail;
	unsigned pending;
	bool closing;
	unsigned nthreads;
	pthread_t threads[];
};

static void finish(struct loop *l, void *ud)
{
	struct job *j = ud;
	if (j->done)
		j->done(l, j->ud);
	free(j);
}

static void *worker_main(void *arg)
{
	struct workers *w = arg;
	for (;;) {
		pthread_mutex_lock(&w->lock);
		while (!w->head && !w->closing)
			pthread_cond_wait(&w->cond, &w->lock);
		struct job *j = w->head;
		if (!j) { /* closing and drained */
			pthread_mutex_unlock(&w->lock);
			return NULL;
		}
		w->head = j->next;
		if (!w->head)
			w->tail = &w->head;
		pthread_mutex_unlock(&w->lock);

		j->work(j->ud);

		pthread_mutex_lock(&w->lock);
		bool idle = --w->pending == 0;
		pthread_mutex_unlock(&w->lock);
		if (loop_post(w->loop, finish, j) != 0)
			free(j); /* out of memory: the completion is lost, never run twice */
		else if (idle)   /* give back what the burst's jobs and completions freed */
			loop_trim_soon(w->loop);
	}
}

int workers_new(struct loop *l, unsigned nthreads, struct workers **out)
{
	if (nthreads == 0 || nthreads > 64)
		return -EINVAL;
	struct workers *w = calloc(1, sizeof(*w) + nthreads * sizeof(pthread_t));
	if (!w)
		return -ENOMEM;
	w->loop = l;
	w->tail = &w->head;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	for (unsigned i = 0; i < nthreads; i++) {
		int rc = pthread_create(&w->threads[i], NULL, worker_main, w);
		if (rc != 0) {
			w->nthreads = i;
			workers_free(w);
			return -rc;
		}
	}
	w->nthreads = nthreads;
	*out = w;
	return 0;
}

int workers_submit(struct workers *w, void (*work)(void *), loop_fn done, void *ud)
{
	struct job *j = malloc(sizeof(*j));
	if (!j)
		return -ENOMEM;
	*j = (struct job){.work = work, .done = done, .ud = ud};
	pthread_mutex_lock(&w->lock);
	if (w->closing) {
		pthread_mutex_unlock(&w->lock);
		free(j);
		return -ESHUTDOWN;
	}
	*w->tail = j;
	w->tail = &j->next;
	w->pending++;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

unsigned workers_pending(struct workers *w)
{
	pthread_mutex_lock(&w->lock);
	unsigned n = w->pending;
	pthread_mutex_unlock(&w->lock);
	return n;
}

void workers_free(struct workers *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->closing = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	for (unsigned i = 0; i < w->nthreads; i++)
		pthread_join(w->threads[i], NULL);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w);
}
