/* store.c - see store.h. */
#include "server/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "common/ctl_auth.h"
#include "common/failpoint.h"
#include "common/hkv_alloc.h"
#include "common/log.h"
#include "common/transport_int.h"

#define TICKET_TTL_NS ((uint64_t)HKV_TICKET_TTL_S * 1000000000ull)

/* Does the data plane hand out memory windows (and so take GRANTs)? */
static int windows_on(const struct hkv_store *s)
{
	return s->data && (hkv_listener_region(s->data)->access & HKV_ACCESS_WINDOWS);
}

/*
 * The geometry of a --memory-file region is also kept in PATH.geom, a file
 * of the server's own (0600) that no client can write: a warm restart whose
 * header a writer damaged (shm, verbs --no-windows) rebuilds the header
 * from it (store_reopen). Written to a temporary name, synced, renamed.
 */
static void geom_path(char *out, size_t cap, const char *memory_file, const char *suffix)
{
	snprintf(out, cap, "%s.geom%s", memory_file, suffix);
}

static int geom_save(const char *memory_file, const struct hkv_geometry *g)
{
	char path[4096], tmp[4096];
	int fd, ret = 0;

	geom_path(path, sizeof(path), memory_file, "");
	geom_path(tmp, sizeof(tmp), memory_file, ".tmp");
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0 || write(fd, g, sizeof(*g)) != (ssize_t)sizeof(*g) || fsync(fd) ||
	    rename(tmp, path))
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (ret) {
		hkv_err("store: cannot keep the region's geometry in %s: %s", path, strerror(-ret));
		unlink(tmp);
	}
	return ret;
}

/* PATH.geom, if it holds a geometry that validates for a region of len bytes. */
static int geom_load(const char *memory_file, uint64_t len, struct hkv_geometry *g)
{
	char path[4096];
	struct stat st;
	int fd, ret;

	geom_path(path, sizeof(path), memory_file, "");
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) || st.st_uid != geteuid() || (st.st_mode & 077)) {
		hkv_warn("store: %s is not this user's own 0600 file: not used", path);
		close(fd);
		return -EPERM;
	}
	ret = read(fd, g, sizeof(*g)) == (ssize_t)sizeof(*g) ? 0 : HKV_ECORRUPT;
	close(fd);
	return ret ? ret : hkv_geometry_check(g, len);
}

/* Do the segment table and the index fit geometry g? A header is rebuilt
 * only over a region whose structures still make sense under it. */
static int structures_fit(const struct hkv_store *s, const struct hkv_geometry *g,
			  uint64_t *bad_segs, uint64_t *bad_slots)
{
	const uint8_t *base = s->region.base;
	const uint64_t *tab = (const uint64_t *)(base + g->seg_table_off);
	const uint64_t *slot = (const uint64_t *)(base + g->index_off);
	uint64_t data_end = g->data_off + (uint64_t)g->nsegs * g->seg_size;

	*bad_segs = *bad_slots = 0;
	for (uint32_t i = 0; i < g->nsegs; i++) {
		uint32_t st = hkv_seg_state(tab[i]);

		*bad_segs += st > HKV_SEG_DRAINING ||
			     (st != HKV_SEG_FREE && hkv_seg_class(tab[i]) >= g->nclasses);
	}
	for (uint64_t i = 0; i < g->nbuckets * HKV_BUCKET_SLOTS; i++) {
		uint64_t off = hkv_slot_off(slot[i]);

		*bad_slots += slot[i] && (off < g->data_off || off >= data_end ||
					  hkv_slot_class(slot[i]) >= g->nclasses);
	}
	return !*bad_segs && !*bad_slots;
}

