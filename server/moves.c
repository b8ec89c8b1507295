/*
 * moves.c - moves and repairs (PREFIX/next, PREFIX/fill): who loses and who
 * gains partitions, the coordinator driving a move or a fill to its commit,
 * and every member following one: fences, the loop's jobs (purges, copies,
 * intakes, repair passes), readiness, acks, and settling.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "hatchkv_err.h"
#include "server/cluster.h"
#include "server/filler.h"
#include "server/cluster_int.h"

/* Does id hold, in a, a partition that b does not place on it? Or, in a
 * replicated store, one whose list b grows (a repair: every server on the
 * old list fences for its final pass, docs/design.md "Repair")? */
int hkv_cl_loses(const struct hkv_cmap *a, const struct hkv_cmap *b, const char *id)
{
	for (uint32_t p = 0; p < a->partitions && p < b->partitions; p++)
		if (hkv_cmap_holds(a, p, id) &&
		    (!hkv_cmap_holds(b, p, id) || (a->replicas > 1 && hkv_cmap_grows(a, b, p))))
			return 1;
	return 0;
}

/* Does b place on id a partition that a does not? */
int hkv_cl_gains(const struct hkv_cmap *a, const struct hkv_cmap *b, const char *id)
{
	for (uint32_t p = 0; p < a->partitions && p < b->partitions; p++)
		if (hkv_cmap_holds(b, p, id) && !hkv_cmap_holds(a, p, id))
			return 1;
	return 0;
}

/* PREFIX/next is {"base":"<map revision>","map":<map>}: built by hand, it
 * is the map's own JSON behind a fixed head. */
char *hkv_cl_next_format(const struct hkv_cmap *map, int64_t base)
{
	char *mj = hkv_cmap_format(map), *out;
	size_t n;

	if (!mj)
		return NULL;
	n = strlen(mj) + 64;
	out = hkv_malloc(n);
	if (out)
		snprintf(out, n, "{\"base\":\"%lld\",\"map\":%s}", (long long)base, mj);
	hkv_free(mj);
	return out;
}

int hkv_cl_next_parse(const struct hkv_etcd_kv *kv, struct hkv_cmap *map, int64_t *base)
{
	const char *p = kv->value, *end = kv->value + kv->vlen;
	char *num_end;

	if (kv->vlen < 9 || strncmp(p, "{\"base\":\"", 9))
		return -EPROTO;
	*base = strtoll(p + 9, &num_end, 10);
	if (end - num_end < 10 || strncmp(num_end, "\",\"map\":", 8) || end[-1] != '}')
		return -EPROTO;
	p = num_end + 8;
	if (hkv_cmap_parse(p, (size_t)(end - 1 - p), map))
		return -EPROTO;
	map->epoch = kv->mod_rev;
	return 0;
}

static int has_acked(struct hkv_cluster *cl, const struct snap *sn, const char *id, int64_t rev)
{
	const struct hkv_etcd_kv *kv = hkv_cl_snap_get(cl, sn, "ack", id);

	return kv && strtoll(kv->value, NULL, 10) == rev;
}

/* Store mode: may the move from cur to next still commit? Every server it
 * touches must be a member, and every loser's ack ("REV a=12 b=40") must
 * name the registrations (create_revision) of its new homes we see now:
 * a new home that registered again since may have dropped the copy. */
