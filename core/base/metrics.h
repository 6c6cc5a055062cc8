/* Prometheus metrics: counters, gauges and histograms with labels, in one
 * process-wide registry, rendered in the text exposition format (HELP/TYPE).
 * All functions are thread-safe. Metrics are created once and never freed
 * (they live as long as the process); creating the same name twice returns
 * the first one. */
#ifndef GKM_METRICS_H
#define GKM_METRICS_H

#include <stddef.h>

struct metric;

/* labels: comma-separated label names ("method,code"), or NULL for none. */
struct metric *metrics_counter(const char *name, const char *help, const char *labels);
struct metric *metrics_gauge(const char *name, const char *help, const char *labels);
/* buckets: ascending upper bounds, +Inf is implied. */
struct metric *metrics_histogram(const char *name, const char *help, const char *labels,
                                 const double *buckets, size_t nbuckets);

/* values: one string per label name, in order (NULL when the metric has none). */
void metrics_add(struct metric *m, const char *const *values, double v);
void metrics_set(struct metric *m, const char *const *values, double v);
void metrics_observe(struct metric *m, const char *const *values, double v);

/* Shorthand for one label value. */
#define METRICS_L(...) ((const char *const[]){__VA_ARGS__})

/* Text exposition; caller frees *out with free(). 0 or -ENOMEM. */
__attribute__((warn_unused_result)) int metrics_render(char **out, size_t *len);

/* Current value of a counter/gauge series (tests, gkm up status). */
double metrics_value(struct metric *m, const char *const *values);

#endif
