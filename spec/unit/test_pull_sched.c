/* The agent's registry job scheduler: slots per lane, turns between hosts,
 * and a host that cannot be reached holding one slot at most and none while
 * it backs off. Driven by a fake clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include "pull_sched.h"

static struct pull_sched *mk(unsigned fetch, unsigned pull)
{
	unsigned slots[PULL_SCHED_LANES] = {fetch, pull};
	struct pull_sched *s = NULL;
	assert_int_equal(pull_sched_new(slots, &s), 0);
	return s;
}

static void queue(struct pull_sched *s, struct pull_sched_job *j, const char *host)
{
	assert_int_equal(pull_sched_queue(s, j, host, PULL_SCHED_PULL), 0);
}

static struct pull_sched_job *next(struct pull_sched *s, uint64_t now)
{
	return pull_sched_next(s, PULL_SCHED_PULL, now, NULL, NULL);
}

/* A host that never answered keeps one slot free for the others; once it
 * answered it may use them all. */
static void test_unproven_host_leaves_a_slot(void **state)
{
	(void)state;
	struct pull_sched *s = mk(4, 3);
	struct pull_sched_job dead[5], good[2];
	memset(dead, 0, sizeof(dead));
	memset(good, 0, sizeof(good));
	for (int i = 0; i < 5; i++)
		queue(s, &dead[i], "dead:5000");
	assert_ptr_equal(next(s, 0), &dead[0]);
	assert_ptr_equal(next(s, 0), &dead[1]);
	assert_null(next(s, 0)); /* the third slot stays free */
	queue(s, &good[0], "good:5000");
	queue(s, &good[1], "good:5000");
	assert_ptr_equal(next(s, 0), &good[0]);
	assert_null(next(s, 0)); /* every slot taken */
	pull_sched_done(s, &good[0], PULL_SCHED_OK, 10);
	assert_ptr_equal(next(s, 10), &good[1]);
	pull_sched_done(s, &good[1], PULL_SCHED_OK, 20);
	/* dead still holds two and may not take the last one */
	assert_null(next(s, 20));
	pull_sched_done(s, &dead[0], PULL_SCHED_OK, 30);
	pull_sched_done(s, &dead[1], PULL_SCHED_OK, 30);
	/* it answered: all three slots are its own now */
	assert_ptr_equal(next(s, 30), &dead[2]);
	assert_ptr_equal(next(s, 30), &dead[3]);
	assert_ptr_equal(next(s, 30), &dead[4]);
	pull_sched_free(s);
}

/* Unreachable: one slot at most, none during the backoff, and the first
 * job that reaches it lets the others go. */
static void test_unreachable_host_backs_off(void **state)
{
	(void)state;
	struct pull_sched *s = mk(4, 4);
	struct pull_sched_job j[4], other;
	memset(j, 0, sizeof(j));
	memset(&other, 0, sizeof(other));
	for (int i = 0; i < 4; i++)
		queue(s, &j[i], "down:5000");
	assert_ptr_equal(next(s, 0), &j[0]);
	pull_sched_done(s, &j[0], PULL_SCHED_UNREACHABLE, 100);
	uint64_t at = pull_sched_host_retry_at(j[0].host);
	/* 1 s, jittered to [0.5, 1.5) */
	assert_true(at >= 100 + 500 && at < 100 + 1500);
	assert_int_equal(pull_sched_next_due(s), at);
	assert_null(next(s, at - 1)); /* waiting holds nothing */
	queue(s, &other, "up:5000");
	assert_ptr_equal(next(s, at - 1), &other); /* other hosts go on */
	assert_ptr_equal(next(s, at), &j[1]);      /* one try after the backoff */
	assert_null(next(s, at));                  /* and only one */
	pull_sched_done(s, &j[1], PULL_SCHED_UNREACHABLE, at + 10);
	uint64_t at2 = pull_sched_host_retry_at(j[1].host);
	assert_true(at2 >= at + 10 + 1000 && at2 < at + 10 + 3000); /* doubled */
	assert_ptr_equal(next(s, at2), &j[2]);
	pull_sched_done(s, &j[2], PULL_SCHED_OK, at2 + 5);
	assert_int_equal(pull_sched_host_retry_at(j[2].host), 0);
	assert_int_equal(pull_sched_next_due(s), UINT64_MAX);
	assert_ptr_equal(next(s, at2 + 5), &j[3]);
	pull_sched_free(s);
}

/* Hosts take turns: a host with a long queue does not starve another. */
static void test_hosts_take_turns(void **state)
{
	(void)state;
	struct pull_sched *s = mk(1, 1);
	struct pull_sched_job a[3], b[2];
	memset(a, 0, sizeof(a));
	memset(b, 0, sizeof(b));
	for (int i = 0; i < 3; i++)
		queue(s, &a[i], "a");
	queue(s, &b[0], "b");
	queue(s, &b[1], "b");
	struct pull_sched_job *order[5];
	for (int i = 0; i < 5; i++) {
		order[i] = next(s, 0);
		assert_non_null(order[i]);
		assert_null(next(s, 0)); /* one slot */
		pull_sched_done(s, order[i], PULL_SCHED_OK, 0);
	}
	for (int i = 0; i < 3; i++) /* a, b, a, b in some order, then a's last */
		assert_ptr_not_equal(order[i]->host, order[i + 1]->host);
	assert_ptr_equal(order[4], &a[2]);
	pull_sched_free(s);
}

static bool not_first(struct pull_sched_job *j, void *ud)
{
	return j != ud;
}

/* A job the caller may not start yet is skipped, not lost; a cancelled job
 * never starts; lanes count their slots apart. */
static void test_skip_cancel_lanes(void **state)
{
	(void)state;
	struct pull_sched *s = mk(1, 2);
	struct pull_sched_job p1, p2, p3, f1;
	memset(&p1, 0, sizeof(p1));
	memset(&p2, 0, sizeof(p2));
	memset(&p3, 0, sizeof(p3));
	memset(&f1, 0, sizeof(f1));
	queue(s, &p1, "h");
	queue(s, &p2, "h");
	queue(s, &p3, "h");
	assert_int_equal(pull_sched_queue(s, &f1, "h", PULL_SCHED_FETCH), 0);
	assert_ptr_equal(pull_sched_next(s, PULL_SCHED_PULL, 0, not_first, &p1), &p2);
	assert_true(p1.queued && !p1.running && p2.running);
	pull_sched_cancel(s, &p1);
	assert_false(p1.queued);
	assert_ptr_equal(pull_sched_next(s, PULL_SCHED_FETCH, 0, NULL, NULL), &f1);
	pull_sched_done(s, &p2, PULL_SCHED_OK, 0); /* answered: both pull slots */
	assert_ptr_equal(next(s, 0), &p3);
	assert_null(next(s, 0)); /* p1 was cancelled */
	pull_sched_done(s, &p3, PULL_SCHED_OK, 0);
	pull_sched_done(s, &f1, PULL_SCHED_OK, 0);
	pull_sched_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_unproven_host_leaves_a_slot),
	    cmocka_unit_test(test_unreachable_host_backs_off),
	    cmocka_unit_test(test_hosts_take_turns),
	    cmocka_unit_test(test_skip_cancel_lanes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