static int store_move_sound(struct hkv_cluster *cl, const struct snap *sn,
			    const struct hkv_cmap *cur, const struct hkv_cmap *next, int64_t rev)
{
	for (uint32_t i = 0; i < cur->nnames + next->nnames; i++) {
		const char *id = i < cur->nnames ? cur->names[i] : next->names[i - cur->nnames];

		if ((hkv_cl_loses(cur, next, id) || hkv_cl_gains(cur, next, id)) &&
		    !hkv_cl_is_member(cl, sn, id)) {
			hkv_warn("cluster: %s left during a move: the move is dropped", id);
			return 0;
		}
	}
	for (uint32_t i = 0; i < cur->nnames; i++) {
		const struct hkv_etcd_kv *ak = hkv_cl_snap_get(cl, sn, "ack", cur->names[i]);
		char *p, *end, name[HKV_CLUSTER_ID_MAX];

		if (!hkv_cl_loses(cur, next, cur->names[i]) || !ak ||
		    strtoll(ak->value, &p, 10) != rev)
			continue;
		if (!strncmp(p, " failed", 7)) {
			hkv_warn("cluster: %s could not copy its items to their new homes: the move is "
				 "dropped", cur->names[i]);
			return 0;
		}
		while (*p == ' ') {
			const struct hkv_etcd_kv *m;
			size_t n = strcspn(++p, "=");
			long long cr;

			if (!n || n >= sizeof(name) || p[n] != '=')
				break;
			memcpy(name, p, n);
			name[n] = 0;
			cr = strtoll(p + n + 1, &end, 10);
			p = end;
			m = hkv_cl_snap_get(cl, sn, "servers", name);
			if (!m || m->create_rev != cr) {
				hkv_warn("cluster: %s registered again after %s copied into it: "
					 "the move is dropped", name, cur->names[i]);
				return 0;
			}
		}
	}
	return 1;
}

/* Leader, a move under way: commit PREFIX/next once every live server that
 * gives up partitions has purged them and acked, and those that left have
 * been gone long enough. */
int hkv_cl_drive_move(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *nk,
		      const struct hkv_cmap *cur, int64_t cur_rev)
{
	char key[512];
	struct hkv_cmap next = {0};
	int64_t base = 0;
	int ret;

	hkv_cl_key_of(cl, key, sizeof(key), "next", NULL);
	if (hkv_cl_next_parse(nk, &next, &base) || base != cur_rev) {
		hkv_cmap_free(&next);
		if (!hkv_etcd_delete_if(cl->e, key, nk->mod_rev)) /* stale or garbage: start over */
			cl->moves_dropped++;
		return 0;
	}
	if (cl->store_mode && !store_move_sound(cl, sn, cur, &next, nk->mod_rev)) {
		hkv_cmap_free(&next);
		if (!hkv_etcd_delete_if(cl->e, key, nk->mod_rev)) /* its losers serve on */
			cl->moves_dropped++;
		return 0;
	}
	for (uint32_t i = 0; i < cur->nnames; i++) {
		const char *id = cur->names[i];

		if (!hkv_cl_loses(cur, &next, id))
			continue;
		if (hkv_cl_is_member(cl, sn, id) ? has_acked(cl, sn, id, nk->mod_rev)
						 : hkv_cl_gone_long_enough(cl, id))
			continue;
		if (cl->next_seen_rev != nk->mod_rev) {
			cl->next_seen_rev = nk->mod_rev;
			cl->next_seen_ns = hkv_cl_boot_ns();
		} else if (hkv_cl_boot_ns() - cl->next_seen_ns > 5000000000ull) {
			hkv_warn("cluster: move to map %lld waits for %s", (long long)nk->mod_rev, id);
			cl->next_seen_ns = hkv_cl_boot_ns();
		}
		hkv_cmap_free(&next);
		return 0;
	}
	ret = hkv_cl_commit_map(cl, sn, cur, &next, cur_rev, 1);
	hkv_cmap_free(&next);
	return ret;
}

/*
 * Leader, a fill under way: once every primary that copies has said its
 * passes converged (PREFIX/filled/ID = the fill's revision), turn the fill
 * into a move (PREFIX/next, the same map; PREFIX/fill deleted in the same
 * transaction): every server on the old lists fences, the primaries run
 * the final pass, and drive_move commits. A fill on an old map, or one
 * whose servers left, is dropped.
 */
