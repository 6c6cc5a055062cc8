#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LABELS 4

enum kind { COUNTER, GAUGE, HISTOGRAM };

struct series {
	struct series *next;
	char *labels[MAX_LABELS];
	double value;    /* counter / gauge; histogram sum */
	double *buckets; /* histogram: cumulative counts per bound, then +Inf */
	double count;
};

struct metric {
	struct metric *next;
	char *name, *help;
	enum kind kind;
	char *label_names[MAX_LABELS];
	size_t nlabels;
	double *bounds;
	size_t nbounds;
	struct series *series;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct metric *registry, **registry_tail = &registry;

static struct metric *create(const char *name, const char *help, const char *labels, enum kind kind,
                             const double *bounds, size_t nbounds)
{
	pthread_mutex_lock(&lock);
	struct metric *m;
	for (m = registry; m; m = m->next)
		if (strcmp(m->name, name) == 0)
			goto out;
	m = calloc(1, sizeof(*m));
	if (!m)
		goto out;
	m->name = strdup(name);
	m->help = strdup(help);
	m->kind = kind;
	if (labels) {
		char *copy = strdup(labels), *save = NULL;
		for (char *tok = strtok_r(copy, ",", &save); tok && m->nlabels < MAX_LABELS;
		     tok = strtok_r(NULL, ",", &save))
			m->label_names[m->nlabels++] = strdup(tok);
		free(copy);
	}
	if (nbounds) {
		m->bounds = calloc(nbounds, sizeof(double));
		if (m->bounds)
			memcpy(m->bounds, bounds, nbounds * sizeof(double));
		m->nbounds = m->bounds ? nbounds : 0;
	}
	*registry_tail = m;
	registry_tail = &m->next;
out:
	pthread_mutex_unlock(&lock);
	return m;
}

struct metric *metrics_counter(const char *name, const char *help, const char *labels)
{
	return create(name, help, labels, COUNTER, NULL, 0);
}

struct metric *metrics_gauge(const char *name, const char *help, const char *labels)
{
	return create(name, help, labels, GAUGE, NULL, 0);
}

struct metric *metrics_histogram(const char *name, const char *help, const char *labels,
                                 const double *buckets, size_t nbuckets)
{
	return create(name, help, labels, HISTOGRAM, buckets, nbuckets);
}

/* Find or create the series for these label values; lock held. */
static struct series *series_for(struct metric *m, const char *const *values)
{
	for (struct series *s = m->series; s; s = s->next) {
		size_t i = 0;
		while (i < m->nlabels && strcmp(s->labels[i], values[i] ? values[i] : "") == 0)
			i++;
		if (i == m->nlabels)
			return s;
	}
	struct series *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	for (size_t i = 0; i < m->nlabels; i++)
		s->labels[i] = strdup(values && values[i] ? values[i] : "");
	if (m->kind == HISTOGRAM)
		s->buckets = calloc(m->nbounds + 1, sizeof(double));
	s->next = m->series;
	m->series = s;
	return s;
}

static void update(struct metric *m, const char *const *values, double v, int op)
{
	if (!m)
		return;
	pthread_mutex_lock(&lock);
	struct series *s = series_for(m, values);
	if (s) {
		if (op == 0)
			s->value += v;
		else if (op == 1)
			s->value = v;
		else if (s->buckets) {
			s->value += v;
			s->count += 1;
			for (size_t i = 0; i < m->nbounds; i++)
				if (v <= m->bounds[i])
					s->buckets[i] += 1;
			s->buckets[m->nbounds] += 1;
		}
	}
	pthread_mutex_unlock(&lock);
}

void metrics_add(struct metric *m, const char *const *values, double v)
{
	update(m, values, v, 0);
}

void metrics_set(struct metric *m, const char *const *values, double v)
{
	update(m, values, v, 1);
}

void metrics_observe(struct metric *m, const char *const *values, double v)
{
	update(m, values, v, 2);
}

double metrics_value(struct metric *m, const char *const *values)
{
	double v = 0;
	if (!m)
		return 0;
	pthread_mutex_lock(&lock);
	struct series *s = series_for(m, values);
	if (s)
		v = m->kind == HISTOGRAM ? s->count : s->value;
	pthread_mutex_unlock(&lock);
	return v;
}

struct out {
	char *buf;
	size_t len, cap;
	bool oom;
};

static void emit(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(struct out *o, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->oom = true;
			return;
		}
		if ((size_t)n < o->cap - o->len) {
			o->len += (size_t)n;
			return;
		}
		size_t cap = (o->cap + (size_t)n + 1) * 2;
		char *b = realloc(o->buf, cap);
		if (!b) {
			o->oom = true;
			return;
		}
		o->buf = b;
		o->cap = cap;
	}
}

/* Label values are escaped per the exposition format (\\, \", \n). */
static void emit_escaped(struct out *o, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			emit(o, "\\\\");
		else if (*s == '"')
			emit(o, "\\\"");
		else if (*s == '\n')
			emit(o, "\\n");
		else
			emit(o, "%c", *s);
	}
}

static void emit_labels(struct out *o, const struct metric *m, const struct series *s,
                        const char *le)
{
	if (m->nlabels == 0 && !le)
		return;
	emit(o, "{");
	for (size_t i = 0; i < m->nlabels; i++) {
		emit(o, "%s%s=\"", i ? "," : "", m->label_names[i]);
		emit_escaped(o, s->labels[i]);
		emit(o, "\"");
	}
	if (le)
		emit(o, "%sle=\"%s\"", m->nlabels ? "," : "", le);
	emit(o, "}");
}

static void emit_value(struct out *o, double v)
{
	if (v == floor(v) && fabs(v) < 1e15)
		emit(o, " %.0f\n", v);
	else
		emit(o, " %.9g\n", v);
}

int metrics_render(char **out, size_t *len)
{
	static const char *const types[] = {"counter", "gauge", "histogram"};
	struct out o = {.buf = malloc(4096), .cap = 4096};
	if (!o.buf)
		return -ENOMEM;
	o.buf[0] = '\0';
	pthread_mutex_lock(&lock);
	for (struct metric *m = registry; m; m = m->next) {
		emit(&o, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name, types[m->kind]);
		for (struct series *s = m->series; s; s = s->next) {
			if (m->kind != HISTOGRAM) {
				emit(&o, "%s", m->name);
				emit_labels(&o, m, s, NULL);
				emit_value(&o, s->value);
				continue;
			}
			for (size_t i = 0; i <= m->nbounds; i++) {
				char le[32];
				if (i < m->nbounds)
					snprintf(le, sizeof(le), "%g", m->bounds[i]);
				else
					snprintf(le, sizeof(le), "+Inf");
				emit(&o, "%s_bucket", m->name);
				emit_labels(&o, m, s, le);
				emit_value(&o, s->buckets ? s->buckets[i] : 0);
			}
			emit(&o, "%s_sum", m->name);
			emit_labels(&o, m, s, NULL);
			emit_value(&o, s->value);
			emit(&o, "%s_count", m->name);
			emit_labels(&o, m, s, NULL);
			emit_value(&o, s->count);
		}
	}
	pthread_mutex_unlock(&lock);
	if (o.oom) {
		free(o.buf);
		return -ENOMEM;
	}
	*out = o.buf;
	*len = o.len;
	return 0;
}
