/* Inside the reviewer: a review in flight and the image checks it waits for
 * (webhook/review.c), which the cache reviews (webhook/reviewer.c) and the
 * pod reviews (webhook/pod_review.c) both use; neither of those two is
 * called from here (a review says what decides it). Not an interface for
 * anything else in the webhook.
 *
 * A review waits for zero or more checks, one per image: a cache review for
 * its spec.image, a pod review for each image volume that names a cache. A
 * check is answered from the caches (a known tag and verdict) or by a
 * registry job shared with every check of the same image, digest and key
 * set. When the last check of a review is back, the review is decided on the
 * loop thread; if the deadline comes first, the review is denied. */
#ifndef GKM_REVIEW_H
#define GKM_REVIEW_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "admission_review.h"
#include "image_check.h"
#include "metrics.h"
#include "oci_ref.h"
#include "reviewer.h"
#include "ttl_cache.h"

enum endpoint { EP_MUTATE = 0, EP_VALIDATE, EP_PODS };

struct job;
struct review;
struct pod_review;

struct reviewer {
	struct reviewer_opts o;
	/* loop thread only */
	struct trust *trust;
	struct ttl_cache *resolved, *verdicts;
	struct job *jobs;
	unsigned njobs;
	bool catalog_synced; /* o.catalog holds complete lists */
	/* shared with the HTTPS threads */
	pthread_mutex_t lock;
	struct review *live;
	unsigned nlive;
	bool closing;
	struct metric *m_latency, *m_decisions, *m_cache, *m_checks, *m_jobs, *m_placements;
};

/* One image to resolve and verify. */
struct check {
	struct review *rv;
	const char *image;           /* as written; borrowed from the request */
	struct oci_ref ref;          /* parsed */
	char *ref_text;              /* canonical reference (cache key) */
	char pinned[OCI_DIGEST_MAX]; /* a digest to use instead of resolving the tag */
	/* the webhook's own registry credentials serve the cache's namespace
	 * (--global-credentials-namespaces); else the image is read anonymously */
	bool global;
	struct job *job;           /* waiting for it, or NULL */
	struct check *next_waiter; /* in job->waiters */
	/* the outcome, once done */
	bool done;
	const char *fail_reason; /* CamelCase reason when it could not be checked */
	char message[600];       /* its message */
	char digest[OCI_DIGEST_MAX];
	bool verify; /* signatures were checked (verdict below is filled) */
	struct image_verdict verdict;
};

struct review {
	struct reviewer *r;
	struct https_request *rq;
	enum endpoint ep;
	struct admission_request req;
	struct trust *trust; /* snapshot the review started with */
	struct check *checks;
	unsigned nchecks, waiting; /* waiting: checks not done yet */
	uint64_t timer;            /* deadline timer while waiting */
	struct pod_review *pod;    /* EP_PODS */
	/* Loop thread: every check is back (or none was needed): decide and
	 * answer (review_finish, review_deny) */
	void (*decide)(struct review *rv);
	struct review *live_prev, *live_next;
};

extern const char *const review_endpoint_names[]; /* by enum endpoint */

/* Monotonic clock, ns. */
uint64_t review_mono_ns(void);
/* Answer with a plain-text body / an AdmissionReview; any thread. */
void review_send_text(struct https_request *rq, unsigned status, const char *text);
void review_send(struct reviewer *r, struct https_request *rq, enum endpoint ep,
                 const struct admission_response *resp);
/* Take rv off the live list / free it (it must be off the list). */
void review_live_remove(struct review *rv);
void review_free(struct review *rv);
/* Shutting down, the loop gone: release every registry job (their checks
 * are left without one). */
void review_jobs_close(struct reviewer *r);

/* Loop thread. Start every check of rv (each 0 or a failure recorded in
 * it); rv is decided now when none has to wait, else when the last is back
 * or denied at its deadline. */
void review_run_checks(struct review *rv);

/* Loop thread: the answer, once (rv is freed). */
void review_finish(struct review *rv, const struct admission_response *resp);
void review_deny(struct review *rv, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Loop thread: run the admission policy on c's image for rv's object
 * (kind, namespace, name, operation, annotations of the request). true when
 * allowed; false with reason and message filled (a policy failure is
 * PolicyError). */
bool review_admission_policy(struct review *rv, const struct check *c, const char *object_name,
                             const cJSON *annotations, char *reason, size_t reason_len,
                             char *message, size_t message_len);

/* Loop thread: the warning for an image admitted without a signature that
 * verifies (verification off, or unsigned images allowed), naming it as
 * subject ("image R", "image volume V"); "" when its signature verified. */
void review_image_warning(const struct check *c, const char *subject, char *buf, size_t len);

/* ---- pods (webhook/pod_review.c) ---- */

/* HTTPS thread, after the envelope parsed: read the pod. 1 when the review
 * is answered by the caller at once, allowed unchanged (no volume that may
 * mount a cache, an excluded namespace); 0 when it goes to the loop;
 * -EINVAL with err for a malformed pod, -ENOMEM. */
int pod_review_prepare(struct review *rv, char *err, size_t errlen);
/* Loop thread: match the volumes against the catalog, set up the checks
 * and run them (review_run_checks). */
void pod_review_start(struct review *rv);
/* Loop thread: every check is back; decide and answer. */
void pod_review_decide(struct review *rv);
void pod_review_free(struct pod_review *p);

#endif
