/* Retry delays: one rule for every retry loop in gkm (watches, registry
 * requests, lease renewals, node status writes). */
#ifndef GKM_BACKOFF_H
#define GKM_BACKOFF_H

#include <stdint.h>

/* The next pseudo-random number from *seed (xorshift); a zero seed is first
 * filled from getrandom(2). Not for secrets: for spreading retries. */
uint64_t backoff_rand(uint64_t *seed);

/* The delay before retry number `attempt` (0-based): initial * 2^attempt,
 * capped at max, then scaled by a random factor in [0.5, 1.5) from *seed, so
 * that many clients retrying after the same outage do not do it in step. */
unsigned backoff_ms(unsigned attempt, unsigned initial_ms, unsigned max_ms, uint64_t *seed);

#endif
