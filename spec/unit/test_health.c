/* Metrics exposition and the /healthz, /readyz, /metrics endpoint, scraped
 * over real HTTP with libcurl. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <errno.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "health.h"
#include "loop.h"
#include "metrics.h"

struct body {
	char buf[65536];
	size_t len;
};

static size_t collect(char *p, size_t sz, size_t n, void *ud)
{
	struct body *b = ud;
	size_t len = sz * n;
	if (b->len + len >= sizeof(b->buf))
		len = sizeof(b->buf) - 1 - b->len;
	memcpy(b->buf + b->len, p, len);
	b->len += len;
	b->buf[b->len] = '\0';
	return sz * n;
}

static long get(uint16_t port, const char *path, struct body *b)
{
	char url[128];
	long code = 0;
	snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", port, path);
	b->len = 0;
	b->buf[0] = '\0';
	CURL *c = curl_easy_init();
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 5L);
	if (curl_easy_perform(c) == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_cleanup(c);
	return code;
}

static void test_render_format(void **state)
{
	(void)state;
	struct metric *c =
	    metrics_counter("gkm_test_calls_total", "Calls by method and code", "method,code");
	assert_ptr_equal(c, metrics_counter("gkm_test_calls_total", "again", "method,code"));
	metrics_add(c, METRICS_L("Probe", "OK"), 1);
	metrics_add(c, METRICS_L("Probe", "OK"), 2);
	metrics_add(c, METRICS_L("Node\"Publish", "NOT_FOUND"), 1);
	assert_true(metrics_value(c, METRICS_L("Probe", "OK")) == 3);
	static const double b[] = {0.1, 1, 10};
	struct metric *h = metrics_histogram("gkm_test_seconds", "Durations", NULL, b, 3);
	metrics_observe(h, NULL, 0.05);
	metrics_observe(h, NULL, 5);
	metrics_observe(h, NULL, 50);
	char *out = NULL;
	size_t len = 0;
	assert_int_equal(metrics_render(&out, &len), 0);
	assert_non_null(strstr(out, "# HELP gkm_test_calls_total Calls by method and code\n"
	                            "# TYPE gkm_test_calls_total counter\n"));
	assert_non_null(strstr(out, "gkm_test_calls_total{method=\"Probe\",code=\"OK\"} 3\n"));
	assert_non_null(
	    strstr(out, "gkm_test_calls_total{method=\"Node\\\"Publish\",code=\"NOT_FOUND\"} 1\n"));
	assert_non_null(strstr(out, "# TYPE gkm_test_seconds histogram\n"));
	assert_non_null(strstr(out, "gkm_test_seconds_bucket{le=\"0.1\"} 1\n"));
	assert_non_null(strstr(out, "gkm_test_seconds_bucket{le=\"10\"} 2\n"));
	assert_non_null(strstr(out, "gkm_test_seconds_bucket{le=\"+Inf\"} 3\n"));
	assert_non_null(strstr(out, "gkm_test_seconds_count 3\n"));
	assert_non_null(strstr(out, "gkm_test_seconds_sum 55.05\n"));
	free(out);
}

static void test_endpoints(void **state)
{
	(void)state;
	struct health_server *h = NULL;
	struct body b;
	assert_int_equal(health_start("bogus", &h), -EINVAL);
	assert_int_equal(health_start("127.0.0.1:99999", &h), -EINVAL);
	assert_int_equal(health_start("127.0.0.1:0", &h), 0);
	uint16_t port = health_port(h);
	assert_true(port > 0);

	assert_int_equal(get(port, "/healthz", &b), 200);
	assert_int_equal(get(port, "/readyz", &b), 503);
	assert_string_equal(b.buf, "starting\n");
	health_set_ready(h, false, "waiting for the first policy load");
	assert_int_equal(get(port, "/readyz", &b), 503);
	assert_string_equal(b.buf, "waiting for the first policy load\n");
	health_set_ready(h, true, NULL);
	assert_int_equal(get(port, "/readyz", &b), 200);

	metrics_add(metrics_counter("gkm_test_scraped_total", "Scraped", NULL), NULL, 7);
	assert_int_equal(get(port, "/metrics", &b), 200);
	assert_non_null(strstr(b.buf, "gkm_test_scraped_total 7\n"));
	assert_int_equal(get(port, "/nope", &b), 404);

	/* a loop that stopped beating is reported unhealthy */
	health_beat(h, 1);
	usleep(20000);
	assert_int_equal(get(port, "/healthz", &b), 503);
	health_beat(h, 0);
	assert_int_equal(get(port, "/healthz", &b), 200);
	health_stop(h);
}

int main(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_render_format),
	    cmocka_unit_test(test_endpoints),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	curl_global_cleanup();
	return rc;
}
