/* A loopback HTTP/1.1 server for unit tests that answers requests from a
 * script of recorded responses (the exchanges in the fixtures of a real API
 * server) and records what the client sent, so a test checks both sides of
 * each exchange through the client's real libcurl path.
 *
 * Header-only: include it in one test file. Not thread-safe beyond the one
 * server thread it starts. */
#ifndef KUBE_REPLAY_H
#define KUBE_REPLAY_H

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define REPLAY_MAX 64

struct replay_resp {
	int status;
	char *body; /* owned */
	size_t len;
	bool raw;          /* body is the whole response (status line included); close after */
	bool close_after;  /* no Content-Length: close-delimited (streams) */
	unsigned delay_ms; /* before answering */
};

struct replay_req {
	char method[16];
	char path[4096];
	char content_type[128];
	char authorization[256];
	char *body; /* owned, NUL-terminated */
	size_t len;
};

struct replay {
	int lfd;
	int port;
	pthread_t th;
	pthread_mutex_t mu;
	struct replay_resp resp[REPLAY_MAX];
	unsigned nresp, next;
	struct replay_req req[REPLAY_MAX];
	unsigned nreq;
	unsigned connections;
	volatile bool stop;
};

static inline void replay_push(struct replay *r, int status, const char *body, size_t len,
                               bool close_after)
{
	pthread_mutex_lock(&r->mu);
	struct replay_resp *p = &r->resp[r->nresp++];
	p->status = status;
	p->body = malloc(len + 1);
	memcpy(p->body, body, len);
	p->body[len] = 0;
	p->len = len;
	p->close_after = close_after;
	p->raw = false;
	pthread_mutex_unlock(&r->mu);
}

static inline void replay_push_raw(struct replay *r, const char *bytes, size_t len)
{
	replay_push(r, 0, bytes, len, true);
	r->resp[r->nresp - 1].raw = true;
}

/* Push the response of a recorded exchange file; a watch body (a list of
 * events) becomes one JSON object per line on a close-delimited stream. */
static inline cJSON *replay_load(const char *file)
{
	char path[1024];
	const char *dir = getenv("KUBE_FIXTURES");
	snprintf(path, sizeof(path), "%s/%s", dir ? dir : "spec/fixtures/kube-apiserver", file);
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t cap = 0, len = 0, n;
	do {
		if (len + 65536 > cap) {
			cap = cap ? cap * 2 : 262144;
			buf = realloc(buf, cap);
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	fclose(f);
	cJSON *j = cJSON_ParseWithLength(buf, len);
	free(buf);
	return j;
}

/* A recorded watch body (a list of events) as the stream the server sent:
 * one JSON object per line. Caller frees. */
static inline char *replay_stream_of(const cJSON *fx, size_t *len)
{
	const cJSON *body = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "response"), "body");
	size_t cap = 1 << 20, n = 0;
	char *s = malloc(cap);
	const cJSON *ev;
	cJSON_ArrayForEach(ev, body)
	{
		char *line = cJSON_PrintUnformatted(ev);
		n += (size_t)snprintf(s + n, cap - n, "%s\n", line);
		free(line);
	}
	*len = n;
	return s;
}

static inline void replay_push_fixture(struct replay *r, const cJSON *fx)
{
	const cJSON *resp = cJSON_GetObjectItem(fx, "response");
	int status = cJSON_GetObjectItem(resp, "status")->valueint;
	const cJSON *body = cJSON_GetObjectItem(resp, "body");
	const char *path =
	    cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "request"), "path")->valuestring;
	bool watch = strstr(path, "watch=1") != NULL;
	if (watch && cJSON_IsArray(body)) {
		size_t len;
		char *s = replay_stream_of(fx, &len);
		replay_push(r, status, s, len, true);
		free(s);
		return;
	}
	char *text =
	    cJSON_IsString(body) ? strdup(body->valuestring) : cJSON_PrintUnformatted(body);
	replay_push(r, status, text, strlen(text), false);
	free(text);
}

static inline bool read_line(int fd, char *buf, size_t len)
{
	size_t i = 0;
	while (i + 1 < len) {
		char ch;
		ssize_t n = read(fd, &ch, 1);
		if (n <= 0)
			return false;
		if (ch == '\n') {
			if (i && buf[i - 1] == '\r')
				i--;
			buf[i] = 0;
			return true;
		}
		buf[i++] = ch;
	}
	buf[i] = 0;
	return true;
}

static inline void write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w <= 0)
			return;
		p += w;
		n -= (size_t)w;
	}
}

