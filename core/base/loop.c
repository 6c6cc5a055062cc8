#include "loop.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

struct watch {
	struct watch *next;
	int fd;
	loop_fd_cb cb;
	void *ud;
};

struct timer {
	uint64_t id, due;
	loop_fn cb;
	void *ud;
};

struct posted {
	struct posted *next;
	loop_fn cb;
	void *ud;
};

struct loop {
	int epfd, sigfd, wakefd;
	struct watch *watches;
	struct timer *timers; /* binary min-heap on (due, id) */
	size_t ntimers, cap_timers;
	uint64_t next_timer_id;
	pthread_mutex_t post_lock;
	struct posted *posted, **posted_tail;
	atomic_bool stopping;
	atomic_bool trim_posted;
	int stop_signal;
	void (*on_shutdown)(struct loop *, int, void *);
	void *shutdown_ud;
	loop_fn on_reload;
	void *reload_ud;
};

uint64_t loop_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int loop_new(struct loop **out)
{
	struct loop *l = calloc(1, sizeof(*l));
	sigset_t set;
	int rc;
	if (!l)
		return -ENOMEM;
	l->epfd = l->sigfd = l->wakefd = -1;
	pthread_mutex_init(&l->post_lock, NULL);
	l->posted_tail = &l->posted;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if ((rc = pthread_sigmask(SIG_BLOCK, &set, NULL)) != 0) {
		rc = -rc;
		goto fail;
	}
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	l->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	l->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->epfd < 0 || l->sigfd < 0 || l->wakefd < 0) {
		rc = -errno;
		goto fail;
	}
	/* data 1: the signal fd, 2: the wake fd; any other value is a struct watch * */
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1};
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->sigfd, &ev) != 0) {
		rc = -errno;
		goto fail;
	}
	ev.data.u64 = 2;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev) != 0) {
		rc = -errno;
		goto fail;
	}
	*out = l;
	return 0;
fail:
	loop_free(l);
	return rc;
}

void loop_free(struct loop *l)
{
	if (!l)
		return;
	while (l->watches) {
		struct watch *w = l->watches;
		l->watches = w->next;
		free(w);
	}
	while (l->posted) {
		struct posted *p = l->posted;
		l->posted = p->next;
		free(p);
	}
	free(l->timers);
	if (l->epfd >= 0)
		close(l->epfd);
	if (l->sigfd >= 0)
		close(l->sigfd);
	if (l->wakefd >= 0)
		close(l->wakefd);
	pthread_mutex_destroy(&l->post_lock);
	free(l);
}

int loop_add_fd(struct loop *l, int fd, uint32_t events, loop_fd_cb cb, void *ud)
{
	struct watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = fd;
	w->cb = cb;
	w->ud = ud;
	struct epoll_event ev = {.events = events, .data.ptr = w};
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		int rc = -errno;
		free(w);
		return rc;
	}
	w->next = l->watches;
	l->watches = w;
	return 0;
}

static struct watch *find_watch(struct loop *l, int fd)
{
	for (struct watch *w = l->watches; w; w = w->next)
		if (w->fd == fd)
			return w;
	return NULL;
}

int loop_mod_fd(struct loop *l, int fd, uint32_t events)
{
	struct watch *w = find_watch(l, fd);
	if (!w)
		return -ENOENT;
	struct epoll_event ev = {.events = events, .data.ptr = w};
	return epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : -errno;
}

int loop_del_fd(struct loop *l, int fd)
{
	for (struct watch **pw = &l->watches; *pw; pw = &(*pw)->next) {
		if ((*pw)->fd == fd) {
			struct watch *w = *pw;
			*pw = w->next;
			epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
			/* a stale event for w later in this batch is dropped by
			 * loop_run's membership check */
			free(w);
			return 0;
		}
	}
	return -ENOENT;
}

/* ---- timer heap ---- */

static bool earlier(const struct timer *a, const struct timer *b)
{
	return a->due < b->due || (a->due == b->due && a->id < b->id);
}

static void sift_up(struct timer *h, size_t i)
{
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!earlier(&h[i], &h[p]))
			break;
		struct timer t = h[i];
		h[i] = h[p];
		h[p] = t;
		i = p;
	}
}

static void sift_down(struct timer *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && earlier(&h[l], &h[m]))
			m = l;
		if (r < n && earlier(&h[r], &h[m]))
			m = r;
		if (m == i)
			return;
		struct timer t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

uint64_t loop_add_timer(struct loop *l, uint64_t delay_ms, loop_fn cb, void *ud)
{
	if (l->ntimers == l->cap_timers) {
		size_t cap = l->cap_timers ? l->cap_timers * 2 : 16;
		struct timer *t = realloc(l->timers, cap * sizeof(*t));
		if (!t)
			return 0;
		l->timers = t;
		l->cap_timers = cap;
	}
	uint64_t id = ++l->next_timer_id;
	l->timers[l->ntimers] =
	    (struct timer){.id = id, .due = loop_now_ms() + delay_ms, .cb = cb, .ud = ud};
	sift_up(l->timers, l->ntimers++);
	return id;
}

