#include "https_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "errbuf.h"
#include "log.h"
#include "loop.h"

/* TLS 1.2 and 1.3 only. */
#define TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
#define PEM_MAX (1u << 20)

/* One MHD daemon serving one certificate on the shared listening socket. */
struct instance {
	struct https_server *server;
	struct MHD_Daemon *d;
	int fd;           /* our dup of the listening socket, handed to MHD */
	char *cert, *key; /* NUL-terminated copies MHD reads from */
	atomic_uint pending;
	atomic_bool draining;
	uint64_t drain_since_ms;
	struct instance *next;
};

struct https_server {
	struct https_opts o;
	int listen_fd;
	uint16_t port;
	struct instance *current, *old;
	atomic_uint pending;
	atomic_uint unsent; /* answered, connection not finished with them yet */
};

enum rq_state { RQ_RECEIVING = 0, RQ_HANDED };

struct https_request {
	struct MHD_Connection *conn;
	struct https_server *server;
	struct instance *inst; /* NULL once orphaned */
	pthread_mutex_t lock;
	enum rq_state state;
	bool too_big, answered, suspended, orphan;
	uint64_t started_ns;
	char *body;
	size_t len, cap;
	unsigned status;
	const char *ctype;
	char *resp;
	size_t resp_len;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- certificate checks (OpenSSL; MHD itself loads them with GnuTLS) ---- */

static const char *ssl_error(void)
{
	unsigned long e = ERR_peek_last_error();
	const char *r = e ? ERR_reason_error_string(e) : NULL;
	return r ? r : "no PEM data found";
}

int https_check_pair(const char *cert, size_t cert_len, const char *key, size_t key_len,
                     int64_t *not_after, char *err, size_t errlen)
{
	BIO *cb = NULL, *kb = NULL;
	X509 *x = NULL;
	EVP_PKEY *pk = NULL;
	int rc = -EINVAL;
	ERR_clear_error();
	if (cert_len == 0 || cert_len > PEM_MAX || key_len == 0 || key_len > PEM_MAX) {
		errbuf_set(err, errlen, "certificate or key is empty or larger than %u bytes",
		           PEM_MAX);
		return -EINVAL;
	}
	cb = BIO_new_mem_buf(cert, (int)cert_len);
	kb = BIO_new_mem_buf(key, (int)key_len);
	if (!cb || !kb) {
		rc = -ENOMEM;
		errbuf_set(err, errlen, "out of memory");
		goto out;
	}
	if (!(x = PEM_read_bio_X509(cb, NULL, NULL, NULL))) {
		errbuf_set(err, errlen, "certificate: not a PEM certificate (%s)", ssl_error());
		goto out;
	}
	ERR_clear_error();
	if (!(pk = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL))) {
		errbuf_set(err, errlen, "key: not an unencrypted PEM private key (%s)",
		           ssl_error());
		goto out;
	}
	if (X509_check_private_key(x, pk) != 1) {
		errbuf_set(err, errlen, "the key does not belong to the certificate");
		goto out;
	}
	if (not_after) {
		struct tm tm;
		if (ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm) != 1) {
			errbuf_set(err, errlen, "certificate has an unreadable expiry time");
			goto out;
		}
		*not_after = (int64_t)timegm(&tm);
	}
	rc = 0;
out:
	EVP_PKEY_free(pk);
	X509_free(x);
	BIO_free(kb);
	BIO_free(cb);
	ERR_clear_error();
	return rc;
}

/* ---- the listening socket ---- */

