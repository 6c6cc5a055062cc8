#include "backoff.h"

#include <sys/random.h>
#include <time.h>

uint64_t backoff_rand(uint64_t *seed)
{
	uint64_t x = *seed;
	if (x == 0 && getrandom(&x, sizeof(x), GRND_NONBLOCK) != (ssize_t)sizeof(x))
		x = (uint64_t)time(NULL);
	if (x == 0)
		x = 0x9E3779B97F4A7C15ull;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*seed = x;
	return x;
}

unsigned backoff_ms(unsigned attempt, unsigned initial_ms, unsigned max_ms, uint64_t *seed)
{
	uint64_t d = initial_ms ? initial_ms : 1;
	for (unsigned i = 0; i < attempt && d < max_ms; i++)
		d *= 2;
	if (d > max_ms)
		d = max_ms;
	uint64_t r = backoff_rand(seed) % 1000;
	return (unsigned)(d / 2 + d * r / 1000);
}
