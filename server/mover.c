/* mover.c - a store-mode move's copy (see mover.h). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "client/copy.h"
#include "common/cluster_map.h"
#include "common/hkv_alloc.h"
#include "common/layout.h"
#include "common/log.h"
#include "hatchkv.h"
#include "server/mover.h"
#include "server/store.h"

#define MOVE_TIMEOUT_MS 5000

struct copy {
	const struct hkv_cmap *map, *cur;
	const struct hkv_cmember *homes;
	const char *self, *token;
	uint64_t max_value;
	struct hkv_client **h; /* per name of map, opened on first use */
	uint32_t now;
	struct hkv_move_stats *st;
};

static int home_handle(struct copy *cp, uint32_t i, struct hkv_client **out)
{
	struct hkv_config *cfg;
	int ret;

	if (cp->h[i]) {
		*out = cp->h[i];
		return 0;
	}
	if (!cp->homes[i].endpoint[0])
		return -ENOENT; /* (a name we hold no member record of) */
	cfg = hkv_config_new();
	if (!cfg)
		return -ENOMEM;
	ret = hkv_config_add_server(cfg, cp->homes[i].endpoint);
	if (!ret)
		ret = hkv_config_set_token(cfg, cp->token);
	if (!ret)
		ret = hkv_config_set_timeout_ms(cfg, MOVE_TIMEOUT_MS);
	if (!ret)
		ret = hkv_config_set_max_value(cfg, cp->max_value);
	if (!ret)
		ret = hkv_open(cfg, &cp->h[i]);
	hkv_config_free(cfg);
	if (ret) {
		hkv_err("cluster: cannot reach new home %s (%s) to copy into: %s", cp->homes[i].id,
			cp->homes[i].endpoint, hkv_strerror(ret));
		return ret;
	}
	*out = cp->h[i];
	return 0;
}

static int copy_one(void *arg, uint64_t *slot, uint64_t sl, struct hkv_block_hdr *h,
		    uint64_t meta)
{
	struct copy *cp = arg;
	const uint8_t *key = (const uint8_t *)(h + 1);
	struct hkv_client *c;
	uint32_t p, i;
	int ret;

	(void)slot;
	(void)sl;
	if (hkv_meta_state(meta) != HKV_BLK_LIVE)
		return 0; /* an insert the fence cut off: never acknowledged */
	p = hkv_cmap_partition(cp->map, key, h->klen);
	if (!strcmp(hkv_cmap_server(cp->map, p, 0), cp->self) ||
	    strcmp(hkv_cmap_server(cp->cur, p, 0), cp->self))
		return 0; /* staying, or never ours (a stray: not ours to hand on) */
	if (h->sum != hkv_block_sum(h, key)) {
		hkv_err("cluster: a live item fails its CRC during a move's copy");
		return HKV_ECORRUPT;
	}
	if (h->exptime && h->exptime <= cp->now) {
		cp->st->expired++;
		return 0;
	}
	i = cp->map->repl[p * cp->map->replicas];
	ret = home_handle(cp, i, &c);
	if (!ret)
		ret = hkv_put_copy(c, key, h->klen, key + h->klen, h->vlen, h->flags, h->exptime,
				   h->wid, h->pred); /* a cas token from before the move still matches */
	if (ret) {
		hkv_err("cluster: copying an item to %s: %s", cp->map->names[i], hkv_strerror(ret));
		return ret;
	}
	cp->st->items++;
	cp->st->bytes += (uint64_t)h->klen + h->vlen;
	return 0;
}

int hkv_move_copy(struct hkv_store *s, const struct hkv_cmap *cur, const struct hkv_cmap *map,
		  const struct hkv_cmember *homes, const char *self, const char *token,
		  uint64_t max_value, struct hkv_move_stats *st)
{
	struct copy cp = {map, cur, homes, self, token, max_value, NULL, (uint32_t)time(NULL), st};
	int ret;

	memset(st, 0, sizeof(*st));
	cp.h = hkv_calloc(map->nnames + 1, sizeof(*cp.h));
	if (!cp.h)
		return -ENOMEM;
	ret = hkv_store_walk(s, copy_one, &cp);
	for (uint32_t i = 0; i < map->nnames; i++)
		if (cp.h[i])
			hkv_close(cp.h[i]); /* our blocks there stay: they hold the copies */
	hkv_free(cp.h);
	return ret;
}
