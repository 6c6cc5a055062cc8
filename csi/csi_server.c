#include "csi_server.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"

enum {
	THREADS_MAX = 64,
	POLLERS = 2,
	MESSAGE_MAX = 4 * 1024 * 1024, /* largest request accepted */
	PENDING_CALLS = 32,            /* calls requested ahead of arrival */
	STUCK_MS = 5000,               /* after cancelling, before giving up */
};

enum tag_kind { TAG_NEW, TAG_RECV, TAG_FINISH, TAG_SHUTDOWN };

struct call;

struct tag {
	enum tag_kind kind;
	struct call *call;
};

struct call {
	struct csi_server *srv;
	grpc_call *call;
	grpc_call_details details;
	grpc_metadata_array md;
	grpc_byte_buffer *payload;  /* request */
	grpc_byte_buffer *response; /* destroyed when the final batch is done */
	int cancelled;
	bool received;     /* the request message arrived */
	struct call *next; /* in the handler queue */
	struct tag t_new, t_recv, t_finish;
};

struct csi_server {
	grpc_server *server;
	grpc_completion_queue *cq;
	/* Pollers only move gRPC along (in gRPC core, I/O makes progress in the
	 * threads that wait on the completion queue), so they never run a
	 * handler: with every handler busy, new calls are still read in, and a
	 * drain sees all of them. Handlers take calls from the queue. */
	pthread_t pollers[POLLERS];
	unsigned npollers;
	pthread_t handlers[THREADS_MAX];
	unsigned nhandlers;
	struct call *queue, **queue_tail;
	bool handlers_quit;
	csi_server_handler handler;
	void *ud;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	ino_t ino;
	struct tag t_shutdown;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stopping, shut_down;
	unsigned active; /* calls between arrival and their final batch */
};

int csi_server_parse_endpoint(const char *endpoint, char *path, size_t size)
{
	const char *p = endpoint;
	if (!p)
		return -EINVAL;
	if (strncmp(p, "unix://", 7) == 0)
		p += 7;
	else if (strncmp(p, "unix:", 5) == 0)
		p += 5;
	if (p[0] != '/' || p[1] == '\0')
		return -EINVAL;
	size_t n = strlen(p);
	if (n >= size || n >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return -ENAMETOOLONG;
	memcpy(path, p, n + 1);
	return 0;
}

const char *csi_server_path(const struct csi_server *s)
{
	return s->path;
}

/* Make the socket path free: remove a socket nobody listens on, refuse a
 * live one or anything else. */
static int claim_path(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	close(fd);
	if (rc == 0)
		return -EADDRINUSE;
	if (e != ECONNREFUSED && e != ENOENT)
		return -e;
	log_info("replacing stale CSI socket", "path", path);
	if (unlink(path) != 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static struct call *call_new(struct csi_server *s)
{
	struct call *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->srv = s;
	grpc_call_details_init(&c->details);
	grpc_metadata_array_init(&c->md);
	c->t_new = (struct tag){TAG_NEW, c};
	c->t_recv = (struct tag){TAG_RECV, c};
	c->t_finish = (struct tag){TAG_FINISH, c};
	return c;
}

static void call_free(struct call *c)
{
	if (c->payload)
		grpc_byte_buffer_destroy(c->payload);
	if (c->response)
		grpc_byte_buffer_destroy(c->response);
	grpc_metadata_array_destroy(&c->md);
	grpc_call_details_destroy(&c->details);
	if (c->call)
		grpc_call_unref(c->call);
	free(c);
}

/* Ask gRPC for the next incoming call (one of several kept pending). */
static void request_call(struct csi_server *s)
{
	pthread_mutex_lock(&s->lock);
	bool stopping = s->stopping;
	pthread_mutex_unlock(&s->lock);
	if (stopping)
		return;
	struct call *c = call_new(s);
	if (!c) {
		log_error("out of memory: one fewer pending CSI call slot");
		return;
	}
	grpc_call_error e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md,
	                                             s->cq, s->cq, &c->t_new);
	if (e != GRPC_CALL_OK) {
		log_error("grpc_server_request_call failed", "error", grpc_call_error_to_string(e));
		call_free(c);
	}
}

static void call_done(struct call *c)
{
	struct csi_server *s = c->srv;
	call_free(c);
	pthread_mutex_lock(&s->lock);
	s->active--;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* Send the answer and the status, and learn when the client is done. */
static void finish(struct call *c, const struct csi_reply *r)
{
	grpc_op ops[4];
	size_t n = 0;
	grpc_slice details = grpc_slice_from_copied_string(r->message);
	memset(ops, 0, sizeof(ops));
	ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[n++].data.send_initial_metadata.count = 0;
	if (r->code == CSI_OK) {
		grpc_slice body = grpc_slice_from_copied_buffer((const char *)r->body, r->body_len);
		c->response = grpc_raw_byte_buffer_create(&body, 1);
		grpc_slice_unref(body);
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n++].data.send_message.send_message = c->response;
	}
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = (grpc_status_code)r->code;
	ops[n++].data.send_status_from_server.status_details = r->message[0] ? &details : NULL;
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
	grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_finish, NULL);
	grpc_slice_unref(details); /* not retained past start_batch */
	if (e != GRPC_CALL_OK) {
		log_error("cannot answer CSI call", "error", grpc_call_error_to_string(e));
		call_done(c);
	}
}

static void on_new(struct call *c, bool ok)
{
	struct csi_server *s = c->srv;
	if (!ok) { /* the server is shutting down */
		call_free(c);
		return;
	}
	pthread_mutex_lock(&s->lock);
	s->active++;
	pthread_mutex_unlock(&s->lock);
	request_call(s); /* keep the number of pending slots */
	grpc_op op;
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = &c->payload;
	grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->t_recv, NULL);
	if (e != GRPC_CALL_OK) {
		log_error("cannot read CSI call", "error", grpc_call_error_to_string(e));
		call_done(c);
	}
}

