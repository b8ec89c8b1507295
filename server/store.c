/* store.c - see store.h. */
#include "server/store.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/transport_int.h"

#define TICKET_TTL_NS (10ull * 1000000000ull)

/* The segment table, in the region (entries change under us: load atomically). */
static uint64_t *seg_table(const struct hkv_store *s)
{
	return (uint64_t *)((uint8_t *)s->region.base + s->geom->seg_table_off);
}

/* Does the data plane hand out memory windows (and so take GRANTs)? */
static int windows_on(const struct hkv_store *s)
{
	return s->data && (hkv_listener_region(s->data)->access & HKV_ACCESS_WINDOWS);
}

/* A fresh region: lay out the header. */
static int store_format(struct hkv_store *s, const struct hkv_store_opts *o)
{
	struct hkv_geometry g;
	int ret = hkv_geometry_init(&g, s->region.length, o->seg_size, o->index_slots,
				    o->cache_mode ? HKV_GEOM_F_CACHE : 0);

	if (ret) {
		hkv_err("store: --memory %llu is too small for --segment-size %u",
			(unsigned long long)o->memory, o->seg_size);
		return ret;
	}
	if (getrandom(&g.boot_id, sizeof(g.boot_id), 0) != sizeof(g.boot_id) ||
	    (!o->hash_key && getrandom(g.hash_key, sizeof(g.hash_key), 0) != sizeof(g.hash_key)))
		return -errno;
	if (o->hash_key)
		memcpy(g.hash_key, o->hash_key, sizeof(g.hash_key));
	g.max_client_segs = o->max_client_segs;
	hkv_geometry_seal(&g);
	memcpy(s->geom, &g, sizeof(g));
	return 0;
}

/*
 * Warm restart from --memory-file: the header must validate (a torn or
 * foreign header, or another layout version, is refused, never served). The
 * clients that owned segments are gone with the old process: their segments
 * are orphaned, so their live blocks stay and their free blocks get adopted.
 */
static int store_reopen(struct hkv_store *s, const struct hkv_store_opts *o)
{
	uint64_t *table, entries = 0;
	const uint64_t *slot;
	uint32_t orphaned = 0;
	int ret = hkv_geometry_check(s->geom, s->region.length);

	if (ret == HKV_EPROTO) {
		hkv_err("store: %s has region layout version %u; this server writes version %u. "
			"Refusing to serve it.", o->memory_file, s->geom->version, HKV_LAYOUT_VERSION);
		return ret;
	}
	if (ret) {
		hkv_err("store: %s: region header fails validation (torn, corrupt or not a hatchkv "
			"region). Refusing to serve it; move the file away to start empty.",
			o->memory_file);
		return ret;
	}
	table = seg_table(s);
	for (uint32_t i = 0; i < s->geom->nsegs; i++)
		if (hkv_seg_state(table[i]) == HKV_SEG_OWNED ||
		    hkv_seg_state(table[i]) == HKV_SEG_IDLE) {
			table[i] = hkv_seg_make(HKV_SEG_ORPHAN, hkv_seg_class(table[i]), 0,
						hkv_seg_epoch(table[i]) + 1);
			orphaned++;
		}
	if (s->geom->max_client_segs != o->max_client_segs) { /* this start's limit */
		s->geom->max_client_segs = o->max_client_segs;
		hkv_geometry_seal(s->geom);
	}
	slot = (const uint64_t *)((uint8_t *)s->region.base + s->geom->index_off);
	for (uint64_t i = 0; i < s->geom->nbuckets * HKV_BUCKET_SLOTS; i++)
		entries += slot[i] != 0;
	hkv_info("store: warm restart from %s: %llu index entries, %u segments orphaned for "
		 "adoption", o->memory_file, (unsigned long long)entries, orphaned);
	return 0;
}