/* A fresh region: lay out the header. */
static int store_format(struct hkv_store *s, const struct hkv_store_opts *o)
{
	struct hkv_geometry g;
	uint32_t seg = o->seg_size ? o->seg_size : hkv_seg_size_for(s->region.length);
	int ret = hkv_geometry_init(&g, s->region.length, seg, o->index_slots,
				    o->cache_mode ? HKV_GEOM_F_CACHE : 0, o->growth);

	if (ret) {
		hkv_err("store: --memory %llu is too small for --segment-size %u (or a bad "
			"--growth-factor)", (unsigned long long)o->memory, seg);
		return ret;
	}
	if (getrandom(&g.boot_id, sizeof(g.boot_id), 0) != sizeof(g.boot_id) ||
	    (!o->hash_key && getrandom(g.hash_key, sizeof(g.hash_key), 0) != sizeof(g.hash_key)))
		return -errno;
	if (o->hash_key)
		memcpy(g.hash_key, o->hash_key, sizeof(g.hash_key));
	hkv_geometry_seal(&g);
	s->geom_own = g;
	memcpy(s->region.base, &g, sizeof(g));
	return o->memory_file ? geom_save(o->memory_file, &g) : 0;
}

/*
 * Warm restart from --memory-file: the header must validate (a torn or
 * foreign header, or another layout version, is refused, never served). The
 * clients of the old process are gone: what they held or never published
 * is free again (hkv_slab_rebuild).
 */
static int store_reopen(struct hkv_store *s, const struct hkv_store_opts *o)
{
	const struct hkv_geometry *hdr = s->region.base;
	struct hkv_geometry kept;
	const uint64_t *slot;
	uint64_t entries = 0, bad_segs, bad_slots;
	int ret = hkv_geometry_check(hdr, s->region.length), have_kept;

	if (ret == HKV_EPROTO) {
		hkv_err("store: %s has region layout version %u; this server writes version %u. "
			"Refusing to serve it.", o->memory_file, hdr->version, HKV_LAYOUT_VERSION);
		return ret;
	}
	have_kept = !geom_load(o->memory_file, s->region.length, &kept);
	if (ret && have_kept) {
		/* a writer's bytes over the header (or a torn write of it): the
		 * server's own record says what it was */
		if (!structures_fit(s, &kept, &bad_segs, &bad_slots)) {
			hkv_err("store: %s: region header fails validation, and under the geometry "
				"kept in %s.geom %llu segment table entries and %llu index slots make "
				"no sense. Refusing to serve it; move both files away to start empty.",
				o->memory_file, o->memory_file, (unsigned long long)bad_segs,
				(unsigned long long)bad_slots);
			return HKV_ECORRUPT;
		}
		hkv_warn("store: %s: region header fails validation; rebuilt from %s.geom (the "
			 "segment table and the index fit it)", o->memory_file, o->memory_file);
		memcpy(s->region.base, &kept, sizeof(kept));
		ret = 0;
	} else if (ret) {
		hkv_err("store: %s: region header fails validation (torn, corrupt or not a hatchkv "
			"region) and there is no %s.geom to rebuild it from. Refusing to serve it; "
			"move the file away to start empty.", o->memory_file, o->memory_file);
		return ret;
	} else if (have_kept && memcmp(hdr, &kept, sizeof(kept))) {
		/* both validate and differ: a writer sealed a header of its own */
		hkv_warn("store: %s: region header differs from %s.geom; the server's record wins",
			 o->memory_file, o->memory_file);
		memcpy(s->region.base, &kept, sizeof(kept));
	}
	s->geom_own = *hdr;
	if (!have_kept && (ret = geom_save(o->memory_file, &s->geom_own)))
		return ret; /* (a file from before PATH.geom: keep it from now on) */
	if ((ret = hkv_slab_rebuild(s)))
		return ret;
	slot = (const uint64_t *)((uint8_t *)s->region.base + s->geom->index_off);
	for (uint64_t i = 0; i < s->geom->nbuckets * HKV_BUCKET_SLOTS; i++)
		entries += slot[i] != 0;
	hkv_info("store: warm restart from %s: %llu index entries", o->memory_file,
		 (unsigned long long)entries);
	return 0;
}