/* ":8443" (all addresses), "HOST:PORT", "[V6]:PORT". */
static int open_listener(const char *listen_on, int *fd_out, uint16_t *port_out, char *err,
                         size_t errlen)
{
	char host[256];
	const char *colon = strrchr(listen_on, ':');
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	int rc = -EINVAL, fd = -1;
	if (!colon || !colon[1] || (size_t)(colon - listen_on) >= sizeof(host)) {
		errbuf_set(err, errlen, "listen address '%s': want HOST:PORT or :PORT", listen_on);
		return -EINVAL;
	}
	char *pend = NULL;
	unsigned long port_num = strtoul(colon + 1, &pend, 10);
	if (*pend || port_num > 65535 || colon[1] == '-' || colon[1] == '+') {
		errbuf_set(err, errlen, "listen address '%s': port must be 0 to 65535", listen_on);
		return -EINVAL;
	}
	size_t hl = (size_t)(colon - listen_on);
	memcpy(host, listen_on, hl);
	host[hl] = '\0';
	char *h = host;
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
		host[hl - 1] = '\0';
		h = host + 1;
	}
	if (strcmp(h, "localhost") == 0)
		h = "127.0.0.1";
	int gai = getaddrinfo(h[0] ? h : NULL, colon + 1, &hints, &res);
	if (gai != 0) {
		errbuf_set(err, errlen, "listen address '%s': %s", listen_on, gai_strerror(gai));
		return -EINVAL;
	}
	/* for ":PORT" prefer a dual-stack IPv6 socket, else IPv4 */
	for (int pass = 0; pass < 2 && fd < 0; pass++) {
		for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
			if (!h[0] && (pass == 0) != (ai->ai_family == AF_INET6))
				continue;
			if (h[0] && pass == 1)
				break;
			int s =
			    socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
			if (s < 0) {
				rc = -errno;
				continue;
			}
			int on = 1, off = 0;
			setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
			if (ai->ai_family == AF_INET6 && !h[0])
				setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
			if (bind(s, ai->ai_addr, ai->ai_addrlen) != 0 || listen(s, 512) != 0) {
				rc = -errno;
				close(s);
				continue;
			}
			fd = s;
		}
	}
	freeaddrinfo(res);
	if (fd < 0) {
		errbuf_set(err, errlen, "cannot listen on '%s': %s", listen_on, strerror(-rc));
		return rc;
	}
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	uint16_t port = 0;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
		                                      : ((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = fd;
	*port_out = port;
	return 0;
}

/* ---- requests ---- */

static void request_free(struct https_request *rq)
{
	pthread_mutex_destroy(&rq->lock);
	free(rq->body);
	free(rq->resp);
	free(rq);
}

static enum MHD_Result send_simple(struct MHD_Connection *c, unsigned status, const char *text)
{
	struct MHD_Response *r =
	    MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "POST");
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_answer(struct https_request *rq)
{
	struct MHD_Response *r;
	if (rq->resp) {
		r = MHD_create_response_from_buffer(rq->resp_len, rq->resp, MHD_RESPMEM_MUST_FREE);
		if (r)
			rq->resp = NULL; /* the response owns it now */
	} else {
		r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	}
	if (!r)
		return MHD_NO;
	if (rq->ctype)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, rq->ctype);
	/* clients of a replaced certificate reconnect to the new daemon */
	if (atomic_load(&rq->inst->draining))
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	enum MHD_Result ret = MHD_queue_response(rq->conn, rq->status, r);
	MHD_destroy_response(r);
	return ret;
}

static int append_body(struct https_request *rq, const char *data, size_t n, size_t max)
{
	if (rq->too_big || rq->len + n > max) {
		rq->too_big = true;
		return 0;
	}
	if (rq->len + n + 1 > rq->cap) {
		size_t cap = rq->cap ? rq->cap : 4096;
		while (cap < rq->len + n + 1)
			cap *= 2;
		char *b = realloc(rq->body, cap);
		if (!b)
			return -ENOMEM;
		rq->body = b;
		rq->cap = cap;
	}
	memcpy(rq->body + rq->len, data, n);
	rq->len += n;
	rq->body[rq->len] = '\0';
	return 0;
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls)
{
	struct instance *in = cls;
	struct https_server *s = in->server;
	struct https_request *rq = *con_cls;
	if (!rq) {
		rq = calloc(1, sizeof(*rq));
		if (!rq)
			return MHD_NO;
		pthread_mutex_init(&rq->lock, NULL);
		rq->conn = c;
		rq->server = s;
		rq->inst = in;
		rq->started_ns = mono_ns();
		*con_cls = rq;
		return MHD_YES;
	}
	if (rq->state == RQ_RECEIVING) {
		if (*upload_size) {
			if (append_body(rq, upload, *upload_size, s->o.max_body) != 0)
				return MHD_NO;
			*upload_size = 0;
			return MHD_YES;
		}
		if (strcmp(method, MHD_HTTP_METHOD_POST) != 0)
			return send_simple(c, MHD_HTTP_METHOD_NOT_ALLOWED,
			                   "POST an AdmissionReview\n");
		if (rq->too_big)
			return send_simple(c, MHD_HTTP_CONTENT_TOO_LARGE,
			                   "request body too large\n");
		rq->state = RQ_HANDED;
		atomic_fetch_add(&in->pending, 1);
		atomic_fetch_add(&s->pending, 1);
		s->o.handler(rq, url, rq->body ? rq->body : "", rq->len, s->o.ud);
		pthread_mutex_lock(&rq->lock);
		if (!rq->answered) {
			/* answered later from another thread, which resumes us */
			MHD_suspend_connection(c);
			rq->suspended = true;
			pthread_mutex_unlock(&rq->lock);
			return MHD_YES;
		}
		pthread_mutex_unlock(&rq->lock);
	}
	return send_answer(rq);
}