void loop_cancel_timer(struct loop *l, uint64_t id)
{
	for (size_t i = 0; i < l->ntimers; i++) {
		if (l->timers[i].id == id) {
			l->timers[i] = l->timers[--l->ntimers];
			if (i < l->ntimers) {
				sift_down(l->timers, l->ntimers, i);
				sift_up(l->timers, i);
			}
			return;
		}
	}
}

static void run_due_timers(struct loop *l)
{
	uint64_t now = loop_now_ms();
	/* only timers due now; one added by a callback for "now" runs next turn */
	uint64_t limit = l->next_timer_id;
	while (l->ntimers && l->timers[0].due <= now && l->timers[0].id <= limit) {
		struct timer t = l->timers[0];
		l->timers[0] = l->timers[--l->ntimers];
		sift_down(l->timers, l->ntimers, 0);
		t.cb(l, t.ud);
	}
}

/* ---- posting from other threads ---- */

int loop_post(struct loop *l, loop_fn cb, void *ud)
{
	struct posted *p = malloc(sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->cb = cb;
	p->ud = ud;
	p->next = NULL;
	pthread_mutex_lock(&l->post_lock);
	*l->posted_tail = p;
	l->posted_tail = &p->next;
	pthread_mutex_unlock(&l->post_lock);
	uint64_t one = 1;
	ssize_t w = write(l->wakefd, &one, sizeof(one));
	(void)w; /* EAGAIN means a wake-up is already pending */
	return 0;
}

static void trim(struct loop *l, void *ud)
{
	(void)ud;
	atomic_store(&l->trim_posted, false);
	malloc_trim(0);
}

void loop_trim_soon(struct loop *l)
{
	if (!atomic_exchange(&l->trim_posted, true) && loop_post(l, trim, NULL) != 0)
		atomic_store(&l->trim_posted, false);
}

static void run_posted(struct loop *l)
{
	uint64_t n;
	ssize_t r = read(l->wakefd, &n, sizeof(n));
	(void)r;
	pthread_mutex_lock(&l->post_lock);
	struct posted *list = l->posted;
	l->posted = NULL;
	l->posted_tail = &l->posted;
	pthread_mutex_unlock(&l->post_lock);
	while (list) {
		struct posted *p = list;
		list = p->next;
		p->cb(l, p->ud);
		free(p);
	}
}

void loop_drain(struct loop *l)
{
	run_posted(l);
}

/* ---- signals and running ---- */

void loop_on_shutdown(struct loop *l, void (*cb)(struct loop *, int, void *), void *ud)
{
	l->on_shutdown = cb;
	l->shutdown_ud = ud;
}

void loop_on_reload(struct loop *l, loop_fn cb, void *ud)
{
	l->on_reload = cb;
	l->reload_ud = ud;
}

static void handle_signals(struct loop *l)
{
	struct signalfd_siginfo si;
	while (read(l->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			if (l->on_reload)
				l->on_reload(l, l->reload_ud);
			continue;
		}
		log_info("shutting down", "signal", strsignal((int)si.ssi_signo));
		l->stop_signal = (int)si.ssi_signo;
		atomic_store(&l->stopping, true);
	}
}

void loop_stop(struct loop *l)
{
	atomic_store(&l->stopping, true);
	uint64_t one = 1;
	ssize_t w = write(l->wakefd, &one, sizeof(one));
	(void)w;
}

bool loop_stopping(const struct loop *l)
{
	return atomic_load(&((struct loop *)l)->stopping);
}

int loop_run(struct loop *l)
{
	struct epoll_event evs[32];
	while (!atomic_load(&l->stopping)) {
		int timeout = -1;
		if (l->ntimers) {
			uint64_t now = loop_now_ms(), due = l->timers[0].due;
			timeout = due <= now ? 0 : (due - now > 60000 ? 60000 : (int)(due - now));
		}
		int n = epoll_wait(l->epfd, evs, 32, timeout);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (int i = 0; i < n; i++) {
			if (evs[i].data.u64 == 1) {
				handle_signals(l);
			} else if (evs[i].data.u64 == 2) {
				run_posted(l);
			} else {
				struct watch *w = evs[i].data.ptr;
				/* the watch may have been removed by an earlier callback in
				 * this batch; only call it if it is still registered */
				for (struct watch *x = l->watches; x; x = x->next) {
					if (x == w) {
						w->cb(l, w->fd, evs[i].events, w->ud);
						break;
					}
				}
			}
		}
		run_due_timers(l);
	}
	if (l->on_shutdown)
		l->on_shutdown(l, l->stop_signal, l->shutdown_ud);
	return 0;
}
