/*
 * coordinator.c - the member that holds PREFIX/coordinator: its term, how long
 * a member that left has been gone, PREFIX/identity, the map it places (one
 * replica, or a replicated store's lists), plans of moves and repairs, and
 * the transaction that commits a map.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "common/cluster_map.h"
#include "common/etcd.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "server/cluster.h"
#include "server/cluster_int.h"

/* Make name the primary of partition p (one replica per partition). */
static int set_primary(struct hkv_cmap *m, uint32_t p, const char *name)
{
	uint32_t i;

	for (i = 0; i < m->nnames && strcmp(m->names[i], name); i++)
		;
	if (i == m->nnames) {
		char (*n)[HKV_CLUSTER_ID_MAX] = hkv_realloc(m->names, (i + 1) * sizeof(*n));

		if (!n)
			return -ENOMEM;
		m->names = n;
		snprintf(n[i], sizeof(n[i]), "%s", name);
		m->nnames++;
	}
	m->repl[p * m->replicas] = (uint16_t)i;
	return 0;
}

/* The members not draining, in key order. */
static int read_members(struct hkv_cluster *cl, const struct snap *sn,
			char (**ids)[HKV_CLUSTER_ID_MAX], uint32_t *n)
{
	char dir[300];
	size_t dl;

	hkv_cl_key_of(cl, dir, sizeof(dir), "servers", "");
	dl = strlen(dir);
	*n = 0;
	*ids = hkv_calloc((size_t)sn->n + 1, sizeof(**ids));
	if (!*ids)
		return -ENOMEM;
	for (int i = 0; i < sn->n; i++) {
		struct hkv_cmember m;

		if (strncmp(sn->kvs[i].key, dir, dl) ||
		    hkv_cmember_parse(sn->kvs[i].value, sn->kvs[i].vlen, &m))
			continue; /* not a member record: never placed */
		if (!hkv_cl_snap_get(cl, sn, "drain", m.id))
			memcpy((*ids)[(*n)++], m.id, HKV_CLUSTER_ID_MAX);
	}
	return 0;
}

/* Forget the left-at times of servers that are members again. */
static void gone_prune(struct hkv_cluster *cl, const struct snap *sn)
{
	for (uint32_t i = 0; i < cl->ngone;)
		if (hkv_cl_is_member(cl, sn, cl->gone[i].id))
			cl->gone[i] = cl->gone[--cl->ngone];
		else
			i++;
}

/* A server gone this long is routed to by no client: the map's route lease
 * (the longest of the last map seen and ours) and a margin. */
static uint64_t gone_wait_ns(const struct hkv_cluster *cl)
{
	uint32_t ms = cl->map_lease_ms > cl->route_lease_ms ? cl->map_lease_ms
							    : cl->route_lease_ms;

	return ((uint64_t)ms + 500) * 1000000ull;
}

/* Has id, no member now, been no member for gone_wait_ns()? (From the first
 * round that saw it so: no earlier than its lease really ended.) */
int hkv_cl_gone_long_enough(struct hkv_cluster *cl, const char *id)
{
	uint64_t now = hkv_cl_boot_ns();
	struct gone *g;

	for (uint32_t i = 0; i < cl->ngone; i++)
		if (!strcmp(cl->gone[i].id, id))
			return now - cl->gone[i].since_ns >= gone_wait_ns(cl);
	g = hkv_realloc(cl->gone, (cl->ngone + 1) * sizeof(*g));
	if (!g)
		return 0;
	cl->gone = g;
	snprintf(g[cl->ngone].id, sizeof(g[cl->ngone].id), "%s", id);
	g[cl->ngone++].since_ns = now;
	return 0;
}

int hkv_cl_same_placement(const struct hkv_cmap *a, const struct hkv_cmap *b)
{
	if (a->partitions != b->partitions || a->replicas != b->replicas)
		return 0;
	for (uint32_t p = 0; p < a->partitions; p++) {
		if (hkv_cmap_len(a, p) != hkv_cmap_len(b, p))
			return 0;
		for (uint32_t r = 0; r < hkv_cmap_len(a, p); r++)
			if (strcmp(hkv_cmap_server(a, p, r), hkv_cmap_server(b, p, r)))
				return 0;
	}
	return 1;
}