int hkv_store_init(struct hkv_store *s, const struct hkv_store_opts *o)
{
	const struct hkv_geometry *g;
	int existed = 0, ret;

	memset(s, 0, sizeof(*s));
	s->region.fd = -1;
	s->clients = hkv_calloc(HKV_MAX_CLIENTS + 1, sizeof(*s->clients));
	if (!s->clients)
		return -ENOMEM;
	s->max_clients = o->max_clients;
	ret = hkv_region_create(&s->region, o->memory, o->memory_file, &existed);
	if (ret) {
		hkv_err("store: cannot create a %llu-byte region: %s",
			(unsigned long long)o->memory, strerror(-ret));
		hkv_free(s->clients);
		return ret;
	}
	s->geom = s->region.base;
	ret = existed ? store_reopen(s, o) : store_format(s, o);
	if (ret) {
		hkv_store_fini(s);
		return ret;
	}
	s->next_id = 1;
	g = s->geom;
	s->holder = hkv_calloc(g->nsegs, sizeof(*s->holder));
	s->held_entry = hkv_calloc(g->nsegs, sizeof(*s->held_entry));
	s->seen_entry = hkv_calloc(g->nsegs, sizeof(*s->seen_entry));
	s->seen_ns = hkv_calloc(g->nsegs, sizeof(*s->seen_ns));
	if (!s->holder || !s->held_entry || !s->seen_entry || !s->seen_ns) {
		hkv_store_fini(s);
		return -ENOMEM;
	}
	hkv_info("store: region %llu MiB%s: index %llu buckets (%llu slots), %u segments of %u KiB, "
		 "%u size classes (%u..%u B)%s",
		 (unsigned long long)(s->region.length >> 20), s->region.hugetlb ? " (hugetlb)" : "",
		 (unsigned long long)g->nbuckets, (unsigned long long)g->nbuckets * HKV_BUCKET_SLOTS,
		 g->nsegs, g->seg_size >> 10, g->nclasses, g->class_size[0],
		 g->class_size[g->nclasses - 1], g->flags & HKV_GEOM_F_CACHE ? ", cache mode" : "");
	return 0;
}

void hkv_store_fini(struct hkv_store *s)
{
	hkv_free(s->holder);
	hkv_free(s->held_entry);
	hkv_free(s->seen_entry);
	hkv_free(s->seen_ns);
	s->holder = NULL;
	s->held_entry = NULL;
	s->seen_entry = s->seen_ns = NULL;
	hkv_region_destroy(&s->region);
	for (uint32_t id = 1; s->clients && id <= HKV_MAX_CLIENTS; id++)
		hkv_free(s->clients[id].grants);
	hkv_free(s->clients);
	s->clients = NULL;
}

int hkv_store_admit(struct hkv_store *s, struct hkv_ctl_welcome *w, int readonly)
{
	uint64_t now = hkv_now_ns();

	if (s->fenced)
		return HKV_EDISCONNECTED;
	/* admitted but not connected yet count too (expired tickets until the tick) */
	if (s->max_clients && s->nconnected + s->npending >= s->max_clients)
		return -EUSERS;

	for (uint32_t tries = 0; tries < HKV_MAX_CLIENTS; tries++) {
		uint32_t id = s->next_id;
		struct hkv_client_rec *c = &s->clients[id];

		s->next_id = id % HKV_MAX_CLIENTS + 1; /* round robin: ids are reused late */
		if (c->connected || c->ticket_expiry_ns > now)
			continue;
		if (getrandom(c->ticket, HKV_TICKET_LEN, 0) != HKV_TICKET_LEN)
			return -errno;
		s->npending += !c->ticket_expiry_ns; /* else it replaces an expired one */
		c->ticket_expiry_ns = now + TICKET_TTL_NS;
		c->readonly = readonly;
		memset(w, 0, sizeof(*w));
		w->client_id = id;
		memcpy(w->ticket, c->ticket, HKV_TICKET_LEN);
		return 0;
	}
	return -EUSERS;
}

static int ticket_equal(const uint8_t *a, const uint8_t *b)
{
	uint8_t diff = 0;

	for (int i = 0; i < HKV_TICKET_LEN; i++) /* constant time */
		diff |= a[i] ^ b[i];
	return diff == 0;
}

int hkv_store_on_connect(void *arg, const void *hello, size_t len, struct hkv_accept_info *out)
{
	struct hkv_store *s = arg;
	struct hkv_data_hello h;
	struct hkv_client_rec *c;

	if (len != sizeof(h))
		return HKV_EPROTO;
	memcpy(&h, hello, sizeof(h));
	if (h.client_id == 0 || h.client_id > HKV_MAX_CLIENTS)
		return HKV_EAUTH;
	c = &s->clients[h.client_id];
	if (c->connected || c->ticket_expiry_ns < hkv_now_ns() || !ticket_equal(c->ticket, h.ticket)) {
		hkv_warn("store: data connection with a bad or stale ticket (client %u) refused",
			 h.client_id);
		return HKV_EAUTH;
	}
	c->ticket_expiry_ns = 0;
	s->npending--;
	c->connected = 1;
	s->nconnected++;
	out->cookie = h.client_id;
	if (c->readonly) /* enforced by the NIC (a read-only MR), not by the client */
		out->access = HKV_ACCESS_READ;
	hkv_info("store: client %u connected (%u connected)", h.client_id, s->nconnected);
	return 0;
}

