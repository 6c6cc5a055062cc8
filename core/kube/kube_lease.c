/* Lease-based leader election (see kube_lease.h). */
#include "kube_lease.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "bgthread.h"
#include "log.h"
#include "loop.h"

struct kube_lease {
	struct kube_client *c;
	struct kube_lease_opts o;
	char *ns, *name, *identity;
	struct kube_resource res;
	struct bgthread t;
	atomic_bool leader;
	uint64_t seed;
	/* what we last saw of the record, and when (our monotonic clock) */
	char observed_holder[256];
	char observed_renew[64];
	unsigned long long observed_ms;
	char last_leader[256];
};

void kube_lease_microtime(char *buf, size_t len)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	char base[24];
	strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%06ldZ", base, ts.tv_nsec / 1000);
}

static const char *spec_str(const cJSON *lease, const char *f)
{
	return kube_obj_str(lease, "spec", f);
}

static double spec_num(const cJSON *lease, const char *f, double dflt)
{
	const cJSON *v =
	    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(lease, "spec"), f);
	return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* Note the record; a change of holder or renewTime restarts its clock. */
static void observe(struct kube_lease *l, const cJSON *lease)
{
	const char *holder = spec_str(lease, "holderIdentity");
	const char *renew = spec_str(lease, "renewTime");
	if (!holder)
		holder = "";
	if (!renew)
		renew = "";
	if (strcmp(holder, l->observed_holder) || strcmp(renew, l->observed_renew) ||
	    !l->observed_ms) {
		snprintf(l->observed_holder, sizeof(l->observed_holder), "%s", holder);
		snprintf(l->observed_renew, sizeof(l->observed_renew), "%s", renew);
		l->observed_ms = loop_now_ms();
	}
	if (*holder && strcmp(holder, l->last_leader)) {
		snprintf(l->last_leader, sizeof(l->last_leader), "%s", holder);
		log_info("kube: lease holder", "lease", l->name, "holder", holder);
		if (l->o.on_new_leader)
			l->o.on_new_leader(holder, l->o.ud);
	}
}

static cJSON *new_lease(struct kube_lease *l, const char *now)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *meta = cJSON_AddObjectToObject(o, "metadata");
	cJSON *spec = cJSON_AddObjectToObject(o, "spec");
	if (!meta || !spec) {
		cJSON_Delete(o);
		return NULL;
	}
	cJSON_AddStringToObject(o, "apiVersion", "coordination.k8s.io/v1");
	cJSON_AddStringToObject(o, "kind", "Lease");
	cJSON_AddStringToObject(meta, "name", l->name);
	cJSON_AddStringToObject(meta, "namespace", l->ns);
	cJSON_AddStringToObject(spec, "holderIdentity", l->identity);
	cJSON_AddNumberToObject(spec, "leaseDurationSeconds",
	                        (l->o.lease_duration_ms + 999) / 1000);
	cJSON_AddStringToObject(spec, "acquireTime", now);
	cJSON_AddStringToObject(spec, "renewTime", now);
	cJSON_AddNumberToObject(spec, "leaseTransitions", 0);
	return o;
}

static void set_spec(cJSON *lease, const char *field, cJSON *v)
{
	cJSON *spec = cJSON_GetObjectItemCaseSensitive(lease, "spec");
	if (!cJSON_IsObject(spec)) {
		cJSON_DeleteItemFromObjectCaseSensitive(lease, "spec");
		spec = cJSON_AddObjectToObject(lease, "spec");
	}
	if (cJSON_GetObjectItemCaseSensitive(spec, field))
		cJSON_ReplaceItemInObjectCaseSensitive(spec, field, v);
	else
		cJSON_AddItemToObject(spec, field, v);
}

/* One attempt: true when we hold the lease afterwards. *lost is set when
 * someone else validly holds it. */