/*
 * Write `want` as PREFIX/map in one transaction that holds only if, since
 * this round's view: the map is unchanged (rev; 0: still absent), we still
 * lead (the coordinator key under our lease), and every server of cur that
 * gives up partitions is the same registration (create_revision; 0: still
 * no member) - a server that came back meanwhile may serve again and must
 * be asked (a move) first. Store mode: so is every server that gains (the
 * registration the losers copied into). del_next: the move it commits.
 */
int hkv_cl_commit_map(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *cur,
		      const struct hkv_cmap *want, int64_t rev, int del_next)
{
	uint32_t nl = (cur ? cur->nnames : 0) + want->nnames, k = 0;
	struct hkv_etcd_cmp *cmps = hkv_calloc(nl + 2, sizeof(*cmps));
	char (*keys)[512] = hkv_calloc(nl + 3, sizeof(*keys));
	char *json = hkv_cmap_format(want);
	int64_t new_rev = 0;
	int ret = -ENOMEM;

	if (!cmps || !keys || !json)
		goto out;
	hkv_cl_key_of(cl, keys[0], sizeof(keys[0]), "map", NULL);
	cmps[k++] = (struct hkv_etcd_cmp){keys[0], rev ? HKV_ETCD_CMP_MOD : HKV_ETCD_CMP_CREATE,
					  rev};
	hkv_cl_key_of(cl, keys[1], sizeof(keys[1]), "coordinator", NULL);
	cmps[k++] = (struct hkv_etcd_cmp){keys[1], HKV_ETCD_CMP_LEASE, atomic_load(&cl->lease)};
	for (uint32_t i = 0; i < nl; i++) {
		const char *id = i < nl - want->nnames ? cur->names[i]
						       : want->names[i - (nl - want->nnames)];
		const struct hkv_etcd_kv *m;

		if (i < nl - want->nnames ? !hkv_cl_loses(cur, want, id)
					  : !cl->store_mode || !cur || !hkv_cl_gains(cur, want, id))
			continue;
		m = hkv_cl_snap_get(cl, sn, "servers", id);
		hkv_cl_key_of(cl, keys[k], sizeof(keys[k]), "servers", id);
		cmps[k] = (struct hkv_etcd_cmp){keys[k], HKV_ETCD_CMP_CREATE, m ? m->create_rev : 0};
		k++;
	}
	hkv_cl_key_of(cl, keys[nl + 2], sizeof(keys[nl + 2]), "next", NULL);
	ret = hkv_etcd_txn_put(cl->e, cmps, (int)k, keys[0], json, strlen(json), 0,
			       del_next ? keys[nl + 2] : NULL, &new_rev);
	if (!ret) {
		hkv_info("cluster: map epoch %lld: %u partitions on %u servers, %u moved",
			 (long long)new_rev, want->partitions, want->nnames,
			 cur ? hkv_cmap_moved(cur, want) : want->partitions);
		cl->moves_committed += del_next != 0;
	} else if (ret == -ECANCELED)
		ret = 0; /* the view is out of date: the next round decides again */
out:
	hkv_free(cmps);
	hkv_free(keys);
	hkv_free(json);
	return ret;
}

/* PREFIX/identity: the partition count and routing hash key, written once;
 * every map is made from it, so a lost or rewritten map cannot change where
 * keys go. 0 and *id filled, 1 when it was just created (decide next round),
 * or an error. */
static int identity(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_etcd_kv *mk,
		    struct hkv_cmap *id)
{
	const struct hkv_etcd_kv *ik = hkv_cl_snap_get(cl, sn, "identity", NULL);
	char key[512], *json;
	int ret;

	memset(id, 0, sizeof(*id));
	if (ik) {
		int store = 0;

		ret = hkv_cmap_identity_parse(ik->value, ik->vlen, &id->partitions, id->hash_key,
					      &store, &id->replicas);
		if (ret)
			hkv_err("cluster: %s/identity is garbage; not touching the map", cl->prefix);
		else if (store != cl->store_mode)
			hkv_err("cluster: %s/identity says %s mode, we run %s; not touching the map",
				cl->prefix, store ? "store" : "cache", cl->store_mode ? "store" : "cache"),
				ret = -EPROTO;
		return ret;
	}
	if (mk) { /* a map from before identities: adopt its hash */
		struct hkv_cmap m;

		if (hkv_cmap_parse(mk->value, mk->vlen, &m))
			return -EPROTO;
		id->partitions = m.partitions;
		memcpy(id->hash_key, m.hash_key, sizeof(id->hash_key));
		hkv_cmap_free(&m);
	} else {
		id->partitions = cl->partitions;
		randombytes_buf(id->hash_key, sizeof(id->hash_key));
	}
	json = hkv_cmap_identity_format(id->partitions, id->hash_key, cl->store_mode, cl->replicas);
	if (!json)
		return -ENOMEM;
	hkv_cl_key_of(cl, key, sizeof(key), "identity", NULL);
	ret = hkv_etcd_put_if(cl->e, key, json, strlen(json), 0, 0, NULL);
	hkv_free(json);
	return ret && ret != -ECANCELED ? ret : 1;
}

