/* config.c - struct hkv_config: what hkv_open() needs to know. */
#include <errno.h>
#include <string.h>

#include "client/client_int.h"
#include "common/hkv_alloc.h"

HKV_EXPORT uint64_t hkv_last_version(const struct hkv_client *c)
{
	return c->last_version;
}

HKV_EXPORT const char *hkv_version(void)
{
	return "0.1.0";
}

HKV_EXPORT struct hkv_config *hkv_config_new(void)
{
	struct hkv_config *cfg = hkv_calloc(1, sizeof(*cfg));

	if (!cfg) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&cfg->lock, NULL);
	cfg->timeout_ms = 5000;
	cfg->max_value = 1u << 20;
	cfg->cache_entries = 262144;
	cfg->retry_ms = HKV_RETRY_MS_DEFAULT;
	return cfg;
}

HKV_EXPORT void hkv_config_free(struct hkv_config *cfg)
{
	if (!cfg)
		return;
	for (int i = 0; i < cfg->nservers; i++)
		hkv_free(cfg->servers[i]);
	hkv_free(cfg->token);
	hkv_free(cfg->token_file);
	hkv_etcd_sec_free(&cfg->etcd);
	for (int i = 0; i < HKV_MAX_SERVERS; i++)
		hkv_config_free(cfg->repl_sub[i]);
	hkv_cache_unref(cfg->cache);
	hkv_caches_unref(cfg->cluster_caches);
	pthread_mutex_destroy(&cfg->lock);
	hkv_free(cfg);
}

static int set_string(char **dst, const char *src)
{
	char *s;

	if (!src)
		return -EINVAL;
	s = hkv_strdup(src);
	if (!s)
		return -ENOMEM;
	hkv_free(*dst);
	*dst = s;
	return 0;
}

HKV_EXPORT int hkv_config_add_server(struct hkv_config *cfg, const char *uri)
{
	if (!uri || (strncmp(uri, "shm:", 4) && strncmp(uri, "verbs://", 8) &&
		     strncmp(uri, "etcd://", 7)))
		return -EINVAL;
	if (cfg->nservers == HKV_MAX_SERVERS)
		return -ENOSPC;
	if (set_string(&cfg->servers[cfg->nservers], uri))
		return -ENOMEM;
	cfg->nservers++;
	return 0;
}

HKV_EXPORT int hkv_config_set_replicas(struct hkv_config *cfg, int r)
{
	if (r < 1 || r > 3)
		return -EINVAL;
	cfg->replicas = r;
	return 0;
}

HKV_EXPORT int hkv_config_set_token(struct hkv_config *cfg, const char *token)
{
	return set_string(&cfg->token, token);
}

HKV_EXPORT int hkv_config_set_token_file(struct hkv_config *cfg, const char *path)
{
	return set_string(&cfg->token_file, path);
}

HKV_EXPORT int hkv_config_set_retry_ms(struct hkv_config *cfg, int ms)
{
	if (!cfg || ms < 0 || ms > 3600000)
		return -EINVAL;
	cfg->retry_ms = ms;
	return 0;
}

HKV_EXPORT int hkv_config_set_etcd(struct hkv_config *cfg, const char *name, const char *value)
{
	return cfg ? hkv_etcd_sec_set(&cfg->etcd, name, value) : -EINVAL;
}

HKV_EXPORT int hkv_config_set_timeout_ms(struct hkv_config *cfg, int ms)
{
	if (ms <= 0)
		return -EINVAL;
	cfg->timeout_ms = ms;
	return 0;
}

HKV_EXPORT int hkv_config_set_max_value(struct hkv_config *cfg, size_t bytes)
{
	if (!bytes || bytes > (1u << 30))
		return -EINVAL;
	cfg->max_value = bytes;
	return 0;
}

HKV_EXPORT int hkv_config_set_cache_entries(struct hkv_config *cfg, size_t n)
{
	if (n > (1u << 26))
		return -EINVAL;
	cfg->cache_entries = n;
	return 0;
}