static inline void replay_serve(struct replay *r, int fd)
{
	for (;;) {
		char line[8192];
		if (!read_line(fd, line, sizeof(line)) || !line[0])
			return;
		struct replay_req q;
		memset(&q, 0, sizeof(q));
		sscanf(line, "%15s %4095s", q.method, q.path);
		size_t clen = 0;
		while (read_line(fd, line, sizeof(line)) && line[0]) {
			if (!strncasecmp(line, "Content-Length:", 15))
				clen = strtoul(line + 15, NULL, 10);
			else if (!strncasecmp(line, "Content-Type:", 13))
				snprintf(q.content_type, sizeof(q.content_type), "%.120s",
				         line + 14);
			else if (!strncasecmp(line, "Authorization:", 14))
				snprintf(q.authorization, sizeof(q.authorization), "%.250s",
				         line + 15);
		}
		q.body = calloc(1, clen + 1);
		size_t got = 0;
		while (got < clen) {
			ssize_t n = read(fd, q.body + got, clen - got);
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		q.len = got;
		pthread_mutex_lock(&r->mu);
		if (r->nreq < REPLAY_MAX)
			r->req[r->nreq++] = q;
		else
			free(q.body);
		struct replay_resp *p = r->next < r->nresp ? &r->resp[r->next++] : NULL;
		pthread_mutex_unlock(&r->mu);
		if (!p) {
			const char *nf = "HTTP/1.1 599 No Script\r\nContent-Length: 0\r\n\r\n";
			write_all(fd, nf, strlen(nf));
			return;
		}
		for (unsigned t = 0; t < p->delay_ms && !r->stop; t += 10)
			usleep(10000);
		if (p->raw) {
			write_all(fd, p->body, p->len);
			return;
		}
		char hdr[256];
		int hn;
		if (p->close_after)
			hn = snprintf(hdr, sizeof(hdr),
			              "HTTP/1.1 %d X\r\nContent-Type: "
			              "application/json\r\nConnection: close\r\n\r\n",
			              p->status);
		else
			hn = snprintf(hdr, sizeof(hdr),
			              "HTTP/1.1 %d X\r\nContent-Type: "
			              "application/json\r\nContent-Length: %zu\r\n\r\n",
			              p->status, p->len);
		write_all(fd, hdr, (size_t)hn);
		write_all(fd, p->body, p->len);
		if (p->close_after)
			return;
	}
}

static void *replay_thread(void *ud)
{
	struct replay *r = ud;
	while (!r->stop) {
		int fd = accept(r->lfd, NULL, NULL);
		if (fd < 0)
			continue;
		if (r->stop) {
			close(fd);
			break;
		}
		pthread_mutex_lock(&r->mu);
		r->connections++;
		pthread_mutex_unlock(&r->mu);
		replay_serve(r, fd);
		close(fd);
	}
	return NULL;
}

static inline struct replay *replay_start(void)
{
	struct replay *r = calloc(1, sizeof(*r));
	pthread_mutex_init(&r->mu, NULL);
	r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	bind(r->lfd, (struct sockaddr *)&a, sizeof(a));
	socklen_t al = sizeof(a);
	getsockname(r->lfd, (struct sockaddr *)&a, &al);
	r->port = ntohs(a.sin_port);
	listen(r->lfd, 16);
	pthread_create(&r->th, NULL, replay_thread, r);
	return r;
}

static inline void replay_stop(struct replay *r)
{
	r->stop = true;
	/* Wake accept() with a connection of our own. */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons((uint16_t)r->port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		shutdown(fd, SHUT_RDWR);
	close(fd);
	pthread_join(r->th, NULL);
	close(r->lfd);
	for (unsigned i = 0; i < r->nresp; i++)
		free(r->resp[i].body);
	for (unsigned i = 0; i < r->nreq; i++)
		free(r->req[i].body);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

/* With kube_client.h included first: a client of the replay server, with a
 * hand-made configuration (no kubeconfig file). Free with replay_client_free. */
#ifdef GKM_KUBE_CLIENT_H
static inline struct kube_client *replay_client(struct replay *r, struct kube_config **cfg)
{
	struct kube_config *c = calloc(1, sizeof(*c));
	pthread_mutex_init(&c->token_lock, NULL);
	char url[64];
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", r->port);
	c->server = strdup(url);
	c->namespace = strdup("default");
	struct kube_client *kc = NULL;
	if (kube_client_new(c, NULL, &kc) != 0)
		abort();
	*cfg = c;
	return kc;
}

static inline void replay_client_free(struct kube_client *kc, struct kube_config *cfg)
{
	kube_client_free(kc);
	kube_config_free(cfg);
}
#endif

#endif