/*
 * Store mode: a server that left keeps its partitions - its items wait for
 * it on its --memory-file, and its keys fail with HKV_EUNAVAILABLE - unless
 * an operator removed it. And a server that would both gain and give up
 * partitions keeps what it would give up for now (a loser is fenced, a
 * gainer must serve the copies coming in): the next move takes them.
 */
static int store_placement(struct hkv_cluster *cl, const struct snap *sn,
			   const struct hkv_cmap *cur, struct hkv_cmap *want)
{
	int ret = 0;

	for (uint32_t p = 0; p < cur->partitions && !ret; p++) {
		const char *o = hkv_cmap_server(cur, p, 0);

		if (!hkv_cl_is_member(cl, sn, o) && !hkv_cl_snap_get(cl, sn, "removed", o))
			ret = set_primary(want, p, o);
	}
	for (uint32_t i = 0; i < cur->nnames && !ret; i++) {
		const char *id = cur->names[i];

		if (!hkv_cl_loses(cur, want, id) || !hkv_cl_gains(cur, want, id))
			continue;
		for (uint32_t p = 0; p < cur->partitions && !ret; p++)
			if (!strcmp(hkv_cmap_server(cur, p, 0), id))
				ret = set_primary(want, p, id);
	}
	return ret;
}

/* Can partition p of m take id as a new replica? (Short, id not on it,
 * every server on it a member: the primary copies, all of them fence.) */
static int can_admit(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *m,
		     uint32_t p, const char *id)
{
	if (hkv_cmap_len(m, p) >= m->replicas || hkv_cmap_holds(m, p, id))
		return 0;
	for (uint32_t r = 0; r < hkv_cmap_len(m, p); r++)
		if (!hkv_cl_is_member(cl, sn, hkv_cmap_server(m, p, r)))
			return 0; /* (dropped first, then repaired) */
	return 1;
}

/*
 * Leader, a replicated store: one member - of those that can take a
 * short partition, the one holding fewest - is admitted right behind the
 * primary of every short partition it is not on; the primaries copy them
 * there while serving (PREFIX/fill = {"base":"<map revision>","map":<the
 * map to be>}). One new replica per fill, so it is never also on a list
 * the fill grows (it would have to fence and fill at once); the next fill
 * takes what is still short.
 */
static int plan_fill(struct hkv_cluster *cl, const struct snap *sn, const struct hkv_cmap *cur,
		     struct hkv_cmap *want, char (*ids)[HKV_CLUSTER_ID_MAX], uint32_t n)
{
	uint32_t best = n, best_load = 0, grown = 0;
	char key[512], *json;
	int ret = 0;

	if (hkv_cl_boot_ns() < cl->fill_after_ns)
		return 0; /* the last one failed: not at once again */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t load = 0, can = 0;

		for (uint32_t p = 0; p < cur->partitions; p++) {
			load += hkv_cmap_holds(cur, p, ids[i]);
			can |= can_admit(cl, sn, cur, p, ids[i]);
		}
		if (can && !strcmp(ids[i], cl->fill_failed) && n > 1)
			load += 1u << 30; /* its last fill failed: anyone else first */
		if (can && (best == n || load < best_load)) {
			best = i;
			best_load = load;
		}
	}
	if (best == n)
		return 0; /* nothing short, or nobody to put there */
	for (uint32_t p = 0; p < want->partitions && !ret; p++)
		if (can_admit(cl, sn, cur, p, ids[best])) {
			ret = hkv_cmap_admit(want, p, ids[best]);
			grown++;
		}
	if (ret || !grown)
		return ret;
	json = hkv_cl_next_format(want, cur->epoch);
	hkv_cl_key_of(cl, key, sizeof(key), "fill", NULL);
	ret = json ? hkv_etcd_put_if(cl->e, key, json, strlen(json), 0, 0, NULL) : -ENOMEM;
	hkv_free(json);
	if (!ret)
		hkv_info("cluster: repairing %u partitions short of %u replicas onto %s (map %lld -> "
			 "fill)", grown, want->replicas, ids[best], (long long)cur->epoch);
	return ret == -ECANCELED ? 0 : ret;
}