int hkv_cl_drive_fill(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *fk,
		      const struct hkv_cmap *cur, int64_t cur_rev)
{
	char fkey[512], nkey[512], mkey[512], ckey[512], *json = NULL;
	struct hkv_cmap target = {0};
	int64_t base = 0;
	int ret = 0;

	hkv_cl_key_of(cl, fkey, sizeof(fkey), "fill", NULL);
	if (hkv_cl_next_parse(fk, &target, &base) || base != cur_rev ||
	    target.partitions != cur->partitions) {
		hkv_cmap_free(&target);
		if (!hkv_etcd_delete_if(cl->e, fkey, fk->mod_rev)) /* stale or garbage: plan again */
			cl->repairs_dropped++;
		return 0;
	}
	for (uint32_t i = 0; i < target.nnames; i++) {
		const char *id = target.names[i];
		const struct hkv_etcd_kv *dk;

		if (!hkv_cl_gains(cur, &target, id) && !hkv_cl_loses(cur, &target, id))
			continue; /* (loses: on a list that grows) */
		if (!hkv_cl_is_member(cl, sn, id)) {
			hkv_warn("cluster: %s left during a repair: the fill is dropped", id);
			goto drop;
		}
		if (!hkv_fill_source(cur, &target, id))
			continue;
		dk = hkv_cl_snap_get(cl, sn, "filled", id);
		if (dk && strtoll(dk->value, NULL, 10) == fk->mod_rev && strstr(dk->value, "failed")) {
			hkv_warn("cluster: %s could not fill the new replicas: the fill is dropped, "
				 "the next in 10 s", id);
			cl->fill_after_ns = hkv_cl_boot_ns() + 10000000000ull;
			for (uint32_t j = 0; j < target.nnames; j++)
				if (hkv_cl_gains(cur, &target, target.names[j]))
					snprintf(cl->fill_failed, sizeof(cl->fill_failed), "%s",
						 target.names[j]);
			goto drop;
		}
		if (!dk || strtoll(dk->value, NULL, 10) != fk->mod_rev)
			goto out; /* still copying */
	}
	json = hkv_cl_next_format(&target, cur_rev);
	if (!json) {
		ret = -ENOMEM;
		goto out;
	}
	hkv_cl_key_of(cl, nkey, sizeof(nkey), "next", NULL);
	hkv_cl_key_of(cl, mkey, sizeof(mkey), "map", NULL);
	hkv_cl_key_of(cl, ckey, sizeof(ckey), "coordinator", NULL);
	{
		struct hkv_etcd_cmp cmps[] = {
			{mkey, HKV_ETCD_CMP_MOD, cur_rev},
			{fkey, HKV_ETCD_CMP_MOD, fk->mod_rev},
			{nkey, HKV_ETCD_CMP_CREATE, 0},
			{ckey, HKV_ETCD_CMP_LEASE, atomic_load(&cl->lease)},
		};

		ret = hkv_etcd_txn_put(cl->e, cmps, 4, nkey, json, strlen(json), 0, fkey, NULL);
	}
	if (!ret) {
		hkv_info("cluster: repair filled: the final pass fences the lists (map %lld -> next)",
			 (long long)cur_rev);
		cl->repairs_filled++;
	}
	if (ret == -ECANCELED)
		ret = 0;
	goto out;
drop:
	if (!hkv_etcd_delete_if(cl->e, fkey, fk->mod_rev))
		cl->repairs_dropped++;
out:
	hkv_free(json);
	hkv_cmap_free(&target);
	return ret;
}

/* PREFIX/dir/ID = text, under our lease (our acks and readiness go with it). */
static int put_ours(struct hkv_cluster *cl, const char *dir, const char *text)
{
	char key[512];

	hkv_cl_key_of(cl, key, sizeof(key), dir, cl->id);
	return hkv_etcd_put(cl->e, key, text, strlen(text), atomic_load(&cl->lease), NULL);
}

static void issue(struct hkv_cluster *cl, struct hkv_cluster_job *job)
{
	job->gen = cl->reg_gen;
	pthread_mutex_lock(&cl->lock);
	hkv_cluster_job_free(cl->job);
	cl->job = job;
	pthread_mutex_unlock(&cl->lock);
	cl->job_out = 1;
}

static struct hkv_cluster_job *job_new(enum hkv_cluster_job_kind kind, int64_t rev)
{
	struct hkv_cluster_job *j = hkv_calloc(1, sizeof(*j));

	if (j) {
		j->kind = kind;
		j->rev = rev;
	}
	return j;
}

static const char *job_name(int kind)
{
	return kind == HKV_JOB_COPY ? "copy" : kind == HKV_JOB_INTAKE ? "intake" :
	       kind == HKV_JOB_FILL ? "repair pass" : "purge";
}

