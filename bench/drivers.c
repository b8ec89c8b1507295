/* drivers.c - see drivers.h. */
#include "bench/drivers.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/etcd.h"
#include "hatchkv.h"

/* ---- hatchkv -------------------------------------------------------------- */

struct hkv_driver {
	struct driver base;
	struct hkv_client *c;
};

static int hkvd_read(struct driver *d, const char *key, size_t klen, uint8_t *buf, size_t cap,
		     size_t *vlen)
{
	return hkv_get(((struct hkv_driver *)d)->c, key, klen, buf, cap, vlen, NULL);
}

static int hkvd_write(struct driver *d, const char *key, size_t klen, const uint8_t *val,
		      size_t vlen)
{
	return hkv_set(((struct hkv_driver *)d)->c, key, klen, val, vlen, NULL);
}

static int hkvd_del(struct driver *d, const char *key, size_t klen)
{
	return hkv_delete(((struct hkv_driver *)d)->c, key, klen);
}

static int hkvd_mread(struct driver *d, const char *const *keys, const size_t *klens, int n,
		      uint8_t *const *bufs, size_t cap, int *status)
{
	struct hkv_mget_item it[64];
	int ret;

	for (int i = 0; i < n; i++)
		it[i] = (struct hkv_mget_item){.key = keys[i], .klen = klens[i], .buf = bufs[i],
					       .cap = cap};
	ret = hkv_mget(((struct hkv_driver *)d)->c, it, (size_t)n);
	for (int i = 0; i < n; i++)
		status[i] = ret ? ret : it[i].status;
	return ret;
}

static void hkvd_counters(struct driver *d, struct drv_counters *out)
{
	hkv_client_totals(((struct hkv_driver *)d)->c, &out->round_trips, &out->bytes_read,
			  &out->bytes_written);
	hkv_client_wrs(((struct hkv_driver *)d)->c, &out->wrs, &out->atomics, &out->signaled);
}

static void hkvd_stats(struct driver *d, struct hkv_client_stats *out)
{
	hkv_client_stats(((struct hkv_driver *)d)->c, out);
}

static void hkvd_close(struct driver *d)
{
	hkv_close(((struct hkv_driver *)d)->c);
	free(d);
}

static const struct driver_ops hkv_driver_ops = {"hatchkv",  hkvd_read,     hkvd_write,
						 hkvd_del,   hkvd_mread,    hkvd_counters,
						 hkvd_stats, hkvd_close};

_Atomic unsigned driver_hatchkv_replicas_seen;

struct driver *driver_open_hatchkv(const struct hkv_config *cfg)
{
	struct hkv_driver *d = calloc(1, sizeof(*d));
	int ret = d ? hkv_open(cfg, &d->c) : -ENOMEM;

	if (ret) {
		fprintf(stderr, "hatchkv-bench: cannot connect: %s\n", hkv_strerror(ret));
		free(d);
		return NULL;
	}
	d->base.ops = &hkv_driver_ops;
	{
		struct hkv_server_info si;

		hkv_server_info(d->c, &si);
		driver_hatchkv_replicas_seen = si.replicas;
	}
	return &d->base;
}

/* A cluster's etcd options (--etcd-*) into cfg. */
static int etcd_config(struct hkv_config *cfg, const struct hkv_etcd_sec *e)
{
	int ret = 0;

	if (!ret && e->cacert)
		ret = hkv_config_set_etcd(cfg, "cacert", e->cacert);
	if (!ret && e->cert)
		ret = hkv_config_set_etcd(cfg, "cert", e->cert);
	if (!ret && e->key)
		ret = hkv_config_set_etcd(cfg, "key", e->key);
	if (!ret && e->user)
		ret = hkv_config_set_etcd(cfg, "user", e->user);
	if (!ret && e->password_file)
		ret = hkv_config_set_etcd(cfg, "password-file", e->password_file);
	if (!ret && e->insecure)
		ret = hkv_config_set_etcd(cfg, "insecure", NULL);
	return ret;
}

int driver_hatchkv_replicas(const char *uris)
{
	int n = 1;

	if (uris && !strncmp(uris, "etcd://", 7)) /* one cluster, however many endpoints */
		return 1;
	for (const char *p = uris; p && *p; p++)
		n += *p == ',';
	return n;
}

