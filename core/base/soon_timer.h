/* A one-shot loop timer that fires at the soonest time asked of it: for a
 * debounced flush that a change, a retry or a backoff may bring forward,
 * and nothing pushes back. Loop thread. */
#ifndef GKM_SOON_TIMER_H
#define GKM_SOON_TIMER_H

#include <stdint.h>

#include "loop.h"

struct soon_timer {
	struct loop *loop;
	loop_fn cb;
	void *ud;
	uint64_t id, at; /* the armed loop timer (0: none), and when it fires */
};

/* cb(loop, ud) runs when the timer fires, after it is disarmed (cb may arm
 * it again). Nothing is armed yet. */
void soon_timer_init(struct soon_timer *t, struct loop *l, loop_fn cb, void *ud);
/* Fire in delay_ms, or sooner if it is already due sooner. */
void soon_timer_arm(struct soon_timer *t, uint64_t delay_ms);
/* Disarm (before t goes away). */
void soon_timer_cancel(struct soon_timer *t);

#endif
