#include "progress.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define TICK_MS 100
#define RATE_TICKS 20 /* the rate shown is over the last 2 s */

enum mode { MODE_OFF, MODE_METER, MODE_JSON };

/* The one stage of this process. The counters are written by any thread;
 * the rest by the thread that begins and ends the stage, and read by the
 * ticker, which it starts after setting them and joins before changing
 * them. draw_mu orders the meter's writes with log lines. */
static struct {
	atomic_bool active;
	atomic_uint kinds;
	_Atomic uint64_t moved, present, files, total;
	enum mode mode;
	const char *stage;
	unsigned passes;
	struct timespec start;
	/* meter */
	pthread_t ticker;
	bool ticking, stop, drawn;
	pthread_mutex_t mu; /* stop, with cv */
	pthread_cond_t cv;
	pthread_mutex_t draw_mu;   /* drawn, and every write of the meter */
	uint64_t ring[RATE_TICKS]; /* done at each tick, and when */
	double ring_t[RATE_TICKS];
	unsigned nticks;
} m = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .cv = PTHREAD_COND_INITIALIZER,
       .draw_mu = PTHREAD_MUTEX_INITIALIZER};

void progress_human(uint64_t n, char *buf, size_t cap)
{
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)n;
	int i = 0;
	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	if (i == 0)
		snprintf(buf, cap, "%" PRIu64 " B", n);
	else
		snprintf(buf, cap, "%.1f %s", v, u[i]);
}

static double seconds_since(const struct timespec *t0)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The bytes of the total that are done: each moved byte is reported once
 * per pass; a blob already there counts whole. */
static uint64_t done_bytes(void)
{
	return atomic_load(&m.moved) / m.passes + atomic_load(&m.present);
}

static void put_write(const char *s, size_t n)
{
	while (n > 0) {
		ssize_t w = write(STDERR_FILENO, s, n);
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

static void eta(double secs, char *buf, size_t cap)
{
	unsigned long s = (unsigned long)(secs + 0.5);
	if (s >= 3600)
		snprintf(buf, cap, "%luh%02lum", s / 3600, s / 60 % 60);
	else if (s >= 60)
		snprintf(buf, cap, "%lum%02lus", s / 60, s % 60);
	else
		snprintf(buf, cap, "%lus", s);
}

struct line {
	char s[256];
	size_t n;
};

static void __attribute__((format(printf, 2, 3))) addf(struct line *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(l->s + l->n, sizeof(l->s) - l->n, fmt, ap);
	va_end(ap);
	if (k > 0)
		l->n = l->n + (size_t)k < sizeof(l->s) ? l->n + (size_t)k : sizeof(l->s) - 1;
}

/* The meter's text after l's "\r", cut to the terminal's width. */
static void meter_line(struct line *l, uint64_t done, double rate)
{
	char d[32], t[32], r[32], e[32];
	uint64_t total = atomic_load(&m.total), files = atomic_load(&m.files);
	/* a total known in advance is an estimate (a file grew, a mirror was
	 * retried): the meter stops at it, the final line says what moved */
	uint64_t shown = total && done > total ? total : done;
	progress_human(shown, d, sizeof(d));
	addf(l, "%-8s %s", m.stage, d);
	if (total) {
		progress_human(total, t, sizeof(t));
		addf(l, " / %s %3u%%", t, (unsigned)(shown * 100 / total));
	}
	if (files)
		addf(l, "  %" PRIu64 " files", files);
	progress_human((uint64_t)rate, r, sizeof(r));
	addf(l, "  %s/s", r);
	/* an ETA from the second second on: the first ticks' rate is noise */
	if (total && done < total && rate >= 1 && m.nticks >= 1000 / TICK_MS) {
		eta((double)(total - done) / rate, e, sizeof(e));
		addf(l, "  ETA %s", e);
	}
	struct winsize ws;
	if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && l->n > ws.ws_col)
		l->n = ws.ws_col; /* the "\r" and ws_col - 1 columns */
	l->s[l->n] = '\0';
}

/* Draw the meter, its rate over the last RATE_TICKS samples. */
static void draw(void)
{
	struct line l = {.n = 1, .s = "\r"};
	uint64_t done = done_bytes();
	double now = seconds_since(&m.start);
	unsigned i = m.nticks % RATE_TICKS, span = m.nticks < RATE_TICKS ? m.nticks : RATE_TICKS;
	unsigned j = (m.nticks - span) % RATE_TICKS;
	double rate =
	    span && now > m.ring_t[j] ? (double)(done - m.ring[j]) / (now - m.ring_t[j]) : 0;
	m.ring[i] = done;
	m.ring_t[i] = now;
	m.nticks++;
	meter_line(&l, done, rate);
	addf(&l, "\033[K");
	pthread_mutex_lock(&m.draw_mu);
	put_write(l.s, l.n);
	m.drawn = true;
	pthread_mutex_unlock(&m.draw_mu);
}

/* log_kv's writer while the meter runs: the meter's line is erased, the
 * record written, and the next tick draws the meter below it. */
static void log_over_meter(const char *line, size_t len)
{
	pthread_mutex_lock(&m.draw_mu);
	if (m.drawn)
		put_write("\r\033[K", 4);
	m.drawn = false;
	put_write(line, len);
	pthread_mutex_unlock(&m.draw_mu);
}

static void *tick(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&m.mu);
	while (!m.stop) {
		pthread_mutex_unlock(&m.mu);
		draw();
		pthread_mutex_lock(&m.mu);
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += TICK_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		while (!m.stop && pthread_cond_timedwait(&m.cv, &m.mu, &until) == 0)
			;
	}
	pthread_mutex_unlock(&m.mu);
	return NULL;
}