static bool try_acquire_or_renew(struct kube_lease *l, bool *lost)
{
	struct kube_error err;
	cJSON *lease = NULL;
	char now[40];
	*lost = false;
	int rc = kube_client_get(l->c, &l->res, l->ns, l->name, &lease, &err);
	if (rc == -ENOENT) {
		kube_lease_microtime(now, sizeof(now));
		cJSON *o = new_lease(l, now);
		if (!o)
			return false;
		rc = kube_client_create(l->c, &l->res, l->ns, o, &lease, &err);
		cJSON_Delete(o);
		if (rc < 0) {
			if (rc != -EEXIST)
				log_warn("kube: cannot create the lease", "lease", l->name, "error",
				         err.message);
			return false;
		}
		observe(l, lease);
		cJSON_Delete(lease);
		return true;
	}
	if (rc < 0) {
		log_warn("kube: cannot read the lease", "lease", l->name, "error", err.message);
		return false;
	}
	observe(l, lease);
	/* copied: the spec is rewritten below */
	char holder[256];
	snprintf(holder, sizeof(holder), "%s",
	         spec_str(lease, "holderIdentity") ? spec_str(lease, "holderIdentity") : "");
	bool ours = !strcmp(holder, l->identity);
	double dur_s = spec_num(lease, "leaseDurationSeconds", l->o.lease_duration_ms / 1000.0);
	if (!ours && *holder &&
	    loop_now_ms() < l->observed_ms + (unsigned long long)(dur_s * 1000.0)) {
		*lost = true;
		cJSON_Delete(lease);
		return false; /* another holder, not expired */
	}
	kube_lease_microtime(now, sizeof(now));
	set_spec(lease, "holderIdentity", cJSON_CreateString(l->identity));
	set_spec(lease, "leaseDurationSeconds",
	         cJSON_CreateNumber((l->o.lease_duration_ms + 999) / 1000));
	set_spec(lease, "renewTime", cJSON_CreateString(now));
	if (!ours) {
		double transitions = spec_num(lease, "leaseTransitions", 0);
		set_spec(lease, "acquireTime", cJSON_CreateString(now));
		set_spec(lease, "leaseTransitions",
		         cJSON_CreateNumber(*holder ? transitions + 1 : transitions));
	}
	cJSON *meta = cJSON_GetObjectItemCaseSensitive(lease, "metadata");
	cJSON_DeleteItemFromObjectCaseSensitive(meta, "managedFields");
	cJSON *updated = NULL;
	/* The resourceVersion read above makes the PUT conditional. */
	rc = kube_client_replace(l->c, &l->res, l->ns, l->name, lease, &updated, &err);
	cJSON_Delete(lease);
	if (rc < 0) {
		if (rc == -EBUSY)
			log_info("kube: lost a lease update race", "lease", l->name);
		else
			log_warn("kube: cannot update the lease", "lease", l->name, "error",
			         err.message);
		return false;
	}
	observe(l, updated);
	cJSON_Delete(updated);
	return true;
}

static void release(struct kube_lease *l)
{
	struct kube_error err;
	cJSON *lease = NULL;
	if (kube_client_get(l->c, &l->res, l->ns, l->name, &lease, &err) < 0)
		return;
	const char *holder = spec_str(lease, "holderIdentity");
	if (holder && !strcmp(holder, l->identity)) {
		char now[40];
		kube_lease_microtime(now, sizeof(now));
		set_spec(lease, "holderIdentity", cJSON_CreateString(""));
		set_spec(lease, "leaseDurationSeconds", cJSON_CreateNumber(1));
		set_spec(lease, "renewTime", cJSON_CreateString(now));
		cJSON_DeleteItemFromObjectCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(lease, "metadata"), "managedFields");
		if (kube_client_replace(l->c, &l->res, l->ns, l->name, lease, NULL, &err) < 0)
			log_warn("kube: cannot release the lease", "lease", l->name, "error",
			         err.message);
		else
			log_info("kube: lease released", "lease", l->name, "identity", l->identity);
	}
	cJSON_Delete(lease);
}

