#include "health.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"
#include "metrics.h"

struct health_server {
	struct MHD_Daemon *d;
	uint16_t port;
	pthread_mutex_t lock;
	bool ready;
	char reason[256];
	atomic_uint_fast64_t last_beat, stale_ms;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type,
                             const char *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, mode);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", type);
	enum MHD_Result ret = MHD_queue_response(c, code, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
	struct health_server *h = cls;
	static const char text[] = "text/plain; charset=utf-8";
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, "method not allowed\n", 19,
		             MHD_RESPMEM_PERSISTENT);
	if (strcmp(url, "/healthz") == 0 || strcmp(url, "/livez") == 0) {
		uint64_t stale = atomic_load(&h->stale_ms), beat = atomic_load(&h->last_beat);
		if (stale && beat && loop_now_ms() - beat > stale)
			return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, text, "event loop stalled\n",
			             19, MHD_RESPMEM_PERSISTENT);
		return reply(c, MHD_HTTP_OK, text, "ok\n", 3, MHD_RESPMEM_PERSISTENT);
	}
	if (strcmp(url, "/readyz") == 0) {
		char buf[300];
		pthread_mutex_lock(&h->lock);
		bool ready = h->ready;
		int n = snprintf(buf, sizeof(buf), "%s\n", ready ? "ok" : h->reason);
		pthread_mutex_unlock(&h->lock);
		return reply(c, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text, buf,
		             (size_t)n, MHD_RESPMEM_MUST_COPY);
	}
	if (strcmp(url, "/metrics") == 0) {
		char *body = NULL;
		size_t len = 0;
		if (metrics_render(&body, &len) != 0)
			return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, "out of memory\n", 14,
			             MHD_RESPMEM_PERSISTENT);
		return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len,
		             MHD_RESPMEM_MUST_FREE);
	}
	return reply(c, MHD_HTTP_NOT_FOUND, text, "not found\n", 10, MHD_RESPMEM_PERSISTENT);
}

static int parse_listen(const char *listen, struct sockaddr_in *sa)
{
	const char *colon = strrchr(listen, ':');
	unsigned long port;
	char host[64];
	char *end = NULL;
	if (!colon)
		return -EINVAL;
	size_t hl = (size_t)(colon - listen);
	if (hl >= sizeof(host))
		return -EINVAL;
	memcpy(host, listen, hl);
	host[hl] = '\0';
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || !colon[1] || *end || port > 65535)
		return -EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (hl == 0)
		sa->sin_addr.s_addr = htonl(INADDR_ANY);
	else if (strcmp(host, "localhost") == 0)
		sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
		return -EINVAL;
	return 0;
}

int health_start(const char *listen, struct health_server **out)
{
	*out = NULL;
	if (!listen || !*listen)
		return 0;
	struct sockaddr_in sa;
	int rc = parse_listen(listen, &sa);
	if (rc != 0)
		return rc;
	struct health_server *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	pthread_mutex_init(&h->lock, NULL);
	snprintf(h->reason, sizeof(h->reason), "starting");
	h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, NULL, NULL,
	                        handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
	                        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
	                        MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
	if (!h->d) {
		pthread_mutex_destroy(&h->lock);
		free(h);
		return -EADDRINUSE;
	}
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = info ? info->port : ntohs(sa.sin_port);
	*out = h;
	return 0;
}

void health_stop(struct health_server *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->d);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

void health_set_ready(struct health_server *h, bool ready, const char *reason)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	h->ready = ready;
	snprintf(h->reason, sizeof(h->reason), "%s", reason ? reason : "not ready");
	pthread_mutex_unlock(&h->lock);
}

void health_beat(struct health_server *h, uint64_t stale_ms)
{
	if (!h)
		return;
	atomic_store(&h->stale_ms, stale_ms);
	atomic_store(&h->last_beat, loop_now_ms());
}

uint16_t health_port(const struct health_server *h)
{
	return h ? h->port : 0;
}