struct hkv_config *driver_hatchkv_config(const char *uris, const char *token_file, size_t keys,
					  const struct hkv_etcd_sec *etcd)
{
	struct hkv_config *cfg = hkv_config_new();
	int n = driver_hatchkv_replicas(uris), ret = cfg ? 0 : -ENOMEM;
	const char *p = uris;

	/* a list: one replicated handle over them, in order (primary .. decider) */
	if (!ret && n > 1)
		ret = hkv_config_set_replicas(cfg, n);
	for (int i = 0; i < n && !ret; i++) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		char uri[512];

		if (len >= sizeof(uri)) {
			ret = -ENAMETOOLONG;
			break;
		}
		memcpy(uri, p, len);
		uri[len] = 0;
		ret = hkv_config_add_server(cfg, uri);
		p = comma ? comma + 1 : p + len;
	}
	if (!ret && etcd && !(ret = etcd_config(cfg, etcd)) &&
	    !(ret = hkv_config_set_token_file(cfg, token_file)) &&
	    !(ret = hkv_config_set_cache_entries(cfg, keys * 2 > 262144 ? keys * 2 : 262144)))
		return cfg;
	fprintf(stderr, "hatchkv-bench: bad server list '%s' (%d server(s)) or token file '%s': %s\n",
		uris, n, token_file, hkv_strerror(ret));
	hkv_config_free(cfg);
	return NULL;
}

/* ---- memcached text protocol -------------------------------------------------- */

struct mc_driver {
	struct driver base;
	int fd;
	char *rbuf; /* buffered reader */
	size_t rlen, roff, rcap;
	char *wbuf;
	size_t wcap;
};

static int mc_fill(struct mc_driver *m)
{
	ssize_t n;

	if (m->roff) {
		memmove(m->rbuf, m->rbuf + m->roff, m->rlen - m->roff);
		m->rlen -= m->roff;
		m->roff = 0;
	}
	if (m->rlen == m->rcap)
		return -EMSGSIZE;
	n = read(m->fd, m->rbuf + m->rlen, m->rcap - m->rlen);
	if (n <= 0)
		return n ? -errno : -ECONNRESET;
	m->rlen += (size_t)n;
	return 0;
}

/* Next line (without \r\n); valid until the next read. */
static int mc_line(struct mc_driver *m, char **line)
{
	for (;;) {
		char *nl = memchr(m->rbuf + m->roff, '\n', m->rlen - m->roff);
		int ret;

		if (nl) {
			*line = m->rbuf + m->roff;
			if (nl > *line && nl[-1] == '\r')
				nl[-1] = 0;
			*nl = 0;
			m->roff = (size_t)(nl - m->rbuf) + 1;
			return 0;
		}
		if ((ret = mc_fill(m)))
			return ret;
	}
}

static int mc_bytes(struct mc_driver *m, uint8_t *dst, size_t n)
{
	while (m->rlen - m->roff < n) {
		int ret = mc_fill(m);

		if (ret)
			return ret;
	}
	if (dst)
		memcpy(dst, m->rbuf + m->roff, n);
	m->roff += n;
	return 0;
}

