/* sh(): run a shell command line (printf-style) that must succeed; for unit
 * tests that set up or check files. Include after <cmocka.h>. */
#ifndef GKM_SPEC_SHELL_H
#define GKM_SPEC_SHELL_H

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
	char cmd[4 * PATH_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	assert_int_equal(system(cmd), 0);
}

#endif
