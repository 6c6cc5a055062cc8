#include "gzpipe.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SLOT_SIZE (1u << 20)

/* The writer fills buf[fill]; a slot marked full belongs to the thread
 * until it clears the mark. */
struct gzp {
	struct gzw *w;
	pthread_t th;
	bool running;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned char *buf[2];
	size_t len[2];
	bool full[2];
	int fill;
	bool closing; /* no more slots: compress the full ones, then end */
	bool abort;   /* end now */
	int rc;       /* the thread's first error */
};

static void *compress_slots(void *arg)
{
	struct gzp *p = arg;
	int k = 0;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->full[k] && !p->closing && !p->abort)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->abort || !p->full[k])
			break;
		pthread_mutex_unlock(&p->mu);
		int rc = gzw_write(p->w, p->buf[k], p->len[k]);
		pthread_mutex_lock(&p->mu);
		p->full[k] = false;
		p->len[k] = 0;
		pthread_cond_broadcast(&p->cv);
		if (rc) {
			p->rc = rc;
			break;
		}
		k ^= 1;
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int gzp_new(int level, gzw_out_fn out, void *ud, struct gzp **pp)
{
	struct gzp *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	int rc = -ENOMEM;
	if (!(p->buf[0] = malloc(SLOT_SIZE)) || !(p->buf[1] = malloc(SLOT_SIZE)))
		goto fail;
	if ((rc = gzw_new(level, out, ud, &p->w)))
		goto fail;
	if ((rc = -pthread_create(&p->th, NULL, compress_slots, p)))
		goto fail;
	p->running = true;
	*pp = p;
	return 0;
fail:
	gzp_free(p);
	return rc;
}

/* Give buf[fill] to the thread and wait for the other slot to be free. */
static int hand_over(struct gzp *p)
{
	pthread_mutex_lock(&p->mu);
	if (!p->rc) {
		p->full[p->fill] = true;
		pthread_cond_broadcast(&p->cv);
		p->fill ^= 1;
		while (p->full[p->fill] && !p->rc)
			pthread_cond_wait(&p->cv, &p->mu);
	}
	int rc = p->rc;
	pthread_mutex_unlock(&p->mu);
	return rc;
}

int gzp_write(struct gzp *p, const void *buf, size_t len)
{
	const unsigned char *b = buf;
	while (len > 0) {
		size_t used = p->len[p->fill], k = SLOT_SIZE - used < len ? SLOT_SIZE - used : len;
		memcpy(p->buf[p->fill] + used, b, k);
		p->len[p->fill] += k;
		b += k;
		len -= k;
		if (p->len[p->fill] == SLOT_SIZE) {
			int rc = hand_over(p);
			if (rc)
				return rc;
		}
	}
	return 0;
}

int gzp_finish(struct gzp *p)
{
	int rc = p->len[p->fill] ? hand_over(p) : 0;
	pthread_mutex_lock(&p->mu);
	p->closing = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->th, NULL);
	p->running = false;
	if (rc || (rc = p->rc))
		return rc;
	return gzw_finish(p->w);
}

void gzp_free(struct gzp *p)
{
	if (!p)
		return;
	if (p->running) {
		pthread_mutex_lock(&p->mu);
		p->abort = true;
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
		pthread_join(p->th, NULL);
	}
	gzw_free(p->w);
	free(p->buf[0]);
	free(p->buf[1]);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p);
}