static int mc_send(struct mc_driver *m, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = write(m->fd, c, n);

		if (w <= 0)
			return -errno;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static int mcd_read(struct driver *d, const char *key, size_t klen, uint8_t *buf, size_t cap,
		    size_t *vlen)
{
	struct mc_driver *m = (struct mc_driver *)d;
	unsigned long long bytes;
	unsigned flags;
	char *line;
	int n = snprintf(m->wbuf, m->wcap, "get %.*s\r\n", (int)klen, key), ret;

	if ((ret = mc_send(m, m->wbuf, (size_t)n)) || (ret = mc_line(m, &line)))
		return ret;
	if (!strcmp(line, "END"))
		return HKV_ENOTFOUND;
	if (sscanf(line, "VALUE %*s %u %llu", &flags, &bytes) != 2)
		return HKV_EPROTO;
	*vlen = (size_t)bytes;
	if ((ret = mc_bytes(m, bytes <= cap ? buf : NULL, (size_t)bytes)) || (ret = mc_bytes(m, NULL, 2)))
		return ret;
	if ((ret = mc_line(m, &line)))
		return ret;
	return strcmp(line, "END") ? HKV_EPROTO : bytes <= cap ? 0 : -ENOSPC;
}

static int mcd_write(struct driver *d, const char *key, size_t klen, const uint8_t *val,
		     size_t vlen)
{
	struct mc_driver *m = (struct mc_driver *)d;
	char *line;
	int n = snprintf(m->wbuf, m->wcap, "set %.*s 0 0 %zu\r\n", (int)klen, key, vlen), ret;

	if ((size_t)n + vlen + 2 > m->wcap)
		return HKV_ETOOBIG;
	memcpy(m->wbuf + n, val, vlen);
	memcpy(m->wbuf + n + vlen, "\r\n", 2);
	if ((ret = mc_send(m, m->wbuf, (size_t)n + vlen + 2)) || (ret = mc_line(m, &line)))
		return ret;
	return strcmp(line, "STORED") ? HKV_EPROTO : 0;
}

static int mcd_del(struct driver *d, const char *key, size_t klen)
{
	struct mc_driver *m = (struct mc_driver *)d;
	char *line;
	int n = snprintf(m->wbuf, m->wcap, "delete %.*s\r\n", (int)klen, key), ret;

	if ((ret = mc_send(m, m->wbuf, (size_t)n)) || (ret = mc_line(m, &line)))
		return ret;
	if (!strcmp(line, "NOT_FOUND"))
		return HKV_ENOTFOUND;
	return strcmp(line, "DELETED") ? HKV_EPROTO : 0;
}

/* "get k1 k2 ...": hits come back in request order, misses are skipped. */
static int mcd_mread(struct driver *d, const char *const *keys, const size_t *klens, int n,
		     uint8_t *const *bufs, size_t cap, int *status)
{
	struct mc_driver *m = (struct mc_driver *)d;
	size_t off = 3;
	int next = 0, ret;
	char *line;

	memcpy(m->wbuf, "get", 3);
	for (int i = 0; i < n; i++) {
		m->wbuf[off++] = ' ';
		memcpy(m->wbuf + off, keys[i], klens[i]);
		off += klens[i];
		status[i] = HKV_ENOTFOUND;
	}
	memcpy(m->wbuf + off, "\r\n", 2);
	if ((ret = mc_send(m, m->wbuf, off + 2)))
		return ret;
	for (;;) {
		char key[256];
		unsigned long long bytes;
		unsigned flags;

		if ((ret = mc_line(m, &line)))
			return ret;
		if (!strcmp(line, "END"))
			return 0;
		if (sscanf(line, "VALUE %255s %u %llu", key, &flags, &bytes) != 3)
			return HKV_EPROTO;
		while (next < n && (klens[next] != strlen(key) || memcmp(keys[next], key, klens[next])))
			next++;
		if ((ret = mc_bytes(m, next < n && bytes <= cap ? bufs[next] : NULL, (size_t)bytes)) ||
		    (ret = mc_bytes(m, NULL, 2)))
			return ret;
		if (next < n)
			status[next++] = bytes <= cap ? 0 : -ENOSPC;
	}
}

static void mcd_counters(struct driver *d, struct drv_counters *out)
{
	memset(out, 0, sizeof(*out));
}

static void mcd_close(struct driver *d)
{
	struct mc_driver *m = (struct mc_driver *)d;

	close(m->fd);
	free(m->rbuf);
	free(m->wbuf);
	free(m);
}

static const struct driver_ops mc_driver_ops = {"memcached", mcd_read, mcd_write,
						mcd_del,      mcd_mread, mcd_counters,
						NULL,         mcd_close};

struct driver *driver_open_memcached(const char *hostport)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	char host[256], *colon;
	struct mc_driver *m;
	int one = 1;

	snprintf(host, sizeof(host), "%s", hostport);
	colon = strrchr(host, ':');
	if (!colon)
		return NULL;
	*colon = 0;
	if (getaddrinfo(host, colon + 1, &hints, &ai))
		return NULL;
	m = calloc(1, sizeof(*m));
	m->rcap = m->wcap = 2u << 20;
	m->rbuf = malloc(m->rcap);
	m->wbuf = malloc(m->wcap);
	m->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (m->fd < 0 || connect(m->fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		fprintf(stderr, "hatchkv-bench: cannot connect to memcached at %s: %s\n", hostport,
			strerror(errno));
		freeaddrinfo(ai);
		if (m->fd >= 0)
			close(m->fd);
		free(m->rbuf);
		free(m->wbuf);
		free(m);
		return NULL;
	}
	freeaddrinfo(ai);
	setsockopt(m->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	m->base.ops = &mc_driver_ops;
	return &m->base;
}