int hkv_store_init(struct hkv_store *s, const struct hkv_store_opts *o)
{
	const struct hkv_geometry *g;
	int existed = 0, ret;

	memset(s, 0, sizeof(*s));
	s->region.fd = -1;
	s->slab.drain_seg = -1;
	if (hkv_failpoints_init()) /* (HKV_STALL: tests' stall points) */
		return -EINVAL;
	s->clients = hkv_calloc(HKV_MAX_CLIENTS + 1, sizeof(*s->clients));
	if (!s->clients || hkv_satom_init(&s->atom, NULL)) {
		hkv_free(s->clients);
		return -ENOMEM;
	}
	s->max_clients = o->max_clients;
	ret = hkv_region_create(&s->region, o->memory, o->memory_file, &existed);
	if (ret) {
		hkv_err("store: cannot create a %llu-byte region: %s",
			(unsigned long long)o->memory, strerror(-ret));
		hkv_satom_fini(&s->atom);
		hkv_free(s->clients);
		return ret;
	}
	s->atom.local = s->region.base;
	s->geom = &s->geom_own;
	ret = existed ? store_reopen(s, o) : store_format(s, o);
	if (ret) {
		hkv_store_fini(s);
		return ret;
	}
	s->next_id = 1;
	g = s->geom;
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
	hkv_satom_fini(&s->atom);
	hkv_slab_fini(s);
	hkv_region_destroy(&s->region);
	hkv_free(s->clients);
	s->clients = NULL;
}

/* The source's pending count (made if absent and create); NULL if the
 * table has no room for it near its hash. */
static struct hkv_pend_src *pend_of(struct hkv_store *s, uint64_t key, int create)
{
	uint64_t h = hkv_hash64(&key, sizeof(key));
	struct hkv_pend_src *free_e = NULL;

	for (uint32_t i = 0; i < HKV_PEND_PROBES; i++) {
		struct hkv_pend_src *e = &s->pend_src[(h + i) & (HKV_PEND_SOURCES - 1)];

		if (e->n && e->key == key)
			return e;
		if (!e->n && !free_e)
			free_e = e;
	}
	if (free_e && create)
		free_e->key = key;
	return create ? free_e : NULL;
}

/* A pending ticket ends (redeemed, expired, replaced). */
static void pend_end(struct hkv_store *s, struct hkv_client_rec *c)
{
	struct hkv_pend_src *e = pend_of(s, c->source, 0);

	if (e)
		e->n--;
	s->npending_ro -= c->readonly;
	s->npending--;
	c->ticket_expiry_ns = 0;
}

/* Is id's claim-intent record another writer's (connected or holding a
 * ticket)? A writer that left, fenced, lands nothing there any more. */
static int intent_taken(const struct hkv_store *s, uint32_t id, uint64_t now)
{
	uint32_t o;

	if (!s->geom->nintents)
		return 0;
	o = s->intent_owner[id & (s->geom->nintents - 1)];
	return o && o != id && !s->clients[o].readonly &&
	       (s->clients[o].connected || s->clients[o].ticket_expiry_ns >= now);
}

int hkv_store_intent_covers(const struct hkv_store *s, uint64_t word_off)
{
	const uint64_t *rec;

	if (!s->geom->nintents)
		return 1; /* (a region made before intents: nobody can tell) */
	rec = (const uint64_t *)((const uint8_t *)s->region.base + s->geom->intent_off);
	for (uint32_t i = 0; i < s->geom->nintents; i++) {
		uint32_t o = s->intent_owner[i];

		if (__atomic_load_n(&rec[i], __ATOMIC_ACQUIRE) == word_off && o &&
		    s->clients[o].connected && !s->clients[o].readonly)
			return 1;
	}
	return 0;
}