/* The loop's answer to our job, if any. */
static void collect_done(struct hkv_cluster *cl)
{
	int done, kind, ret;
	uint32_t gen;
	int64_t rev;

	pthread_mutex_lock(&cl->lock);
	done = cl->done;
	kind = cl->done_kind;
	ret = cl->done_ret;
	rev = cl->done_rev;
	gen = cl->done_gen;
	cl->done = 0;
	pthread_mutex_unlock(&cl->lock);
	if (!done)
		return;
	if (kind > 0 && kind <= HKV_JOB_FILL) /* (a repair pass answers 1 or 0) */
		cl->jobs[kind][ret < 0 || (ret && kind != HKV_JOB_FILL) ? HKV_JOB_FAILED
									: HKV_JOB_OK]++;
	if (gen != cl->reg_gen)
		return; /* for a registration of ours that is over */
	cl->job_out = 0;
	if (kind == HKV_JOB_FILL) {
		if (rev != cl->fill_rev)
			return;
		if (ret < 0) {
			hkv_warn("cluster: repair pass for fill %lld failed (%s)", (long long)rev,
				 hkv_strerror(ret));
			cl->fill_failures++;
		} else if (ret > 0) {
			cl->fill_state = FILL_CONVERGED;
		}
		return;
	}
	if (ret) {
		hkv_warn("cluster: %s for move %lld failed (%s)", job_name(kind), (long long)rev,
			 hkv_strerror(ret));
		cl->settle_issued = 0;
		if (kind == HKV_JOB_COPY && rev == cl->fence_rev)
			cl->copy_failures++;
		return;
	}
	if (rev < 0)
		return; /* a gainer's tidy-up */
	if (kind == HKV_JOB_PURGE && !rev) {
		if (cl->settle_issued) {
			atomic_store(&cl->settle, 0);
			hkv_info("cluster: %s holds only its partitions: serves", cl->id);
		}
	} else if (kind == HKV_JOB_PURGE) {
		cl->purged_rev = rev;
	} else if (kind == HKV_JOB_COPY) {
		cl->copied_rev = rev;
	} else {
		cl->intaken_rev = rev;
	}
}

static struct hkv_cmap *map_of(const struct hkv_etcd_kv *kv)
{
	struct hkv_cmap *m = hkv_calloc(1, sizeof(*m));

	if (m && kv && hkv_cmap_parse(kv->value, kv->vlen, m)) {
		hkv_free(m);
		return NULL;
	}
	if (m && kv)
		m->epoch = kv->mod_rev;
	return m; /* (no kv: no map, an empty one - nothing placed on us) */
}

/*
 * Store mode, a loser: are all new homes of our partitions members that
 * have emptied them (ready/NAME is this move's revision)? Then "a=12 b=40"
 * (their registrations) in *crs and their member records in homes[]
 * (indexed like next->names). 1 if so, 0 if not yet, or an error.
 */
static int homes_ready(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *cur,
		       const struct hkv_cmap *next, int64_t rev, char **crs,
		       struct hkv_cmember *homes)
{
	size_t cap = (size_t)next->nnames * (HKV_CLUSTER_ID_MAX + 24) + 1, len = 0;
	char *out = hkv_calloc(1, cap);

	if (!out)
		return -ENOMEM;
	for (uint32_t i = 0; i < next->nnames; i++) {
		const char *g = next->names[i];
		const struct hkv_etcd_kv *m, *rk;
		int to_g = 0;

		if (!strcmp(g, cl->id))
			continue;
		for (uint32_t p = 0; p < cur->partitions && !to_g; p++)
			to_g = !strcmp(hkv_cmap_server(cur, p, 0), cl->id) &&
			       hkv_cmap_holds(next, p, g) && !hkv_cmap_holds(cur, p, g);
		if (!to_g)
			continue;
		m = hkv_cl_snap_get(cl, sn, "servers", g);
		rk = hkv_cl_snap_get(cl, sn, "ready", g);
		if (!m || !rk || strtoll(rk->value, NULL, 10) != rev ||
		    (homes && hkv_cmember_parse(m->value, m->vlen, &homes[i]))) {
			hkv_free(out);
			return 0;
		}
		len += (size_t)snprintf(out + len, cap - len, " %s=%lld", g, (long long)m->create_rev);
	}
	*crs = out;
	return 1;
}

/*
 * A gainer's step in a move or a repair (rev): have the loop empty what
 * *map gives us and *cur does not (left by one that never committed; the
 * job takes both maps), then say ready/ID = rev. 1 once said, 0 for now
 * (a job issued), or an error.
 */