static void on_recv(struct call *c, bool ok)
{
	struct csi_server *s = c->srv;
	c->received = ok && c->payload;
	pthread_mutex_lock(&s->lock);
	c->next = NULL;
	*s->queue_tail = c;
	s->queue_tail = &c->next;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static void handle_call(struct call *c)
{
	struct csi_server *s = c->srv;
	struct csi_reply r;
	memset(&r, 0, sizeof(r));
	char *method = grpc_slice_to_c_string(c->details.method);
	if (!c->received) {
		/* The client went away or sent no message for a unary call. */
		r.code = CSI_INVALID_ARGUMENT;
		snprintf(r.message, sizeof(r.message), "no request message");
	} else {
		grpc_byte_buffer_reader reader;
		if (!grpc_byte_buffer_reader_init(&reader, c->payload)) {
			r.code = CSI_INTERNAL;
			snprintf(r.message, sizeof(r.message), "cannot read the request message");
		} else {
			grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
			grpc_byte_buffer_reader_destroy(&reader);
			s->handler(s->ud, method, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all),
			           &r);
			grpc_slice_unref(all);
		}
	}
	gpr_free(method);
	finish(c, &r);
	free(r.body);
}

static void *handler_main(void *arg)
{
	struct csi_server *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		while (!s->queue && !s->handlers_quit)
			pthread_cond_wait(&s->cond, &s->lock);
		struct call *c = s->queue;
		if (!c) {
			pthread_mutex_unlock(&s->lock);
			return NULL;
		}
		s->queue = c->next;
		if (!s->queue)
			s->queue_tail = &s->queue;
		pthread_mutex_unlock(&s->lock);
		handle_call(c);
	}
}

static void handle_event(struct csi_server *s, grpc_event ev)
{
	if (ev.type != GRPC_OP_COMPLETE)
		return;
	struct tag *t = ev.tag;
	switch (t->kind) {
	case TAG_NEW:
		on_new(t->call, ev.success);
		break;
	case TAG_RECV:
		on_recv(t->call, ev.success);
		break;
	case TAG_FINISH:
		call_done(t->call);
		break;
	case TAG_SHUTDOWN:
		pthread_mutex_lock(&s->lock);
		s->shut_down = true;
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
		break;
	}
}

