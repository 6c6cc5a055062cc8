/* The agent's clean-up of the store: what no cache on this node names. */

#include "agent_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "store.h"

/* A store entry younger than this survives a clean-up even when nothing
 * names it: it may be a pull that committed after the snapshot of names. */
#define GC_MIN_AGE_S 10

struct gc_job {
	struct agent *a;
	char (*keep)[80]; /* digests some cache names (a snapshot taken on the loop) */
	size_t nkeep;
	struct store_gc_stats st;
	int rc;
};

static bool gc_keep(void *ctx, const char *digest)
{
	struct gc_job *g = ctx;
	for (size_t i = 0; i < g->nkeep; i++)
		if (!strcmp(g->keep[i], digest))
			return true;
	bool used = true;
	if (cache_view_digest_in_use(g->a->run_dir, digest, &used) != 0)
		return true; /* usage records unreadable: keep */
	return used;
}

static void gc_work(void *ud)
{
	struct gc_job *g = ud;
	g->rc = store_gc(g->a->store, gc_keep, g, GC_MIN_AGE_S, &g->st);
}

static void gc_done(struct loop *l, void *ud)
{
	struct gc_job *g = ud;
	struct agent *a = g->a;
	(void)l;
	a->jobs--;
	a->gc_running = false;
	if (g->rc) {
		log_warn("store clean-up failed", "error", strerror(-g->rc));
	} else if (g->st.removed) {
		char n[24], bytes[24];
		snprintf(n, sizeof(n), "%llu", (unsigned long long)g->st.removed);
		snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)g->st.bytes_removed);
		log_info("removed store entries no cache names and no pod uses", "entries", n,
		         "bytes", bytes);
	}
	free(g->keep);
	free(g);
	if (a->gc_again && !a->stopping) {
		a->gc_again = false;
		agent_gc_request(a);
	} else {
		agent_budget_check(a); /* what is left against the store's budget */
	}
}

/* Remove the extracted images that no cache of this node names and no pod
 * uses (a deleted cache, a digest replaced by a new one). Only once the
 * caches are listed: before that every entry would look unnamed. */
void agent_gc_request(struct agent *a)
{
	if (a->stopping || !a->synced_caches || !a->synced_cluster)
		return;
	if (a->gc_running) {
		a->gc_again = true;
		return;
	}
	size_t n = 0;
	for (struct cache *c = a->caches; c; c = c->next)
		n += 3;
	struct gc_job *g = calloc(1, sizeof(*g));
	if (!g || !(g->keep = calloc(n ? n : 1, sizeof(*g->keep)))) {
		free(g);
		return;
	}
	g->a = a;
	for (struct cache *c = a->caches; c; c = c->next) {
		const char *names[] = {c->digest, c->store_digest, c->view_digest};
		for (size_t i = 0; i < 3; i++)
			if (*names[i])
				snprintf(g->keep[g->nkeep++], sizeof(g->keep[0]), "%s", names[i]);
	}
	a->gc_running = true;
	a->jobs++;
	if (workers_submit(a->workers, gc_work, gc_done, g) != 0) {
		a->jobs--;
		a->gc_running = false;
		free(g->keep);
		free(g);
	}
}