static int intake_or_ready(struct hkv_cluster *cl, int64_t rev, struct hkv_cmap **map,
			   struct hkv_cmap **cur)
{
	struct hkv_cluster_job *job;
	char small[48];
	int ret;

	if (cl->intaken_rev != rev) {
		if (!(job = job_new(HKV_JOB_INTAKE, rev)))
			return -ENOMEM;
		job->map = *map;
		job->cur = *cur;
		*map = *cur = NULL;
		issue(cl, job);
		return 0;
	}
	snprintf(small, sizeof(small), "%lld", (long long)rev);
	ret = put_ours(cl, "ready", small);
	return ret ? ret : 1;
}

static void map_drop(struct hkv_cmap **m)
{
	if (*m) {
		hkv_cmap_free(*m);
		hkv_free(*m);
		*m = NULL;
	}
}

/*
 * Every member of a replicated store, each round with no move pending:
 * follow a repair (PREFIX/fill). A new replica empties what it gains (an
 * INTAKE) and says ready/ID; a primary that copies runs online passes
 * (FILL jobs) until one converges, then says filled/ID. A new replica
 * whose fill was dropped drops what came in.
 */
static int follow_fill(struct hkv_cluster *cl, const struct snap *sn,
		       const struct hkv_etcd_kv *mk)
{
	const struct hkv_etcd_kv *fk = hkv_cl_snap_get(cl, sn, "fill", NULL);
	struct hkv_cmap *cur = NULL, *target = NULL;
	struct hkv_cluster_job *job;
	struct hkv_cmember *homes = NULL;
	char *crs = NULL, small[64];
	int64_t base, rev = fk ? fk->mod_rev : 0;
	int ret = 0;

	if (cl->fill_in_rev && cl->fill_in_rev != rev && mk) {
		/* the fill we took copies for is gone without a move: what came in
		 * is no partition of ours (no client routes those keys here) */
		hkv_info("cluster: repair %lld dropped: %s drops what it took in",
			 (long long)cl->fill_in_rev, cl->id);
		cl->fill_in_rev = 0;
		map_drop(&cl->fill_in_map);
		if (!(cur = map_of(mk)) || !(job = job_new(HKV_JOB_PURGE, -1)))
			goto nomem;
		job->map = cur;
		issue(cl, job);
		return 0;
	}
	if (!fk || !mk)
		return 0;
	if (!(cur = map_of(mk)) || !(target = hkv_calloc(1, sizeof(*target))))
		goto nomem;
	if (hkv_cl_next_parse(fk, target, &base) || base != mk->mod_rev ||
	    target->partitions != cur->partitions)
		goto out; /* the coordinator drops it */
	if (hkv_cl_gains(cur, target, cl->id) && cl->fill_in_rev != rev) {
		if (hkv_cluster_fenced(cl))
			goto out; /* (copies need our data plane up) */
		ret = intake_or_ready(cl, rev, &target, &cur);
		if (ret == 1) {
			ret = 0;
			hkv_info("cluster: %s ready to take a repair's copies", cl->id);
			cl->fill_in_rev = rev;
			map_drop(&cl->fill_in_map);
			cl->fill_in_map = target;
			target = NULL;
		}
		goto out;
	}
	if (!hkv_fill_source(cur, target, cl->id))
		goto out;
	if (cl->fill_rev != rev) {
		cl->fill_rev = rev;
		cl->fill_state = FILL_COPYING;
		cl->fill_failures = 0;
		hkv_info("cluster: %s fills new replicas of its partitions, serving on", cl->id);
	}
	if (cl->fill_state == FILL_SAID)
		goto out;
	if (cl->fill_state == FILL_CONVERGED || cl->fill_failures >= 3) {
		snprintf(small, sizeof(small), "%lld%s", (long long)rev,
			 cl->fill_state == FILL_CONVERGED ? "" : " failed");
		ret = put_ours(cl, "filled", small);
		if (!ret)
			cl->fill_state = FILL_SAID;
		goto out;
	}
	if (!(homes = hkv_calloc(target->nnames + 1, sizeof(*homes))))
		goto nomem;
	ret = homes_ready(cl, sn, cur, target, rev, &crs, homes);
	if (ret <= 0 || !(job = job_new(HKV_JOB_FILL, rev))) {
		ret = ret < 0 ? ret : 0;
		goto out;
	}
	job->map = target;
	job->cur = cur;
	job->homes = homes;
	job->tag = crs;
	target = cur = NULL;
	homes = NULL;
	crs = NULL;
	issue(cl, job);
	ret = 0;
	goto out;
nomem:
	ret = -ENOMEM;
out:
	map_drop(&cur);
	map_drop(&target);
	hkv_free(homes);
	hkv_free(crs);
	return ret;
}