static void completed_cb(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
	struct https_request *rq = *con_cls;
	if (!rq)
		return;
	*con_cls = NULL;
	pthread_mutex_lock(&rq->lock);
	if (rq->answered && !rq->orphan)
		atomic_fetch_sub(&rq->server->unsent, 1);
	if (rq->state == RQ_HANDED && !rq->answered) {
		/* the daemon was stopped under a request still being decided: the
		 * answer frees it when it comes */
		rq->orphan = true;
		atomic_fetch_sub(&rq->inst->pending, 1);
		rq->inst = NULL;
		pthread_mutex_unlock(&rq->lock);
		return;
	}
	pthread_mutex_unlock(&rq->lock);
	request_free(rq);
}

void https_reply(struct https_request *rq, unsigned status, const char *content_type, char *body,
                 size_t len)
{
	pthread_mutex_lock(&rq->lock);
	rq->status = status;
	rq->ctype = content_type;
	rq->resp = body;
	rq->resp_len = body ? len : 0;
	rq->answered = true;
	atomic_fetch_sub(&rq->server->pending, 1);
	if (rq->orphan) {
		pthread_mutex_unlock(&rq->lock);
		request_free(rq);
		return;
	}
	atomic_fetch_sub(&rq->inst->pending, 1);
	atomic_fetch_add(&rq->server->unsent, 1);
	if (rq->suspended)
		MHD_resume_connection(rq->conn);
	pthread_mutex_unlock(&rq->lock);
}

uint64_t https_request_started_ns(const struct https_request *rq)
{
	return rq->started_ns;
}

/* ---- daemons ---- */

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
		msg[--n] = '\0';
	log_debug("https", "detail", msg);
}

static char *dup_pem(const char *p, size_t n)
{
	char *s = malloc(n + 1);
	if (s) {
		memcpy(s, p, n);
		s[n] = '\0';
	}
	return s;
}

static void instance_free(struct instance *in)
{
	if (in->d)
		MHD_stop_daemon(in->d);
	if (in->fd >= 0)
		close(in->fd);
	free(in->cert);
	free(in->key);
	free(in);
}

static int instance_start(struct https_server *s, const char *cert, size_t cert_len,
                          const char *key, size_t key_len, struct instance **out, char *err,
                          size_t errlen)
{
	struct instance *in = calloc(1, sizeof(*in));
	if (!in)
		return -ENOMEM;
	in->server = s;
	in->fd = fcntl(s->listen_fd, F_DUPFD_CLOEXEC, 0);
	in->cert = dup_pem(cert, cert_len);
	in->key = dup_pem(key, key_len);
	if (in->fd < 0 || !in->cert || !in->key) {
		int rc = in->fd < 0 ? -errno : -ENOMEM;
		errbuf_set(err, errlen, "cannot prepare the listener: %s", strerror(-rc));
		instance_free(in);
		return rc;
	}
	unsigned flags = MHD_USE_TLS | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
	                 MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
	unsigned threads = s->o.threads ? s->o.threads : 1;
	in->d = MHD_start_daemon(
	    flags, 0, NULL, NULL, access_cb, in, MHD_OPTION_LISTEN_SOCKET, in->fd,
	    MHD_OPTION_HTTPS_MEM_CERT, in->cert, MHD_OPTION_HTTPS_MEM_KEY, in->key,
	    MHD_OPTION_HTTPS_PRIORITIES, TLS_PRIORITIES, MHD_OPTION_NOTIFY_COMPLETED, completed_cb,
	    in, MHD_OPTION_CONNECTION_TIMEOUT, s->o.timeout_s, MHD_OPTION_CONNECTION_LIMIT,
	    s->o.conn_limit, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_THREAD_POOL_SIZE,
	    threads > 1 ? threads : 0, MHD_OPTION_END);
	if (!in->d) {
		/* MHD may have closed the descriptor it was given: leave it alone */
		in->fd = -1;
		errbuf_set(err, errlen,
		           "the HTTPS server did not start (TLS setup refused the pair?)");
		instance_free(in);
		return -EIO;
	}
	*out = in;
	return 0;
}