static void *poller_main(void *arg)
{
	struct csi_server *s = arg;
	for (;;) {
		grpc_event ev =
		    grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		handle_event(s, ev);
	}
	return NULL;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Wait until cond (evaluated under the lock) or the deadline; true if met. */
static bool wait_until(struct csi_server *s, bool (*cond)(struct csi_server *),
                       uint64_t deadline_ms)
{
	pthread_mutex_lock(&s->lock);
	while (!cond(s)) {
		if (now_ms() >= deadline_ms)
			break;
		struct timespec ts = {.tv_sec = (time_t)(deadline_ms / 1000u),
		                      .tv_nsec = (long)(deadline_ms % 1000u) * 1000000L};
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
	}
	bool met = cond(s);
	pthread_mutex_unlock(&s->lock);
	return met;
}

static bool is_shut_down(struct csi_server *s)
{
	return s->shut_down;
}

static void remove_socket(struct csi_server *s)
{
	struct stat st;
	/* Only the socket this server made: a successor may already own the path. */
	if (s->path[0] && lstat(s->path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == s->ino)
		unlink(s->path);
}

int csi_server_stop(struct csi_server *s, unsigned drain_ms)
{
	int cancelled = 0;
	if (!s)
		return 0;
	if (s->server) {
		pthread_mutex_lock(&s->lock);
		s->stopping = true;
		unsigned active = s->active;
		pthread_mutex_unlock(&s->lock);
		char n[16];
		snprintf(n, sizeof(n), "%u", active);
		log_info("CSI server stopping", "calls_in_flight", n);
		grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
		/* A start that failed before any poller ran: drive the queue here. */
		while (s->npollers == 0 && !s->shut_down)
			handle_event(s, grpc_completion_queue_next(
			                    s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL));
		if (!wait_until(s, is_shut_down, now_ms() + drain_ms + 1)) {
			pthread_mutex_lock(&s->lock);
			cancelled = (int)s->active;
			pthread_mutex_unlock(&s->lock);
			log_warn("CSI calls still running at the drain deadline: cancelling them");
			grpc_server_cancel_all_calls(s->server);
			/* Cancelling only ends calls that wait for their client; a
			 * handler stuck in the kernel keeps its call alive. */
			if (!wait_until(s, is_shut_down, now_ms() + STUCK_MS)) {
				log_error(
				    "CSI handlers still running after cancelling: leaving them");
				return -EBUSY;
			}
		}
	}
	/* Every call is done, so the handler queue is empty. */
	pthread_mutex_lock(&s->lock);
	s->handlers_quit = true;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	for (unsigned i = 0; i < s->nhandlers; i++)
		pthread_join(s->handlers[i], NULL);
	if (s->cq)
		grpc_completion_queue_shutdown(s->cq);
	for (unsigned i = 0; i < s->npollers; i++)
		pthread_join(s->pollers[i], NULL);
	if (s->server)
		grpc_server_destroy(s->server);
	if (s->cq)
		grpc_completion_queue_destroy(s->cq);
	remove_socket(s);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s);
	grpc_shutdown();
	return cancelled;
}

int csi_server_start(const char *endpoint, unsigned threads, csi_server_handler handler, void *ud,
                     struct csi_server **out)
{
	char addr[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	char parent[PATH_MAX];
	struct stat st;
	if (threads == 0 || threads > THREADS_MAX || !handler)
		return -EINVAL;
	struct csi_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	s->handler = handler;
	s->ud = ud;
	s->queue_tail = &s->queue;
	s->t_shutdown.kind = TAG_SHUTDOWN;
	grpc_init();
	gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);

	int rc = csi_server_parse_endpoint(endpoint, s->path, sizeof(s->path));
	if (rc)
		goto fail;
	const char *slash = strrchr(s->path, '/');
	size_t plen = slash == s->path ? 1 : (size_t)(slash - s->path);
	memcpy(parent, s->path, plen);
	parent[plen] = '\0';
	if ((rc = fsutil_mkdirs(parent, 0750)) || (rc = claim_path(s->path)))
		goto fail;
	snprintf(addr, sizeof(addr), "unix:%s", s->path);

	grpc_arg args[] = {
	    {.type = GRPC_ARG_INTEGER,
	     .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
	     .value.integer = MESSAGE_MAX},
	};
	grpc_channel_args cargs = {.num_args = 1, .args = args};
	s->server = grpc_server_create(&cargs, NULL);
	s->cq = grpc_completion_queue_create_for_next(NULL);
	if (!s->server || !s->cq) {
		rc = -ENOMEM;
		goto fail;
	}
	grpc_server_register_completion_queue(s->server, s->cq, NULL);
	grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
	int port = grpc_server_add_http2_port(s->server, addr, creds);
	grpc_server_credentials_release(creds);
	if (port == 0) {
		rc = -EIO;
		/* Never started: destroying needs no shutdown first. */
		grpc_server_destroy(s->server);
		s->server = NULL;
		goto fail;
	}
	grpc_server_start(s->server);
	if (lstat(s->path, &st) == 0) {
		s->ino = st.st_ino;
		/* kubelet and the node's root talk to it; nobody else. */
		chmod(s->path, 0660);
	}
	for (; s->nhandlers < threads; s->nhandlers++) {
		int e = pthread_create(&s->handlers[s->nhandlers], NULL, handler_main, s);
		if (e) {
			rc = -e;
			goto fail;
		}
	}
	for (; s->npollers < POLLERS; s->npollers++) {
		int e = pthread_create(&s->pollers[s->npollers], NULL, poller_main, s);
		if (e) {
			rc = -e;
			goto fail;
		}
	}
	for (unsigned i = 0; i < PENDING_CALLS; i++)
		request_call(s);
	log_info("CSI server listening", "endpoint", addr);
	*out = s;
	return 0;
fail:
	csi_server_stop(s, 0);
	return rc;
}
