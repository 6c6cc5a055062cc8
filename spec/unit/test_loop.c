/* Event loop and worker pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loop.h"
#include "workers.h"

struct order {
	int seen[8];
	int n;
};

/* Timer callbacks record which tag ran, in order. */
struct tagged {
	struct order *o;
	int tag;
	bool stop;
};

static void record_tag(struct loop *l, void *ud)
{
	struct tagged *t = ud;
	t->o->seen[t->o->n++] = t->tag;
	if (t->stop)
		loop_stop(l);
}

static void record_and_stop(struct loop *l, void *ud)
{
	struct order *o = ud;
	o->seen[o->n++] = 1;
	loop_stop(l);
}

static void test_timers_fire_in_order_and_cancel(void **state)
{
	(void)state;
	struct loop *l = NULL;
	assert_int_equal(loop_new(&l), 0);
	struct order o = {.n = 0};
	struct tagged never = {&o, 99, false}, late = {&o, 3, true}, early = {&o, 1, false},
	              mid = {&o, 2, false};
	uint64_t cancelled = loop_add_timer(l, 5, record_tag, &never);
	assert_true(cancelled > 0);
	loop_cancel_timer(l, cancelled);
	uint64_t t0 = loop_now_ms();
	assert_true(loop_add_timer(l, 30, record_tag, &late) > 0);
	assert_true(loop_add_timer(l, 20, record_tag, &mid) > 0);
	assert_true(loop_add_timer(l, 10, record_tag, &early) > 0);
	assert_int_equal(loop_run(l), 0);
	assert_int_equal(o.n, 3); /* the cancelled timer never ran */
	assert_int_equal(o.seen[0], 1);
	assert_int_equal(o.seen[1], 2);
	assert_int_equal(o.seen[2], 3);
	assert_true(loop_now_ms() - t0 >= 30);
	loop_free(l);
}

struct pipe_ctx {
	char got[16];
	int fd;
};

static void on_readable(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct pipe_ctx *p = ud;
	assert_true(events & EPOLLIN);
	ssize_t n = read(fd, p->got, sizeof(p->got) - 1);
	assert_true(n > 0);
	p->got[n] = '\0';
	assert_int_equal(loop_del_fd(l, fd), 0);
	loop_stop(l);
}

static void test_fd_watch(void **state)
{
	(void)state;
	struct loop *l = NULL;
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	assert_int_equal(loop_new(&l), 0);
	struct pipe_ctx p = {.fd = fds[0]};
	assert_int_equal(loop_add_fd(l, fds[0], EPOLLIN, on_readable, &p), 0);
	assert_int_equal(write(fds[1], "hello", 5), 5);
	assert_int_equal(loop_run(l), 0);
	assert_string_equal(p.got, "hello");
	assert_int_equal(loop_del_fd(l, fds[0]), -ENOENT);
	close(fds[0]);
	close(fds[1]);
	loop_free(l);
}

struct job_ctx {
	pthread_t loop_thread;
	int worked, done;
	int total;
	pthread_mutex_t lock;
};

static void work(void *ud)
{
	struct job_ctx *c = ud;
	pthread_mutex_lock(&c->lock);
	c->worked++;
	pthread_mutex_unlock(&c->lock);
}

static void done(struct loop *l, void *ud)
{
	struct job_ctx *c = ud;
	/* completions come back on the loop thread */
	assert_true(pthread_equal(pthread_self(), c->loop_thread));
	if (++c->done == c->total)
		loop_stop(l);
}

static void test_workers_complete_on_loop_thread(void **state)
{
	(void)state;
	struct loop *l = NULL;
	struct workers *w = NULL;
	assert_int_equal(loop_new(&l), 0);
	assert_int_equal(workers_new(l, 3, &w), 0);
	struct job_ctx c = {.loop_thread = pthread_self(), .total = 200};
	pthread_mutex_init(&c.lock, NULL);
	for (int i = 0; i < c.total; i++)
		assert_int_equal(workers_submit(w, work, done, &c), 0);
	assert_int_equal(loop_run(l), 0);
	assert_int_equal(c.worked, 200);
	assert_int_equal(c.done, 200);
	workers_free(w);
	pthread_mutex_destroy(&c.lock);
	loop_free(l);
	assert_int_equal(workers_new(NULL, 0, &w), -EINVAL);
}

struct sig_ctx {
	int signo;
	int called;
};

static void on_shutdown(struct loop *l, int signo, void *ud)
{
	(void)l;
	struct sig_ctx *s = ud;
	s->signo = signo;
	s->called++;
}

static void send_term(struct loop *l, void *ud)
{
	(void)l;
	(void)ud;
	kill(getpid(), SIGTERM);
}

static void test_sigterm_stops_cleanly(void **state)
{
	(void)state;
	struct loop *l = NULL;
	assert_int_equal(loop_new(&l), 0);
	struct sig_ctx s = {0};
	loop_on_shutdown(l, on_shutdown, &s);
	assert_true(loop_add_timer(l, 1, send_term, NULL) > 0);
	assert_int_equal(loop_run(l), 0);
	assert_int_equal(s.called, 1);
	assert_int_equal(s.signo, SIGTERM);
	assert_true(loop_stopping(l));
	loop_free(l);
}

static void *poster(void *arg)
{
	struct loop *l = arg;
	static struct order o;
	usleep(10000);
	loop_post(l, record_and_stop, &o);
	return &o;
}

static void test_post_from_thread(void **state)
{
	(void)state;
	struct loop *l = NULL;
	pthread_t t;
	void *res = NULL;
	assert_int_equal(loop_new(&l), 0);
	assert_int_equal(pthread_create(&t, NULL, poster, l), 0);
	assert_int_equal(loop_run(l), 0);
	pthread_join(t, &res);
	assert_int_equal(((struct order *)res)->n, 1);
	loop_free(l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_timers_fire_in_order_and_cancel),
	    cmocka_unit_test(test_fd_watch),
	    cmocka_unit_test(test_workers_complete_on_loop_thread),
	    cmocka_unit_test(test_sigterm_stops_cleanly),
	    cmocka_unit_test(test_post_from_thread),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