static enum mode pick_mode(void)
{
	if (log_json())
		return MODE_JSON;
	const char *term = getenv("TERM");
	if (isatty(STDERR_FILENO) && !(term && strcmp(term, "dumb") == 0))
		return MODE_METER;
	return MODE_OFF;
}

static void start_ticker(void)
{
	pthread_condattr_t ca;
	m.stop = false;
	m.nticks = 0;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_destroy(&m.cv);
	pthread_cond_init(&m.cv, &ca);
	pthread_condattr_destroy(&ca);
	log_set_writer(log_over_meter);
	m.ticking = pthread_create(&m.ticker, NULL, tick, NULL) == 0;
	if (!m.ticking)
		log_set_writer(NULL);
}

void progress_begin(const char *stage, unsigned kinds, unsigned passes, uint64_t total)
{
	if (atomic_load(&m.active))
		progress_end(0);
	enum mode mode = pick_mode();
	if (mode == MODE_OFF)
		return;
	m.mode = mode;
	m.stage = stage;
	m.passes = passes ? passes : 1;
	atomic_store(&m.moved, 0);
	atomic_store(&m.present, 0);
	atomic_store(&m.files, 0);
	atomic_store(&m.total, total);
	atomic_store(&m.kinds, kinds);
	clock_gettime(CLOCK_MONOTONIC, &m.start);
	atomic_store(&m.active, true);
	if (mode == MODE_METER)
		start_ticker();
}

void progress_add_total(uint64_t bytes)
{
	if (atomic_load_explicit(&m.active, memory_order_relaxed))
		atomic_fetch_add(&m.total, bytes);
}

void progress_add(enum progress_kind kind, uint64_t bytes, uint64_t files)
{
	if (!atomic_load_explicit(&m.active, memory_order_relaxed) ||
	    !(atomic_load(&m.kinds) & kind))
		return;
	if (bytes)
		atomic_fetch_add(kind == PROGRESS_PRESENT ? &m.present : &m.moved, bytes);
	if (files)
		atomic_fetch_add(&m.files, files);
}

static void end_json(int rc, double secs)
{
	char b[24], f[24], s[24], t[24];
	uint64_t total = atomic_load(&m.total);
	snprintf(b, sizeof(b), "%" PRIu64, atomic_load(&m.moved) / m.passes);
	snprintf(f, sizeof(f), "%" PRIu64, atomic_load(&m.files));
	snprintf(s, sizeof(s), "%.3f", secs);
	snprintf(t, sizeof(t), "%" PRIu64, total);
	if (total)
		log_info("stage done", "stage", m.stage, "result", rc ? "failed" : "ok", "bytes", b,
		         "files", f, "seconds", s, "totalBytes", t);
	else
		log_info("stage done", "stage", m.stage, "result", rc ? "failed" : "ok", "bytes", b,
		         "files", f, "seconds", s);
}

/* The meter's last line: what moved, in how long, how fast. */
static void end_meter(int rc, double secs)
{
	char line[300], d[32], r[32], p[32], files[40] = "", present[64] = "";
	uint64_t moved = atomic_load(&m.moved) / m.passes, nf = atomic_load(&m.files);
	uint64_t there = atomic_load(&m.present);
	pthread_mutex_lock(&m.mu);
	m.stop = true;
	pthread_cond_signal(&m.cv);
	pthread_mutex_unlock(&m.mu);
	if (m.ticking)
		pthread_join(m.ticker, NULL);
	m.ticking = false;
	log_set_writer(NULL);
	progress_human(moved, d, sizeof(d));
	progress_human(secs > 0 ? (uint64_t)((double)moved / secs) : moved, r, sizeof(r));
	if (nf)
		snprintf(files, sizeof(files), ", %" PRIu64 " files", nf);
	if (there) {
		progress_human(there, p, sizeof(p));
		snprintf(present, sizeof(present), "; %s there already", p);
	}
	int n = snprintf(line, sizeof(line), "\r\033[K%s: %s %s%s in %.1fs (%s/s)%s\n", m.stage,
	                 rc ? "stopped after" : "done,", d, files, secs, r, present);
	pthread_mutex_lock(&m.draw_mu);
	put_write(line, n > 0 && (size_t)n < sizeof(line) ? (size_t)n : strlen(line));
	m.drawn = false;
	pthread_mutex_unlock(&m.draw_mu);
}

void progress_end(int rc)
{
	if (!atomic_load(&m.active))
		return;
	atomic_store(&m.active, false);
	double secs = seconds_since(&m.start);
	if (m.mode == MODE_JSON)
		end_json(rc, secs);
	else
		end_meter(rc, secs);
}