/*
 * Every member, each round: follow a pending move (PREFIX/next).
 * Cache mode, a loser: fence, have the loop purge what we give up, ack.
 * Store mode, a gainer: have the loop empty what we gain (left by a move
 * that never committed), then say ready/ID. Store mode, a loser: fence;
 * once every new home is ready, have the loop copy our items of the moving
 * partitions to them; ack with the new homes' registrations, and drop the
 * items only once the move is over and the map says they are gone
 * (settle). Unfence when the move is over.
 */
int hkv_cl_follow_move(struct hkv_cluster *cl, const struct snap *sn)
{
	char *val = NULL, *crs = NULL;
	const struct hkv_etcd_kv *nk = hkv_cl_snap_get(cl, sn, "next", NULL);
	const struct hkv_etcd_kv *mk = hkv_cl_snap_get(cl, sn, "map", NULL);
	struct hkv_cmap *cur = NULL, *next = NULL;
	struct hkv_cluster_job *job;
	const struct hkv_etcd_kv *fk = hkv_cl_snap_get(cl, sn, "fill", NULL);
	int64_t base, rev = nk ? nk->mod_rev : 0;
	int ret = 0;

	atomic_store(&cl->fill_live, fk ? fk->mod_rev : 0);
	atomic_store(&cl->next_live, rev);
	collect_done(cl);
	if (cl->job_out || atomic_load(&cl->copying))
		return 0; /* one job at a time; a copy taken over holds our step (mover.h) */
	if (atomic_load(&cl->settle)) { /* store mode: drop what the map does not place on us */
		if (!mk)
			return 0; /* none yet (the coordinator makes it): fenced, nothing dropped */
		if (!(cur = map_of(mk))) {
			hkv_err("cluster: %s/map does not parse: %s stays fenced", cl->prefix, cl->id);
			return 0;
		}
		if (!(job = job_new(HKV_JOB_PURGE, 0)))
			goto nomem;
		job->map = cur;
		issue(cl, job);
		cl->settle_issued = 1;
		return 0;
	}
	if (atomic_load(&cl->move_fence) && cl->fence_rev != rev) {
		/* the move that fenced us is over (committed or dropped; another
		 * may have followed it at once) */
		if (cl->store_mode) /* drop what moved before serving */
			atomic_store(&cl->settle, 1);
		else
			hkv_info("cluster: move over, %s serves again", cl->id);
		atomic_store(&cl->move_fence, 0);
		return 0;
	}
	if (cl->store_mode && cl->ready_rev && cl->ready_rev != rev && mk) {
		/* a move we took copies for is over: if it was dropped, what was
		 * copied in is no partition of ours; drop it (serving on: no client
		 * routes those keys here) */
		cl->ready_rev = 0;
		if (!(cur = map_of(mk)) || !(job = job_new(HKV_JOB_PURGE, -1)))
			goto nomem;
		job->map = cur;
		cur = NULL;
		issue(cl, job);
		return 0;
	}
	if (!nk) /* no move; a replicated store's repair, if any */
		return follow_fill(cl, sn, mk);
	if (!(cur = map_of(mk)) || !mk || !(next = hkv_calloc(1, sizeof(*next))) ||
	    hkv_cl_next_parse(nk, next, &base) || base != mk->mod_rev)
		goto out; /* nothing we can act on: the coordinator cleans up */
	if (hkv_cl_loses(cur, next, cl->id)) {
		if (cl->fence_rev != rev) {
			if (cur->replicas > 1)
				hkv_info("cluster: %s is on lists a repair grows: fenced for its final "
					 "pass", cl->id);
			else
				hkv_info("cluster: %s gives up %u partitions: fenced to %s them", cl->id,
					 hkv_cmap_moved(cur, next), cl->store_mode ? "copy" : "purge");
			cl->fence_rev = rev;
			cl->fence_ns = hkv_cl_boot_ns();
			cl->copy_failures = 0;
			atomic_store(&cl->move_fence, 1);
			if (cl->store_mode)
				goto out;
			if (!(job = job_new(HKV_JOB_PURGE, rev)))
				goto nomem;
			job->map = next;
			next = NULL;
			issue(cl, job);
			goto out;
		}
		if (cl->acked_rev == rev)
			goto out;
		if (!cl->store_mode) {
			if (cl->purged_rev != rev)
				goto out;
			crs = hkv_calloc(1, 1); /* the ack: "REV" */
		} else if (cl->copied_rev != rev && cl->copy_failures >= 3) {
			/* the new homes refuse our items (full, gone, a smaller item
			 * limit): say so, and the coordinator drops the move */
			crs = hkv_malloc(sizeof(" failed"));
			if (crs)
				memcpy(crs, " failed", sizeof(" failed"));
		} else if (cl->copied_rev != rev) {
			struct hkv_cmember *homes;

			/* the loop closes our clients within 100 ms of the fence */
			if (hkv_cl_boot_ns() - cl->fence_ns < 200000000ull)
				goto out;
			homes = hkv_calloc(next->nnames + 1, sizeof(*homes));
			if (!homes)
				goto nomem;
			ret = homes_ready(cl, sn, cur, next, rev, &crs, homes);
			if (ret <= 0 || !(job = job_new(HKV_JOB_COPY, rev))) {
				hkv_free(homes);
				ret = ret < 0 ? ret : 0;
				goto out;
			}
			if (cur->replicas > 1) { /* a repair's final pass */
				job->fill_rev = cl->fill_rev;
				job->tag = hkv_strdup(crs);
				if (!job->tag) {
					hkv_cluster_job_free(job);
					hkv_free(homes);
					goto nomem;
				}
			}
			job->map = next;
			job->cur = cur;
			job->homes = homes;
			next = cur = NULL;
			hkv_free(cl->copy_crs);
			cl->copy_crs = crs;
			crs = NULL;
			issue(cl, job);
			ret = 0; /* (homes_ready's 1) */
			goto out;
		} else {
			/* copied: the new homes must be the registrations copied into */
			ret = homes_ready(cl, sn, cur, next, rev, &crs, NULL);
			if (ret <= 0 || strcmp(crs, cl->copy_crs ? cl->copy_crs : "")) {
				if (ret >= 0)
					hkv_warn("cluster: a new home changed while %s copied: copying again",
						 cl->id);
				cl->copied_rev = 0;
				ret = ret < 0 ? ret : 0;
				goto out;
			}
		}
		/* the ack: "REV", "REV failed" or "REV a=12 b=40" (the new homes copied into) */
		if (!crs || !(val = hkv_malloc(strlen(crs) + 32)))
			goto nomem;
		snprintf(val, strlen(crs) + 32, "%lld%s", (long long)rev, crs);
		ret = put_ours(cl, "ack", val);
		if (!ret)
			cl->acked_rev = rev;
	} else if (cl->store_mode && hkv_cl_gains(cur, next, cl->id) && cl->ready_rev != rev &&
		   !hkv_cluster_fenced(cl)) { /* (copies need our data plane up) */
		if (cl->intaken_rev != rev && cl->fill_in_map &&
		    hkv_cl_same_placement(cl->fill_in_map, next)) {
			/* the move that ends the repair we took copies for: keep them */
			cl->intaken_rev = rev;
			cl->fill_in_rev = 0;
			map_drop(&cl->fill_in_map);
		}
		ret = intake_or_ready(cl, rev, &next, &cur);
		if (ret == 1) {
			ret = 0;
			cl->ready_rev = rev;
		}
	}
	goto out;
nomem:
	ret = -ENOMEM;
out:
	if (next)
		hkv_cmap_free(next);
	if (cur)
		hkv_cmap_free(cur);
	hkv_free(next);
	hkv_free(cur);
	hkv_free(val);
	hkv_free(crs);
	return ret;
}
