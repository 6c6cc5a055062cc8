#include "policy_watch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "log.h"
#include "metrics.h"
#include "objstore.h"

struct policy_watch {
	struct loop *loop;
	struct engine_slot *slot;
	char dir[512], status_file[512];
	unsigned poll_ms;
	uint64_t timer;
	char last_refused[72]; /* digest of the last refused bundle: report it once */
	policy_watch_fn fn;
	void *ud;
};

static void write_status(struct policy_watch *w)
{
	if (!w->status_file[0])
		return;
	char now[32];
	obj_now(now, sizeof(now));
	cJSON *s = cJSON_CreateObject();
	cJSON_AddNumberToObject(s, "generation", (double)w->slot->generation);
	cJSON_AddStringToObject(s, "digest",
	                        w->slot->current ? engine_digest(w->slot->current) : "");
	cJSON_AddStringToObject(s, "lastError", w->slot->last_error);
	cJSON_AddStringToObject(s, "updated", now);
	char *text = cJSON_Print(s);
	cJSON_Delete(s);
	if (text && fsutil_write_atomic(w->status_file, text, strlen(text), 0644) != 0)
		log_warn("cannot write the policy status file", "path", w->status_file);
	free(text);
}

static int load(struct policy_watch *w, struct bundle *b, bool startup, char *err, size_t errlen)
{
	static struct metric *gen;
	if (!gen)
		gen = metrics_gauge("gkm_policy_generation", "Generation of the policies in use",
		                    NULL);
	if (w->slot->current && !strcmp(engine_digest(w->slot->current), b->digest))
		return 0;
	if (!startup && !strcmp(w->last_refused, b->digest))
		return 0; /* the same broken bundle again: already reported */
	uint64_t before = w->slot->generation;
	struct engine_error e;
	if (engine_slot_load(w->slot, b, &e) != 0) {
		snprintf(w->last_refused, sizeof(w->last_refused), "%s", b->digest);
		snprintf(err, errlen, "%s", e.message);
		write_status(w);
		if (w->fn && !startup)
			w->fn(w->ud, false, e.message);
		return -EINVAL;
	}
	w->last_refused[0] = '\0';
	metrics_set(gen, NULL, (double)w->slot->generation);
	if (w->slot->generation != before) {
		write_status(w);
		if (w->fn && !startup)
			w->fn(w->ud, true, NULL);
	}
	return 0;
}

static int load_dir(struct policy_watch *w, bool startup, char *err, size_t errlen)
{
	struct bundle *b = NULL;
	int rc = w->dir[0] ? bundle_from_dir(w->dir, &b, err, errlen) : bundle_builtin(&b);
	if (rc) {
		if (!startup)
			log_warn("cannot read the policy directory; keeping the current policies",
			         "dir", w->dir, "error", err);
		return rc;
	}
	rc = load(w, b, startup, err, errlen);
	bundle_free(b);
	return rc;
}

static void tick(struct loop *l, void *ud)
{
	struct policy_watch *w = ud;
	char err[1024];
	(void)load_dir(w, false, err, sizeof(err));
	w->timer = loop_add_timer(l, w->poll_ms, tick, w);
}

void policy_watch_load_map(struct policy_watch *w, const cJSON *data)
{
	struct bundle *b = NULL;
	char err[1024];
	if (bundle_from_map(data, &b, err, sizeof(err)) != 0) {
		log_error("policy ConfigMap refused; keeping the current policies", "error", err);
		snprintf(w->slot->last_error, sizeof(w->slot->last_error), "%s", err);
		write_status(w);
		if (w->fn)
			w->fn(w->ud, false, err);
		return;
	}
	(void)load(w, b, false, err, sizeof(err));
	bundle_free(b);
}

int policy_watch_start(struct loop *l, struct engine_slot *slot, const char *dir, unsigned poll_ms,
                       const char *status_file, policy_watch_fn fn, void *ud,
                       struct policy_watch **out, char *err, size_t errlen)
{
	struct policy_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->loop = l;
	w->slot = slot;
	w->poll_ms = poll_ms ? poll_ms : 2000;
	w->fn = fn;
	w->ud = ud;
	snprintf(w->dir, sizeof(w->dir), "%s", dir ? dir : "");
	snprintf(w->status_file, sizeof(w->status_file), "%s", status_file ? status_file : "");
	int rc = load_dir(w, true, err, errlen);
	if (rc) {
		free(w);
		return rc;
	}
	if (dir)
		w->timer = loop_add_timer(l, w->poll_ms, tick, w);
	*out = w;
	return 0;
}

void policy_watch_stop(struct policy_watch *w)
{
	if (!w)
		return;
	if (w->timer)
		loop_cancel_timer(w->loop, w->timer);
	free(w);
}