/* Stop accepting on in; it keeps serving what it has. */
static void instance_quiesce(struct instance *in)
{
	atomic_store(&in->draining, true);
	in->drain_since_ms = loop_now_ms();
	/* the returned descriptor is our in->fd: closed after MHD_stop_daemon */
	(void)MHD_quiesce_daemon(in->d);
}

int https_start(const struct https_opts *o, const char *cert, size_t cert_len, const char *key,
                size_t key_len, struct https_server **out, char *err, size_t errlen)
{
	int rc;
	if (!MHD_is_feature_supported(MHD_FEATURE_TLS)) {
		errbuf_set(err, errlen, "libmicrohttpd was built without TLS support");
		return -ENOTSUP;
	}
	if ((rc = https_check_pair(cert, cert_len, key, key_len, NULL, err, errlen)) != 0)
		return rc;
	struct https_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->o = *o;
	if (!s->o.max_body)
		s->o.max_body = 1u << 20;
	if (!s->o.conn_limit)
		s->o.conn_limit = 1024;
	if (!s->o.timeout_s)
		s->o.timeout_s = 30;
	if (!s->o.drain_s)
		s->o.drain_s = 30;
	s->listen_fd = -1;
	if ((rc = open_listener(o->listen, &s->listen_fd, &s->port, err, errlen)) != 0)
		goto fail;
	if ((rc = instance_start(s, cert, cert_len, key, key_len, &s->current, err, errlen)) != 0)
		goto fail;
	*out = s;
	return 0;
fail:
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	free(s);
	return rc;
}

int https_set_cert(struct https_server *s, const char *cert, size_t cert_len, const char *key,
                   size_t key_len, char *err, size_t errlen)
{
	struct instance *in = NULL;
	int rc = https_check_pair(cert, cert_len, key, key_len, NULL, err, errlen);
	if (rc != 0)
		return rc;
	if ((rc = instance_start(s, cert, cert_len, key, key_len, &in, err, errlen)) != 0)
		return rc;
	struct instance *prev = s->current;
	s->current = in;
	instance_quiesce(prev);
	prev->next = s->old;
	s->old = prev;
	return 0;
}

unsigned https_reap(struct https_server *s)
{
	uint64_t now = loop_now_ms();
	unsigned left = 0;
	for (struct instance **p = &s->old; *p;) {
		struct instance *in = *p;
		const union MHD_DaemonInfo *info =
		    MHD_get_daemon_info(in->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
		unsigned conns = info ? info->num_connections : 0;
		bool expired = now - in->drain_since_ms > (uint64_t)s->o.drain_s * 1000u;
		if (atomic_load(&in->pending) == 0 && (conns == 0 || expired)) {
			*p = in->next;
			instance_free(in);
			continue;
		}
		left++;
		p = &in->next;
	}
	return left;
}

void https_stop(struct https_server *s)
{
	if (!s)
		return;
	if (s->current)
		instance_quiesce(s->current);
	/* let answers given just before (a review decided while shutting down)
	 * reach their clients, for a short while */
	for (int i = 0; i < 200 && atomic_load(&s->unsent) > 0; i++) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (s->current)
		instance_free(s->current);
	while (s->old) {
		struct instance *in = s->old;
		s->old = in->next;
		instance_free(in);
	}
	close(s->listen_fd);
	free(s);
}

uint16_t https_port(const struct https_server *s)
{
	return s->port;
}

unsigned https_pending(const struct https_server *s)
{
	return atomic_load(&s->pending);
}
