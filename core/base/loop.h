/* The event loop: file descriptors (epoll), timers, signals, and functions
 * posted from other threads. One loop per daemon; everything that touches a
 * Lua engine runs on the loop thread. SIGTERM and SIGINT stop the loop
 * cleanly (the shutdown callback runs first, on the loop thread). */
#ifndef GKM_LOOP_H
#define GKM_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct loop;

typedef void (*loop_fd_cb)(struct loop *l, int fd, uint32_t events, void *ud);
typedef void (*loop_fn)(struct loop *l, void *ud);

/* Caller frees with loop_free(). Blocks SIGTERM/SIGINT/SIGHUP in the calling
 * thread (create the loop before starting other threads so they inherit it). */
__attribute__((warn_unused_result)) int loop_new(struct loop **out);
void loop_free(struct loop *l);

/* events: EPOLLIN / EPOLLOUT / ... The fd stays owned by the caller. */
__attribute__((warn_unused_result)) int loop_add_fd(struct loop *l, int fd, uint32_t events,
                                                    loop_fd_cb cb, void *ud);
int loop_mod_fd(struct loop *l, int fd, uint32_t events);
int loop_del_fd(struct loop *l, int fd);

/* One-shot timer; returns an id > 0 for loop_cancel_timer(), 0 on ENOMEM. */
uint64_t loop_add_timer(struct loop *l, uint64_t delay_ms, loop_fn cb, void *ud);
void loop_cancel_timer(struct loop *l, uint64_t id);

/* Run cb on the loop thread soon. Thread-safe; 0 or -errno. */
int loop_post(struct loop *l, loop_fn cb, void *ud);

/* Give the heap's free memory back to the kernel (malloc_trim) once the
 * loop has run what is posted now, which may free more: for the end of a
 * burst of work that freed much, so an idle daemon does not keep its peak.
 * Calls before it runs make one trim. Thread-safe. */
void loop_trim_soon(struct loop *l);

/* Run the functions posted so far (after loop_run returned, e.g. the
 * completions a worker pool posted while shutting down). */
void loop_drain(struct loop *l);

/* Called on the loop thread when SIGTERM/SIGINT arrives (signo) or when
 * loop_stop() is called (signo 0), before loop_run() returns. */
void loop_on_shutdown(struct loop *l, void (*cb)(struct loop *l, int signo, void *ud), void *ud);
/* Called on the loop thread on SIGHUP (e.g. reload configuration). */
void loop_on_reload(struct loop *l, loop_fn cb, void *ud);

/* Runs until stopped; 0 on a clean stop, -errno on a loop failure. */
int loop_run(struct loop *l);
/* Thread-safe; loop_run() returns after the current iteration. */
void loop_stop(struct loop *l);
bool loop_stopping(const struct loop *l);

/* Monotonic milliseconds. */
uint64_t loop_now_ms(void);

#endif