/*
 * Leader, a replicated store (identity replicas > 1): the first map places
 * each partition on `replicas` members, once that many have joined; after
 * that, a member gone past GONE_WAIT (its lease expired, and no client
 * routes to it any more) is dropped from every list that has another
 * server, the order of the rest kept - so a backup becomes the primary
 * with every write the old primary held (docs/design.md, "Replicas"). The
 * drop needs no fence: the dropped member is no member (the transaction
 * checks its key is still absent). A list shorter than `replicas` is
 * repaired: a fill (plan_fill, drive_fill) copies its partitions onto a
 * member not on it, then a move (PREFIX/next, every server on the old list
 * fenced for the final pass) admits that member behind the primary.
 */
static int recompute_replicated(struct hkv_cluster *cl, const struct snap *sn,
				const struct hkv_etcd_kv *mk, struct hkv_cmap *want,
				char (*ids)[HKV_CLUSTER_ID_MAX], uint32_t n)
{
	const struct hkv_etcd_kv *nk = hkv_cl_snap_get(cl, sn, "next", NULL);
	const struct hkv_etcd_kv *fk = hkv_cl_snap_get(cl, sn, "fill", NULL);
	struct hkv_cmap cur = {0};
	int ret, changed = 0;

	if (!mk) {
		/* the first map: once `replicas` servers have joined and no other
		 * joined for a lease TTL (servers started together all get lists,
		 * on a slow host too) */
		if (n != cl->first_n) {
			cl->first_n = n;
			cl->first_ns = hkv_cl_boot_ns();
		}
		if (n < want->replicas) {
			if (hkv_cl_boot_ns() - cl->log_ns > 5000000000ull) {
				cl->log_ns = hkv_cl_boot_ns();
				hkv_info("cluster: %u of %u servers have joined; the map waits for all",
					 n, want->replicas);
			}
			return 0;
		}
		if (hkv_cl_boot_ns() - cl->first_ns < (uint64_t)cl->ttl_s * 1000000000ull)
			return 0;
		ret = hkv_cmap_place(want, (const char (*)[HKV_CLUSTER_ID_MAX])ids, n);
		want->route_lease_ms = cl->route_lease_ms;
		return ret ? ret : hkv_cl_commit_map(cl, sn, NULL, want, 0, 0);
	}
	ret = hkv_cmap_parse(mk->value, mk->vlen, &cur);
	if (!ret && (cur.partitions != want->partitions ||
		     memcmp(cur.hash_key, want->hash_key, sizeof(want->hash_key))))
		ret = -EPROTO;
	if (!ret)
		ret = hkv_cmap_parse(mk->value, mk->vlen, want);
	if (ret) {
		hkv_err("cluster: %s/map is not this cluster's partition map; leaving it alone",
			cl->prefix);
		hkv_cmap_free(&cur);
		return ret;
	}
	cl->map_lease_ms = hkv_cmap_route_lease(&cur);
	cur.epoch = mk->mod_rev;
	if (nk) { /* a repair's final pass (a server lost meanwhile drops it) */
		ret = hkv_cl_drive_move(cl, sn, nk, &cur, mk->mod_rev);
		hkv_cmap_free(&cur);
		return ret;
	}
	for (uint32_t i = 0; i < cur.nnames; i++) {
		const char *id = cur.names[i];

		if (hkv_cl_is_member(cl, sn, id) || !hkv_cl_gone_long_enough(cl, id))
			continue;
		if (hkv_cmap_drop(want, id)) {
			hkv_warn("cluster: %s is gone: dropped from its partitions' replica lists", id);
			changed = 1;
		}
	}
	if (changed)
		ret = hkv_cl_commit_map(cl, sn, &cur, want, mk->mod_rev, 0);
	else if (fk)
		ret = hkv_cl_drive_fill(cl, sn, fk, &cur, mk->mod_rev);
	else
		ret = plan_fill(cl, sn, &cur, want, ids, n);
	hkv_cmap_free(&cur);
	return ret;
}