int hkv_store_admit(struct hkv_store *s, struct hkv_ctl_welcome *w, int readonly,
		    uint64_t source, const uint8_t req_key[32])
{
	uint64_t now = hkv_now_ns();
	uint32_t quarter = (s->max_clients ? s->max_clients : HKV_MAX_CLIENTS) / 4;
	struct hkv_pend_src *e;

	/* (a writer needs one of the claim-intent records too: no one source
	 * may hold more than a quarter of them in tickets either) */
	if (!readonly && s->geom->nintents && quarter > s->geom->nintents / 4)
		quarter = s->geom->nintents / 4;

	if (s->fenced)
		return HKV_EDISCONNECTED;
	/* admitted but not connected yet count too (expired tickets until the tick) */
	if (s->max_clients && s->nconnected + s->npending >= s->max_clients)
		return -EUSERS;
	if (readonly && s->npending_ro >= (quarter > 2 ? quarter : 2)) {
		hkv_warn_limited("store: %u read-only clients admitted and not connected; refusing "
				 "more for now", s->npending_ro);
		return -EUSERS;
	}
	e = pend_of(s, source, 1);
	if (!e || e->n >= (quarter > 8 ? quarter : 8)) {
		hkv_warn_limited("store: a source holds %u admissions not redeemed; refusing its "
				 "next for now", e ? e->n : 0);
		return -EUSERS;
	}

	for (uint32_t tries = 0; tries < HKV_MAX_CLIENTS; tries++) {
		uint32_t id = s->next_id;
		struct hkv_client_rec *c = &s->clients[id];

		s->next_id = id % HKV_MAX_CLIENTS + 1; /* round robin: ids are reused late */
		if (c->connected || c->ticket_expiry_ns > now)
			continue;
		if (!readonly && intent_taken(s, id, now))
			continue;
		if (c->ticket_expiry_ns) /* expired, not yet seen by the tick */
			pend_end(s, c);
		if (getrandom(c->ticket, HKV_TICKET_LEN, 0) != HKV_TICKET_LEN)
			return -errno;
		e = pend_of(s, source, 1); /* (pend_end may have emptied it) */
		e->key = source;
		e->n++;
		s->npending++;
		s->npending_ro += !!readonly;
		c->ticket_expiry_ns = now + TICKET_TTL_NS;
		c->readonly = !!readonly;
		if (!readonly && s->geom->nintents) { /* its claim-intent record, emptied */
			s->intent_owner[id & (s->geom->nintents - 1)] = (uint16_t)id;
			__atomic_store_n((uint64_t *)((uint8_t *)s->region.base +
						      hkv_intent_rec(s->geom, id)),
					 0,
					 __ATOMIC_RELEASE);
		}
		c->source = source;
		memcpy(c->req_key, req_key, sizeof(c->req_key));
		c->req_seq = 0;
		memset(w, 0, sizeof(*w));
		w->client_id = id;
		memcpy(w->ticket, c->ticket, HKV_TICKET_LEN);
		w->flags = HKV_WELCOME_F_GEOM_SUM;
		w->geom_sum = s->geom_own.sum;
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
	if (h.client_id == 0 || h.client_id > HKV_MAX_CLIENTS) {
		s->stats.refused[HKV_REFUSED_TICKET]++;
		return HKV_EAUTH;
	}
	c = &s->clients[h.client_id];
	if (c->connected || c->ticket_expiry_ns < hkv_now_ns() || !ticket_equal(c->ticket, h.ticket)) {
		hkv_warn_limited("store: data connection with a bad or stale ticket (client %u) "
				 "refused", h.client_id);
		s->stats.refused[HKV_REFUSED_TICKET]++;
		return HKV_EAUTH;
	}
	pend_end(s, c);
	c->connected = 1;
	s->nconnected++;
	out->cookie = h.client_id;
	if (c->readonly) /* enforced by the NIC (a read-only MR), not by the client */
		out->access = HKV_ACCESS_READ;
	hkv_info("store: client %u connected (%u connected)", h.client_id, s->nconnected);
	return 0;
}

/*
 * The client's connection is gone, so nothing it posts can land any more
 * (the transport destroyed its queue pair first). Blocks it held come back
 * by the sweep (server/slab.c) once their stamps have stood long enough.
 */
void hkv_store_on_disconnect(void *arg, uint64_t cookie)
{
	struct hkv_store *s = arg;
	uint32_t id = (uint32_t)cookie;

	if (id == 0 || id > HKV_MAX_CLIENTS || !s->clients[id].connected)
		return;
	s->clients[id].connected = 0;
	memset(s->clients[id].ticket, 0, HKV_TICKET_LEN);
	sodium_memzero(s->clients[id].req_key, sizeof(s->clients[id].req_key));
	s->nconnected--;
	if (windows_on(s))
		hkv_info("store: client %u disconnected; memory windows bound: %d", id,
			 hkv_listener_nwindows(s->data));
	else
		hkv_info("store: client %u disconnected", id);
}

int hkv_store_request_ok(struct hkv_store *s, uint32_t id, uint64_t seq, uint16_t type,
			 const void *body, size_t len)
{
	struct hkv_client_rec *c;

	if (id == 0 || id > HKV_MAX_CLIENTS)
		return 0;
	c = &s->clients[id];
	if ((!c->connected && !c->ticket_expiry_ns) || seq <= c->req_seq ||
	    !hkv_ctl_request_check(body, len, type, c->req_key))
		return 0;
	c->req_seq = seq;
	return 1;
}

/* A connected client (its request checked by hkv_store_request_ok): its
 * record, or NULL. */
static struct hkv_client_rec *client_of(struct hkv_store *s, uint32_t id)
{
	if (id == 0 || id > HKV_MAX_CLIENTS || !s->clients[id].connected)
		return NULL;
	return &s->clients[id];
}

int hkv_store_carve(struct hkv_store *s, const struct hkv_ctl_carve *req,
		    struct hkv_ctl_carved *out, const char **why)
{
	struct hkv_client_rec *c = client_of(s, req->client_id);
	int ret;

	memset(out, 0, sizeof(*out));
	*why = "not carved";
	if (!c) {
		*why = "not a connected client";
		return HKV_EAUTH;
	}
	if (c->readonly) {
		*why = "read-only client";
		return -EPERM;
	}
	if (s->fenced) {
		*why = "fenced";
		return HKV_EDISCONNECTED;
	}
	if (req->cls >= s->geom->nclasses) {
		*why = "no such size class";
		return -EINVAL;
	}
	ret = hkv_slab_carve(s, req->cls, req->keep_off, req->flags & HKV_CARVE_F_MOVE, &out->seg);
	if (ret == HKV_EFULL)
		*why = "no memory for that size class";
	else if (ret == -EINPROGRESS)
		*why = "a segment is being moved";
	out->cls = req->cls;
	return ret;
}

int hkv_store_grant(struct hkv_store *s, const struct hkv_ctl_grant *g,
		    struct hkv_ctl_granted *out, const char **why)
{
	const struct hkv_geometry *geo = s->geom;
	struct hkv_client_rec *c;
	int ret;

	memset(out, 0, sizeof(*out));
	*why = "not granted";
	if (!windows_on(s)) {
		*why = "this server does not use memory windows";
		return -EOPNOTSUPP;
	}
	c = client_of(s, g->client_id);
	if (!c) {
		*why = "not a connected client";
		return HKV_EAUTH;
	}
	if (g->seg != HKV_GRANT_BASE) {
		*why = "only base rights are granted (layout 3)";
		return -EINVAL;
	}
	out->seg = g->seg;
	out->access = HKV_ACCESS_READ;
	out->off = 0;
	out->len = s->region.length;
	/* ATOMIC everywhere but the header, so no client can break the geometry
	 * every other client validates; WRITE only over the data area (blocks) */
	ret = c->readonly ? 0
			  : hkv_listener_grant(s->data, g->client_id, geo->seg_table_off,
					       s->region.length - geo->seg_table_off,
					       HKV_ACCESS_ATOMIC, &out->atomic_rkey);
	if (!ret && !c->readonly)
		ret = hkv_listener_grant(s->data, g->client_id, geo->data_off,
					 s->region.length - geo->data_off, HKV_ACCESS_WRITE,
					 &out->write_rkey);
	if (!ret)
		ret = hkv_listener_grant(s->data, g->client_id, 0, s->region.length,
					 HKV_ACCESS_READ, &out->rkey);
	if (ret == -EINPROGRESS) { /* the control plane asks again, without waiting here */
		*why = "binding";
		return ret;
	}
	if (ret) {
		*why = ret == -EAGAIN ? "the data connection is not established"
				      : "binding the memory window failed";
		hkv_warn("store: client %u: windows for its base rights: %s", g->client_id,
			 hkv_strerror(ret));
		return ret;
	}
	hkv_debug("store: client %u granted its base rights, rkey 0x%x", g->client_id, out->rkey);
	return 0;
}

void hkv_store_clock(struct hkv_store *s)
{
	struct timespec ts;
	uint64_t now;

	clock_gettime(CLOCK_REALTIME, &ts);
	__atomic_store_n((uint64_t *)((uint8_t *)s->region.base + HKV_CLOCK_OFF),
			 (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u,
			 __ATOMIC_RELAXED);
	/* (a client reading the header meanwhile sees a bad sum and reads again) */
	if (!memcmp(s->region.base, &s->geom_own, sizeof(s->geom_own)))
		return;
	memcpy(s->region.base, &s->geom_own, sizeof(s->geom_own));
	s->header_restores++;
	now = hkv_now_ns();
	if (now - s->header_log_ns >= 5000000000ull || !s->header_log_ns) {
		s->header_log_ns = now;
		hkv_warn("store: the region header was overwritten (by a writer client); put back "
			 "from the server's copy (%llu times so far)",
			 (unsigned long long)s->header_restores);
	}
}

int hkv_store_fence(struct hkv_store *s, uint32_t id)
{
	int ret;

	if (id == 0 || id > HKV_MAX_CLIENTS || !s->clients[id].connected || !s->data)
		return 0;
	ret = hkv_listener_fence(s->data, id);
	if (!ret) {
		s->fences++;
		hkv_info("store: client %u fenced (a move needs blocks it has held unchanged past "
			 "the take-back time); it connects again at its next operation", id);
	}
	return ret;
}

void hkv_store_tick(struct hkv_store *s)
{
	uint64_t now = hkv_now_ns();

	for (uint32_t id = 1; id <= HKV_MAX_CLIENTS; id++) {
		if (s->clients[id].ticket_expiry_ns && s->clients[id].ticket_expiry_ns < now)
			pend_end(s, &s->clients[id]);
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

/* An item to drop: its slot as seen, its block and meta. */
struct purge_item {
	uint64_t *slot, sl, meta, *word, bit;
	struct hkv_block_hdr *h;
};

struct purge_arg {
	struct hkv_store *s;
	int (*keep)(void *arg, const void *key, size_t klen);
	void *arg;
	uint64_t dropped;
	struct purge_item v[HKV_SATOM_CHAIN];
	int n;
};

/*
 * Drop pa's batch: every meta -> OBSOLETE (aborted if PENDING), then for the
 * marks we won every slot -> 0, then their bits set; a chain each. The mark
 * first, as a client's remove: while our mark holds a block it is not
 * freed, so its slot value cannot come back, and the slot CAS removes
 * exactly the incarnation the walk saw however long the server stopped in
 * between (slot first, a stop past the ABA horizon could swing a later
 * incarnation out of a slot whose key the map still places here - a
 * fingerprint collision in the bucket - and leave it named by nobody).
 */
static void purge_batch(struct purge_arg *pa)
{
	struct hkv_satom_op op[HKV_SATOM_CHAIN];
	uint64_t *w[HKV_SATOM_CHAIN], m[HKV_SATOM_CHAIN];
	int n = pa->n, k = 0;

	pa->n = 0;
	hkv_failpoint("purge"); /* (the items read, not yet marked) */
	for (int i = 0; i < n; i++) {
		struct purge_item *it = &pa->v[i];

		/* a PENDING one (its writer cut off by the fence) never committed */
		op[i] = (struct hkv_satom_op){&it->h->meta, it->meta,
					      hkv_meta_make(HKV_BLK_OBSOLETE, hkv_slot_class(it->sl),
							    hkv_meta_gen(it->meta)) |
						      (hkv_meta_state(it->meta) == HKV_BLK_PENDING
							       ? HKV_META_ABORTED
							       : 0),
					      0, HKV_WR_CAS};
	}
	if (hkv_satom_run(&pa->s->atom, op, n))
		return;
	for (int i = 0; i < n; i++) {
		if (op[i].old != pa->v[i].meta)
			continue; /* someone else retired it: theirs to free */
		pa->v[k] = pa->v[i];
		op[k++] = (struct hkv_satom_op){pa->v[i].slot, pa->v[i].sl, 0, 0, HKV_WR_CAS};
	}
	if (hkv_satom_run(&pa->s->atom, op, k))
		return; /* (marked, maybe still named: left as a dead writer's) */
	for (int i = 0; i < k; i++) { /* out of the index either way: the slot moved on */
		w[i] = pa->v[i].word;
		m[i] = pa->v[i].bit;
	}
	hkv_satom_or(&pa->s->atom, w, m, k);
	pa->dropped += (uint64_t)k;
}

static int purge_one(void *arg, uint64_t *slot, uint64_t sl, struct hkv_block_hdr *h,
		     uint64_t meta)
{
	struct purge_arg *pa = arg;
	const struct hkv_geometry *g = pa->s->geom;
	uint32_t cls = hkv_slot_class(sl), len = g->class_size[cls], blk;
	uint64_t rel = hkv_slot_off(sl) - g->data_off;

	if (pa->keep(pa->arg, h + 1, h->klen))
		return 0;
	blk = (uint32_t)((rel % g->seg_size) / len);
	pa->v[pa->n++] = (struct purge_item){
		slot, sl, meta,
		(uint64_t *)((uint8_t *)pa->s->region.base + g->bitmap_off +
			     (rel / g->seg_size) * g->bitmap_bytes + (uint64_t)(blk / 64) * 8),
		1ull << (blk % 64), h};
	if (pa->n == HKV_SATOM_CHAIN)
		purge_batch(pa);
	return 0;
}

/*
 * Cluster: drop every item whose key keep() refuses (live ones as a delete
 * does; pending ones - inserts the fence cut off - as an abort does)
 * (meta LIVE -> OBSOLETE with its generation, slot -> 0, the block's bit set
 * so that any writer reuses it). Called while no client can
 * reach the keys it drops (fenced, or partitions no client routes here),
 * with the atomics a client's delete uses (through the NIC on verbs: the
 * store's atomics), so clients working on other keys (and an shm client
 * that has not noticed a fence yet) are safe. A batch of HKV_SATOM_CHAIN
 * items at a time: three round trips of the loopback per batch.
 */
uint64_t hkv_store_purge(struct hkv_store *s, int (*keep)(void *arg, const void *key, size_t klen),
			 void *arg)
{
	struct purge_arg pa = {.s = s, .keep = keep, .arg = arg};

	hkv_store_walk(s, purge_one, &pa);
	if (pa.n)
		purge_batch(&pa);
	return pa.dropped;
}
