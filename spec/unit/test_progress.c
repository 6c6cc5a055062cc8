/* The progress meter as a terminal and a log reader see it: the meter and
 * its final line on a pseudo-terminal, a log line written during a stage
 * erasing the meter rather than running into it, nothing at all on a pipe,
 * one JSON line per stage with --log-format json, kinds a stage does not
 * count left out, and a copy's two passes counted once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "log.h"
#include "progress.h"

static int saved_stderr = -1;

/* stderr goes to fd until restore_stderr(). */
static void redirect_stderr(int fd)
{
	saved_stderr = dup(STDERR_FILENO);
	assert_true(saved_stderr >= 0);
	assert_true(dup2(fd, STDERR_FILENO) >= 0);
	close(fd);
}

static void restore_stderr(void)
{
	assert_true(dup2(saved_stderr, STDERR_FILENO) >= 0);
	close(saved_stderr);
}

/* Whatever fd holds now (non-blocking), NUL-terminated, in buf. */
static size_t drain(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	for (;;) {
		ssize_t r = read(fd, buf + n, cap - 1 - n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	buf[n] = '\0';
	return n;
}

static bool matches(const char *s, const char *pattern)
{
	regex_t re;
	assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
	bool m = regexec(&re, s, 0, NULL, 0) == 0;
	regfree(&re);
	return m;
}

static void test_terminal(void **state)
{
	(void)state;
	int master, slave;
	struct winsize ws = {.ws_row = 40, .ws_col = 120};
	assert_int_equal(openpty(&master, &slave, NULL, NULL, &ws), 0);
	struct termios t;
	tcgetattr(slave, &t);
	t.c_oflag &= ~(tcflag_t)OPOST; /* the bytes as written */
	tcsetattr(slave, TCSANOW, &t);
	setenv("TERM", "xterm", 1);
	log_init(LOG_INFO, false);
	redirect_stderr(slave);
	progress_begin("pack", PROGRESS_PACKED, 1, 1000);
	progress_add(PROGRESS_PACKED, 500, 3);
	progress_add(PROGRESS_READ, 99999, 7); /* not a kind this stage counts */
	/* the meter redraws on its own: wait for it (10 s at most) */
	const char *redraw =
	    "\rpack +500 B / 1000 B  50%  3 files  [0-9.]+ (B|KiB)/s(  ETA [0-9a-z]+)?\033\\[K";
	char buf[16384] = "";
	size_t n = 0;
	for (int i = 0; i < 1000 && !matches(buf, redraw); i++) {
		usleep(10 * 1000);
		n += drain(master, buf + n, sizeof(buf) - n);
	}
	log_info("in the middle", "k", "v");
	progress_end(0);
	restore_stderr();
	drain(master, buf + n, sizeof(buf) - n);
	close(master);
	if (!matches(buf, redraw))
		fail_msg("no redraw of the meter in '%s'", buf);
	/* the meter was drawn: it is erased before the log line, which starts
	 * on a clean line instead of running on after it */
	if (!matches(buf, "\r\033\\[K[0-9]{4}-[0-9-]+T[0-9:.]+Z info in the middle k=v\n"))
		fail_msg("the log line ran into the meter: '%s'", buf);
	if (!matches(buf, "\r\033\\[Kpack: done, 500 B, 3 files in [0-9]+\\.[0-9]s \\([0-9.]+ "
	                  "(B|KiB|MiB)/s\\)\n$"))
		fail_msg("no final line at the end of '%s'", buf);
}

static void test_pipe_silent(void **state)
{
	(void)state;
	int p[2];
	assert_int_equal(pipe(p), 0);
	log_init(LOG_INFO, false);
	redirect_stderr(p[1]);
	progress_begin("push", PROGRESS_SENT, 1, 100);
	progress_add(PROGRESS_SENT, 100, 0);
	progress_end(0);
	restore_stderr();
	char buf[1024];
	assert_int_equal(drain(p[0], buf, sizeof(buf)), 0);
	close(p[0]);
}

static void test_json(void **state)
{
	(void)state;
	int p[2];
	assert_int_equal(pipe(p), 0);
	log_init(LOG_INFO, true);
	redirect_stderr(p[1]);
	/* a copy between registries: each byte read, then sent */
	progress_begin("push", PROGRESS_READ | PROGRESS_SENT | PROGRESS_PRESENT, 2, 0);
	progress_add_total(300);
	progress_add(PROGRESS_READ, 100, 0);
	progress_add(PROGRESS_SENT, 100, 0);
	progress_add(PROGRESS_PRESENT, 200, 0);
	progress_add(PROGRESS_PACKED, 5000, 9);
	progress_end(0);
	progress_begin("extract", PROGRESS_READ | PROGRESS_EXTRACTED, 1, 0);
	progress_add(PROGRESS_EXTRACTED, 0, 4);
	progress_end(-EIO);
	restore_stderr();
	log_init(LOG_INFO, false);
	char buf[4096];
	drain(p[0], buf, sizeof(buf));
	close(p[0]);
	if (!matches(buf, "^\\{\"ts\":\"[^\"]+\",\"level\":\"info\",\"msg\":\"stage done\","
	                  "\"stage\":\"push\",\"result\":\"ok\",\"bytes\":\"100\",\"files\":\"0\","
	                  "\"seconds\":\"[0-9]+\\.[0-9]{3}\",\"totalBytes\":\"300\"\\}\n"))
		fail_msg("push: '%s'", buf);
	if (!matches(buf, "\n\\{[^\n]*\"stage\":\"extract\",\"result\":\"failed\",\"bytes\":\"0\","
	                  "\"files\":\"4\",\"seconds\":\"[0-9.]+\"\\}\n$"))
		fail_msg("extract: '%s'", buf);
}

static void test_idle(void **state)
{
	(void)state;
	/* no stage: reports and ends are nothing */
	progress_add(PROGRESS_READ, 1, 1);
	progress_add_total(5);
	progress_end(0);
}

static void test_human(void **state)
{
	(void)state;
	char b[32];
	progress_human(512, b, sizeof(b));
	assert_string_equal(b, "512 B");
	progress_human(1536, b, sizeof(b));
	assert_string_equal(b, "1.5 KiB");
	progress_human(3ull << 30, b, sizeof(b));
	assert_string_equal(b, "3.0 GiB");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_terminal), cmocka_unit_test(test_pipe_silent),
	    cmocka_unit_test(test_json),     cmocka_unit_test(test_idle),
	    cmocka_unit_test(test_human),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
