#include "soon_timer.h"

static void fire(struct loop *l, void *ud)
{
	struct soon_timer *t = ud;
	t->id = 0;
	t->cb(l, t->ud);
}

void soon_timer_init(struct soon_timer *t, struct loop *l, loop_fn cb, void *ud)
{
	*t = (struct soon_timer){.loop = l, .cb = cb, .ud = ud};
}

void soon_timer_arm(struct soon_timer *t, uint64_t delay_ms)
{
	uint64_t at = loop_now_ms() + delay_ms;
	if (t->id && t->at <= at)
		return;
	soon_timer_cancel(t);
	t->id = loop_add_timer(t->loop, delay_ms, fire, t);
	t->at = at;
}

void soon_timer_cancel(struct soon_timer *t)
{
	if (t->id)
		loop_cancel_timer(t->loop, t->id);
	t->id = 0;
}