/* Does entry e say the segment is client id's (OWNED, or IDLE and not yet
 * taken back or adopted)? */
static int held_by(uint64_t e, uint32_t id)
{
	return (hkv_seg_state(e) == HKV_SEG_OWNED || hkv_seg_state(e) == HKV_SEG_IDLE) &&
	       hkv_seg_owner(e) == (id & 0xffff);
}

/* A granted segment whose entry the server last saw IDLE, now OWNED by
 * another client one epoch on: adopted while idle, not stolen. */
static int idle_taken(const struct hkv_store *s, uint32_t seg, uint64_t e)
{
	uint64_t was = s->held_entry[seg];

	return hkv_seg_state(was) == HKV_SEG_IDLE && hkv_seg_state(e) == HKV_SEG_OWNED &&
	       hkv_seg_owner(e) != hkv_seg_owner(was) && hkv_seg_epoch(e) == hkv_seg_epoch(was) + 1;
}

/*
 * The client's connection is gone, so nothing it posts can land any more
 * (the transport destroyed its queue pair first). Its segments keep their
 * live blocks; mark them orphaned so a client short of memory adopts them.
 */
void hkv_store_on_disconnect(void *arg, uint64_t cookie)
{
	struct hkv_store *s = arg;
	uint64_t *table = seg_table(s);
	uint32_t id = (uint32_t)cookie, n = 0;

	if (id == 0 || id > HKV_MAX_CLIENTS || !s->clients[id].connected)
		return;
	s->clients[id].connected = 0;
	memset(s->clients[id].ticket, 0, HKV_TICKET_LEN);
	s->clients[id].ngrants = 0; /* the transport deallocated its windows */
	s->nconnected--;
	for (uint32_t i = 0; i < s->geom->nsegs; i++) {
		uint64_t e = __atomic_load_n(&table[i], __ATOMIC_ACQUIRE);

		if (s->holder[i] == id) { /* its window's segment, whatever the table says */
			s->holder[i] = 0;
			if (!held_by(e, id) && !idle_taken(s, i, e)) {
				e = s->held_entry[i]; /* put back, then orphan it below */
				__atomic_store_n(&table[i], e, __ATOMIC_RELEASE);
			}
		}
		if (!held_by(e, id))
			continue;
		/* Only the owner changes an owned entry, and it is gone: a CAS keeps
		 * us honest against a garbage-writing client anyway. */
		if (__atomic_compare_exchange_n(&table[i], &e,
						hkv_seg_make(HKV_SEG_ORPHAN, hkv_seg_class(e), 0,
							     hkv_seg_epoch(e) + 1),
						0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			n++;
	}
	s->orphaned_segments += n;
	if (windows_on(s))
		hkv_info("store: client %u disconnected; %u segment(s) orphaned for adoption; "
			 "memory windows bound: %d", id, n, hkv_listener_nwindows(s->data));
	else
		hkv_info("store: client %u disconnected; %u segment(s) orphaned for adoption", id,
			 n);
}

/* ---- memory windows ----------------------------------------------------------- */

static int owns(const struct hkv_store *s, uint32_t id, uint32_t seg)
{
	uint64_t e = __atomic_load_n(&seg_table(s)[seg], __ATOMIC_ACQUIRE);

	return hkv_seg_state(e) == HKV_SEG_OWNED && hkv_seg_owner(e) == (id & 0xffff);
}

/* Client id no longer holds segment seg's window: off its grants, and no
 * longer the segment's holder. */
static void drop_grant(struct hkv_store *s, uint32_t id, uint32_t seg)
{
	struct hkv_client_rec *c = &s->clients[id];

	for (uint32_t i = 0; i < c->ngrants; i++)
		if (c->grants[i] == seg)
			c->grants[i] = c->grants[--c->ngrants];
	if (s->holder[seg] == id)
		s->holder[seg] = 0;
}

/*
 * Segment seg was adopted while IDLE from client id, which holds its WRITE
 * window: the window goes (its rkey dies, so a late WRITE of id's fails
 * rather than lands in the adopter's blocks), and so does the grant.
 */
static void revoke_transferred(struct hkv_store *s, uint32_t id, uint32_t seg)
{
	const struct hkv_geometry *geo = s->geom;

	hkv_listener_revoke(s->data, id, geo->data_off + (uint64_t)seg * geo->seg_size);
	drop_grant(s, id, seg);
	s->transferred++;
	hkv_debug("store: client %u's idle segment %u adopted by client %u; its window revoked",
		  id, seg, hkv_seg_owner(__atomic_load_n(&seg_table(s)[seg], __ATOMIC_ACQUIRE)));
}

/*
 * A segment whose window the server granted stays its holder's until the
 * holder disconnects (the library never gives a granted segment back while
 * connected). Every writer can CAS the segment table, so an entry that no
 * longer says OWNED(holder) was changed by another client - to steal the
 * segment, or to free it for a claim: put it back. (The holder's own
 * re-carving keeps OWNED(holder) and is remembered as the entry to restore.)
 */
static void sweep_client(struct hkv_store *s, uint32_t id)
{
	struct hkv_client_rec *c = &s->clients[id];
	uint64_t *table = seg_table(s);

	for (uint32_t i = 0; i < c->ngrants; i++) {
		uint32_t seg = c->grants[i];
		uint64_t e = __atomic_load_n(&table[seg], __ATOMIC_ACQUIRE);

		if (held_by(e, id)) {
			s->held_entry[seg] = e;
			continue;
		}
		if (idle_taken(s, seg, e)) { /* adopted while idle: no longer id's */
			revoke_transferred(s, id, seg);
			i--; /* the grant at i was replaced by the last one */
			continue;
		}
		if (__atomic_compare_exchange_n(&table[seg], &e, s->held_entry[seg], 0,
						__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			s->restored++;
			hkv_warn("store: the segment table entry of client %u's segment %u was "
				 "changed by another client (to 0x%llx); put back", id, seg,
				 (unsigned long long)e);
		}
	}
}

int hkv_store_grant(struct hkv_store *s, const struct hkv_ctl_grant *g,
		    struct hkv_ctl_granted *out, const char **why)
{
	const struct hkv_geometry *geo = s->geom;
	struct hkv_client_rec *c;
	uint32_t access;
	int ret;

	memset(out, 0, sizeof(*out));
	*why = "not granted";
	if (!windows_on(s)) {
		*why = "this server does not use memory windows";
		return -EOPNOTSUPP;
	}
	if (g->client_id == 0 || g->client_id > HKV_MAX_CLIENTS ||
	    !s->clients[g->client_id].connected ||
	    !ticket_equal(s->clients[g->client_id].ticket, g->ticket)) {
		*why = "unknown client or wrong ticket";
		return HKV_EAUTH;
	}
	c = &s->clients[g->client_id];
	out->seg = g->seg;
	if (g->seg == HKV_GRANT_BASE) {
		/* READ everywhere; ATOMIC everywhere but the header, so no client
		 * can break the geometry every other client validates */
		access = HKV_ACCESS_READ;
		out->off = 0;
		out->len = s->region.length;
		ret = c->readonly ? 0
				  : hkv_listener_grant(s->data, g->client_id, geo->seg_table_off,
						       s->region.length - geo->seg_table_off,
						       HKV_ACCESS_ATOMIC, &out->atomic_rkey);
		if (ret) {
			*why = ret == -EINPROGRESS ? "binding"
			       : ret == -EAGAIN ? "the data connection is not established"
						: "binding the memory window failed";
			return ret;
		}
	} else {
		if (c->readonly) {
			*why = "read-only client";
			return -EPERM;
		}
		if (g->seg >= geo->nsegs) {
			*why = "no such segment";
			return -EINVAL;
		}
		if (s->holder[g->seg] && s->holder[g->seg] != g->client_id &&
		    s->clients[s->holder[g->seg]].connected &&
		    idle_taken(s, g->seg,
			       __atomic_load_n(&seg_table(s)[g->seg], __ATOMIC_ACQUIRE)))
			revoke_transferred(s, s->holder[g->seg], g->seg);
		if (s->holder[g->seg] && s->holder[g->seg] != g->client_id &&
		    s->clients[s->holder[g->seg]].connected) {
			*why = "the segment is another client's (its window is granted)";
			return -EPERM;
		}
		if (!owns(s, g->client_id, g->seg)) {
			*why = "the segment table does not say the segment is yours";
			return -EPERM;
		}
		access = HKV_ACCESS_WRITE;
		out->off = geo->data_off + (uint64_t)g->seg * geo->seg_size;
		out->len = geo->seg_size;
		sweep_client(s, g->client_id);
		for (uint32_t i = 0; i < c->ngrants; i++)
			if (c->grants[i] == g->seg)
				goto bind; /* granted before: the same rkey again */
		if (geo->max_client_segs && c->ngrants >= geo->max_client_segs) {
			*why = "segment limit reached";
			return HKV_EFULL;
		}
		if (c->ngrants == c->capgrants) {
			uint32_t cap = c->capgrants ? 2 * c->capgrants : 8;
			void *p = hkv_realloc(c->grants, cap * sizeof(*c->grants));

			if (!p)
				return -ENOMEM;
			c->grants = p;
			c->capgrants = cap;
		}
		c->grants[c->ngrants++] = g->seg;
		s->holder[g->seg] = g->client_id;
		s->held_entry[g->seg] = __atomic_load_n(&seg_table(s)[g->seg], __ATOMIC_ACQUIRE);
	}
bind:
	out->access = access;
	ret = hkv_listener_grant(s->data, g->client_id, out->off, out->len, access, &out->rkey);
	if (ret == -EINPROGRESS) { /* the control plane asks again, without waiting here */
		*why = "binding";
		return ret;
	}
	if (ret) {
		*why = ret == -EAGAIN ? "the data connection is not established"
				      : "binding the memory window failed";
		if (g->seg != HKV_GRANT_BASE) /* not granted after all */
			drop_grant(s, g->client_id, g->seg);
		hkv_warn("store: client %u: window for %s %u: %s", g->client_id,
			 g->seg == HKV_GRANT_BASE ? "base rights" : "segment", g->seg,
			 hkv_strerror(ret));
		return ret;
	}
	hkv_debug("store: client %u granted %s %u, rkey 0x%x", g->client_id,
		  g->seg == HKV_GRANT_BASE ? "base rights" : "segment", g->seg, out->rkey);
	return 0;
}

/*
 * Segments stop being stranded by clients that stopped allocating in them:
 * an OWNED entry of a connected client that has not changed for
 * HKV_SEG_IDLE_MS (its owner renews it every HKV_SEG_RENEW_MS while it
 * allocates there) goes IDLE, for its owner to take back or anyone short of
 * memory to adopt. Every 100 ms: a load per segment.
 */
void hkv_store_idle_sweep(struct hkv_store *s)
{
	uint64_t *table = seg_table(s), now = hkv_now_ns();
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->geom->nsegs; i++) {
		uint64_t e = __atomic_load_n(&table[i], __ATOMIC_ACQUIRE), idle;
		uint32_t owner = hkv_seg_owner(e);

		if (e != s->seen_entry[i] || !s->seen_ns[i]) {
			s->seen_entry[i] = e;
			s->seen_ns[i] = now;
			continue;
		}
		if (hkv_seg_state(e) != HKV_SEG_OWNED || owner == 0 || owner > HKV_MAX_CLIENTS ||
		    !s->clients[owner].connected ||
		    now - s->seen_ns[i] < (uint64_t)HKV_SEG_IDLE_MS * 1000000ull)
			continue;
		idle = hkv_seg_make(HKV_SEG_IDLE, hkv_seg_class(e), owner, hkv_seg_epoch(e) + 1);
		if (__atomic_compare_exchange_n(&table[i], &e, idle, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			n++;
			e = idle;
			if (s->holder[i] == owner) /* idle, not stolen: its adopter may have it */
				s->held_entry[i] = idle;
		}
		s->seen_entry[i] = e;
		s->seen_ns[i] = now;
	}
	if (n)
		hkv_debug("store: %u segment(s) idle (owners stopped allocating there)", n);
	s->idled += n;
}

void hkv_store_tick(struct hkv_store *s)
{
	uint64_t now = hkv_now_ns();

	for (uint32_t id = 1; id <= HKV_MAX_CLIENTS; id++) {
		if (s->clients[id].ticket_expiry_ns && s->clients[id].ticket_expiry_ns < now) {
			s->clients[id].ticket_expiry_ns = 0;
			s->npending--;
		}
		if (s->clients[id].connected && s->clients[id].ngrants)
			sweep_client(s, id);
	}
}

/*
 * Cluster: visit every item the index names whose block is sane (class,
 * place, header) and LIVE or PENDING; stop at the first non-zero answer.
 */
int hkv_store_walk(struct hkv_store *s, hkv_store_visit_fn fn, void *arg)
{
	const struct hkv_geometry *g = s->geom;
	uint8_t *base = s->region.base;
	uint64_t *slots = (uint64_t *)(base + g->index_off);
	uint64_t nslots = g->nbuckets * HKV_BUCKET_SLOTS;
	uint64_t data_end = g->data_off + (uint64_t)g->nsegs * g->seg_size;

	for (uint64_t i = 0; i < nslots; i++) {
		uint64_t sl = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE), off, rel, meta;
		uint32_t cls, len;
		struct hkv_block_hdr *h;
		enum hkv_block_state st;
		int ret;

		if (!sl)
			continue;
		off = hkv_slot_off(sl);
		cls = hkv_slot_class(sl);
		if (cls >= g->nclasses || off < g->data_off || off >= data_end)
			continue; /* garbage: readers ignore it too */
		len = g->class_size[cls];
		rel = off - g->data_off;
		if (rel % g->seg_size + len > g->seg_size || (rel % g->seg_size) % len)
			continue;
		h = (struct hkv_block_hdr *)(base + off);
		meta = __atomic_load_n(&h->meta, __ATOMIC_ACQUIRE);
		st = hkv_meta_state(meta);
		if ((st != HKV_BLK_LIVE && st != HKV_BLK_PENDING) || hkv_meta_class(meta) != cls ||
		    sizeof(*h) + h->klen + (uint64_t)h->vlen > len)
			continue;
		ret = fn(arg, &slots[i], sl, h, meta);
		if (ret)
			return ret;
	}
	return 0;
}

struct purge_arg {
	struct hkv_store *s;
	int (*keep)(void *arg, const void *key, size_t klen);
	void *arg;
	uint64_t dropped;
};

static int purge_one(void *arg, uint64_t *slot, uint64_t sl, struct hkv_block_hdr *h,
		     uint64_t meta)
{
	struct purge_arg *pa = arg;
	const struct hkv_geometry *g = pa->s->geom;
	enum hkv_block_state st = hkv_meta_state(meta);
	uint32_t cls = hkv_slot_class(sl), len = g->class_size[cls], blk;
	uint64_t rel = hkv_slot_off(sl) - g->data_off, *word;

	if (pa->keep(pa->arg, h + 1, h->klen))
		return 0;
	if (!__atomic_compare_exchange_n(slot, &sl, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return 0;
	/* a PENDING one (its writer cut off by the fence) never committed */
	if (!__atomic_compare_exchange_n(&h->meta, &meta,
					 hkv_meta_make(HKV_BLK_OBSOLETE, cls, hkv_meta_gen(meta)) |
						 (st == HKV_BLK_PENDING ? HKV_META_ABORTED : 0),
					 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return 0; /* someone else retired it: theirs to free */
	blk = (uint32_t)((rel % g->seg_size) / len);
	word = (uint64_t *)((uint8_t *)pa->s->region.base + g->bitmap_off +
			    (rel / g->seg_size) * g->bitmap_bytes + (uint64_t)(blk / 64) * 8);
	__atomic_fetch_or(word, 1ull << (blk % 64), __ATOMIC_ACQ_REL);
	pa->dropped++;
	return 0;
}

/*
 * Cluster: drop every item whose key keep() refuses (live ones as a delete
 * does; pending ones - inserts the fence cut off - as an abort does)
 * (slot -> 0, meta LIVE -> OBSOLETE with its generation, the block's bit set
 * so that an adopter of its segment reuses it). Called while no client can
 * reach the keys it drops (fenced, or partitions no client routes here),
 * with the atomics a client's delete uses, so clients working on other
 * keys (and an shm client that has not noticed a fence yet) are safe.
 */
uint64_t hkv_store_purge(struct hkv_store *s, int (*keep)(void *arg, const void *key, size_t klen),
			 void *arg)
{
	struct purge_arg pa = {s, keep, arg, 0};

	hkv_store_walk(s, purge_one, &pa);
	return pa.dropped;
}