/* Leader: make PREFIX/map place every partition on the members. */
static int recompute_map(struct hkv_cluster *cl, const struct snap *sn)
{
	char (*ids)[HKV_CLUSTER_ID_MAX] = NULL;
	const struct hkv_etcd_kv *mk = hkv_cl_snap_get(cl, sn, "map", NULL);
	const struct hkv_etcd_kv *nk = hkv_cl_snap_get(cl, sn, "next", NULL);
	struct hkv_cmap cur = {0}, want = {0};
	uint32_t n;
	int ret, two_phase = 0;
	int64_t rev = 0;

	ret = identity(cl, sn, mk, &want);
	if (ret)
		return ret > 0 ? 0 : ret;
	ret = read_members(cl, sn, &ids, &n);
	if (ret || !n)
		goto out;
	if (want.replicas > 1) {
		ret = recompute_replicated(cl, sn, mk, &want, ids, n);
		goto out;
	}
	if (mk) {
		ret = hkv_cmap_parse(mk->value, mk->vlen, &cur);
		if (!ret && (cur.partitions != want.partitions ||
			     memcmp(cur.hash_key, want.hash_key, sizeof(want.hash_key))))
			ret = -EPROTO;
		if (ret) {
			hkv_err("cluster: %s/map is not this cluster's partition map; leaving it alone",
				cl->prefix);
			goto out;
		}
		rev = mk->mod_rev;
		cur.epoch = rev;
		cl->map_lease_ms = hkv_cmap_route_lease(&cur);
		if (nk) {
			ret = hkv_cl_drive_move(cl, sn, nk, &cur, rev);
			goto out;
		}
	}
	ret = hkv_cmap_place(&want, (const char (*)[HKV_CLUSTER_ID_MAX])ids, n);
	want.route_lease_ms = mk ? cur.route_lease_ms : cl->route_lease_ms; /* (fixed by the first) */
	if (!ret && mk && cl->store_mode)
		ret = store_placement(cl, sn, &cur, &want);
	if (ret || (mk && hkv_cl_same_placement(&cur, &want)))
		goto out;
	for (uint32_t i = 0; mk && i < cur.nnames; i++) {
		if (!hkv_cl_loses(&cur, &want, cur.names[i]))
			continue;
		if (hkv_cl_is_member(cl, sn, cur.names[i]))
			two_phase = 1;
		else if (!hkv_cl_gone_long_enough(cl, cur.names[i]))
			goto out; /* clients may still route to it: wait */
	}
	if (two_phase) { /* live losers purge first: the map waits in next */
		char key[512], *json = hkv_cl_next_format(&want, rev);

		hkv_cl_key_of(cl, key, sizeof(key), "next", NULL);
		ret = json ? hkv_etcd_put_if(cl->e, key, json, strlen(json), 0, 0, NULL) : -ENOMEM;
		hkv_free(json);
		if (!ret)
			hkv_info("cluster: moving %u partitions (map %lld -> next)",
				 hkv_cmap_moved(&cur, &want), (long long)rev);
		if (ret == -ECANCELED)
			ret = 0;
		goto out;
	}
	ret = hkv_cl_commit_map(cl, sn, mk ? &cur : NULL, &want, rev, 0);
out:
	hkv_cmap_free(&cur);
	hkv_cmap_free(&want);
	hkv_free(ids);
	return ret;
}

int hkv_cl_coordinate(struct hkv_cluster *cl, const struct snap *sn)
{
	const struct hkv_etcd_kv *ck = hkv_cl_snap_get(cl, sn, "coordinator", NULL);
	char key[512];
	int was = cl->leader, ret;

	if (!ck) {
		hkv_cl_key_of(cl, key, sizeof(key), "coordinator", NULL);
		ret = hkv_etcd_put_if(cl->e, key, cl->id, strlen(cl->id), 0,
				      atomic_load(&cl->lease), NULL);
		return ret == -ECANCELED ? 0 : ret; /* the next round's view says who won */
	}
	cl->leader = ck->lease == atomic_load(&cl->lease);
	if (cl->leader && !was)
		hkv_info("cluster: %s coordinates", cl->id);
	if (!cl->leader || !was)
		cl->ngone = 0; /* a new term measures absences afresh (issue 29) */
	if (!cl->leader)
		return 0;
	gone_prune(cl, sn);
	return recompute_map(cl, sn);
}
