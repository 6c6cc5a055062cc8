/* An open-loop load generator for the admission webhook: POSTs one
 * AdmissionReview at a fixed rate over N kept-alive, verified TLS connections
 * (libcurl multi) and reports latency percentiles. Each request's latency is
 * counted from the moment it was due, not from when a connection was free,
 * so a slow server cannot hide its queueing (no coordinated omission).
 *
 *   review_load URL CA_FILE BODY_FILE RATE SECONDS CONNECTIONS [WARMUP_SECONDS]
 *
 * RATE 0 sends as fast as the connections allow (closed loop). A response
 * counts as good when it is HTTP 200 and says "allowed":true. */
#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slot {
	CURL *h;
	bool busy;
	double due;
	char buf[8192];
	size_t len;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t on_data(char *p, size_t sz, size_t n, void *ud)
{
	struct slot *s = ud;
	size_t k = sz * n, room = sizeof(s->buf) - 1 - s->len;
	memcpy(s->buf + s->len, p, k < room ? k : room);
	s->len += k < room ? k : room;
	s->buf[s->len] = '\0';
	return k;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	if (b)
		b[n] = '\0';
	fclose(f);
	return b;
}

int main(int argc, char **argv)
{
	if (argc < 7) {
		fprintf(stderr, "usage: %s URL CA BODY RATE SECONDS CONNECTIONS [WARMUP]\n", argv[0]);
		return 2;
	}
	const char *url = argv[1], *ca = argv[2];
	char *body = slurp(argv[3]);
	double rate = strtod(argv[4], NULL), secs = strtod(argv[5], NULL);
	int nconn = atoi(argv[6]);
	double warm = argc > 7 ? strtod(argv[7], NULL) : 1.0;
	if (!body || nconn < 1 || secs <= 0 || rate < 0) {
		fprintf(stderr, "bad arguments\n");
		return 2;
	}
	curl_global_init(CURL_GLOBAL_ALL);
	CURLM *m = curl_multi_init();
	curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)nconn);
	struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
	struct slot *slots = calloc((size_t)nconn, sizeof(*slots));
	for (int i = 0; i < nconn; i++) {
		CURL *h = curl_easy_init();
		curl_easy_setopt(h, CURLOPT_URL, url);
		curl_easy_setopt(h, CURLOPT_CAINFO, ca);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, &slots[i]);
		curl_easy_setopt(h, CURLOPT_PRIVATE, &slots[i]);
		curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
		slots[i].h = h;
	}
	size_t total = rate > 0 ? (size_t)(rate * (secs + warm)) : (size_t)-1;
	size_t cap = rate > 0 ? total + 1 : 1u << 22;
	double *lat = malloc(cap * sizeof(double));
	double *queue = malloc(cap * sizeof(double));
	size_t qhead = 0, qtail = 0, scheduled = 0, nlat = 0, good = 0, bad = 0, done = 0;
	double t0 = now_s(), measure_from = t0 + warm, end = t0 + warm + secs;
	int running = 0;
	for (;;) {
		double now = now_s();
		if (rate > 0) {
			while (scheduled < total && t0 + (double)scheduled / rate <= now)
				queue[qtail++] = t0 + (double)(scheduled++) / rate;
		} else if (now < end) {
			for (int i = 0; i < nconn; i++)
				if (!slots[i].busy && qtail - qhead < (size_t)nconn && qtail < cap)
					queue[qtail++] = now;
		}
		for (int i = 0; i < nconn && qhead < qtail; i++) {
			if (slots[i].busy)
				continue;
			slots[i].busy = true;
			slots[i].due = queue[qhead++];
			slots[i].len = 0;
			curl_multi_add_handle(m, slots[i].h);
		}
		curl_multi_perform(m, &running);
		CURLMsg *msg;
		int left;
		while ((msg = curl_multi_info_read(m, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			struct slot *s;
			long code = 0;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
			curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &code);
			double t = now_s();
			bool ok = msg->data.result == CURLE_OK && code == 200 &&
			          strstr(s->buf, "\"allowed\":true");
			curl_multi_remove_handle(m, s->h);
			s->busy = false;
			done++;
			if (s->due >= measure_from && s->due < end) {
				if (ok)
					good++;
				else
					bad++;
				if (nlat < cap)
					lat[nlat++] = t - s->due;
			}
			if (!ok && bad == 1 && s->due >= measure_from)
				fprintf(stderr, "first bad answer (curl %d, HTTP %ld): %.300s\n",
				        (int)msg->data.result, code, s->buf);
		}
		bool all_sent = rate > 0 ? scheduled >= total : now >= end;
		if (all_sent && qhead == qtail && running == 0) {
			bool idle = true;
			for (int i = 0; i < nconn; i++)
				idle = idle && !slots[i].busy;
			if (idle)
				break;
		}
		int wait_ms = 1;
		if (rate > 0 && scheduled < total) {
			double next = t0 + (double)scheduled / rate - now_s();
			wait_ms = next <= 0 ? 0 : next < 0.001 ? 0 : 1;
		}
		curl_multi_poll(m, NULL, 0, wait_ms, NULL);
	}
	qsort(lat, nlat, sizeof(double), cmp);
#define PCT(p) (nlat ? lat[(size_t)((double)(nlat - 1) * (p))] * 1000 : 0)
	printf("requests %zu  good %zu  bad %zu  rate %.0f/s  connections %d  p50 %.3f ms  "
	       "p90 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f ms\n",
	       good + bad, good, bad, (double)(good + bad) / secs, nconn, PCT(0.50), PCT(0.90),
	       PCT(0.99), PCT(0.999), nlat ? lat[nlat - 1] * 1000 : 0);
	for (int i = 0; i < nconn; i++)
		curl_easy_cleanup(slots[i].h);
	curl_multi_cleanup(m);
	curl_slist_free_all(hdr);
	curl_global_cleanup();
	free(slots);
	free(lat);
	free(queue);
	free(body);
	return bad ? 1 : 0;
}