/* retry period x [1, 1.2): contenders do not hit the server in lockstep */
static unsigned jittered(struct kube_lease *l, unsigned ms)
{
	return ms + (unsigned)(backoff_rand(&l->seed) % (ms / 5 + 1));
}

static void *lease_main(void *ud)
{
	struct kube_lease *l = ud;
	unsigned long long last_renew = 0;
	while (!bgthread_stopping(&l->t)) {
		bool lost = false;
		bool ok = try_acquire_or_renew(l, &lost);
		if (bgthread_stopping(&l->t))
			break;
		if (!atomic_load(&l->leader)) {
			if (ok) {
				last_renew = loop_now_ms();
				atomic_store(&l->leader, true);
				log_info("kube: became the leader", "lease", l->name, "identity",
				         l->identity);
				if (l->o.on_started)
					l->o.on_started(l->o.ud);
				bgthread_nap(&l->t, l->o.retry_period_ms);
			} else {
				bgthread_nap(&l->t, jittered(l, l->o.retry_period_ms));
			}
			continue;
		}
		if (ok) {
			last_renew = loop_now_ms();
		} else if (lost || loop_now_ms() - last_renew >= l->o.renew_deadline_ms) {
			atomic_store(&l->leader, false);
			log_warn("kube: stepping down: the lease could not be renewed", "lease",
			         l->name, "identity", l->identity, "holder", l->observed_holder);
			if (l->o.on_stopped)
				l->o.on_stopped(l->o.ud);
		}
		/* after a failed renewal retry sooner, within the deadline */
		bgthread_nap(&l->t, ok ? l->o.retry_period_ms : l->o.retry_period_ms / 2 + 1);
	}
	if (atomic_load(&l->leader)) {
		if (!l->o.keep_on_stop)
			release(l);
		atomic_store(&l->leader, false);
		if (l->o.on_stopped)
			l->o.on_stopped(l->o.ud);
	}
	return NULL;
}

int kube_lease_start(struct kube_client *c, const struct kube_lease_opts *o,
                     struct kube_lease **out)
{
	if (!o->ns || !o->name || !o->identity || !*o->identity || strlen(o->identity) > 253)
		return -EINVAL;
	struct kube_lease *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->c = c;
	l->o = *o;
	if (!l->o.lease_duration_ms)
		l->o.lease_duration_ms = 15000;
	if (!l->o.renew_deadline_ms)
		l->o.renew_deadline_ms = 10000;
	if (!l->o.retry_period_ms)
		l->o.retry_period_ms = 2000;
	int rc = -EINVAL;
	if (l->o.renew_deadline_ms >= l->o.lease_duration_ms ||
	    l->o.retry_period_ms >= l->o.renew_deadline_ms)
		goto fail;
	rc = -ENOMEM;
	if (!(l->ns = strdup(o->ns)) || !(l->name = strdup(o->name)) ||
	    !(l->identity = strdup(o->identity)))
		goto fail;
	l->o.ns = l->ns;
	l->o.name = l->name;
	l->o.identity = l->identity;
	if (kube_resource_builtin("coordination.k8s.io/v1", "Lease", &l->res) < 0) {
		rc = -EINVAL;
		goto fail;
	}
	l->seed = loop_now_ms() ^ (uintptr_t)l;
	rc = bgthread_start(&l->t, lease_main, l);
	if (rc < 0)
		goto fail;
	*out = l;
	return 0;
fail:
	free(l->ns);
	free(l->name);
	free(l->identity);
	free(l);
	return rc;
}

void kube_lease_stop(struct kube_lease *l)
{
	if (!l)
		return;
	bgthread_stop(&l->t);
	free(l->ns);
	free(l->name);
	free(l->identity);
	free(l);
}

bool kube_lease_is_leader(const struct kube_lease *l)
{
	return atomic_load(&l->leader);
}
