/*
 * hkv_alloc.h - all host (non-registered) allocation in hatchkv goes through
 * here. Backed by jemalloc (non-prefixed, Debian's libjemalloc) when linked,
 * by libc under sanitizer builds. Registered RDMA memory does not come from
 * here: see common/region.h (server region) and the per-connection buffers.
 *
 * Allocation failure is reported (NULL), never papered over.
 */
#ifndef HKV_ALLOC_H
#define HKV_ALLOC_H

#include <stdlib.h>
#include <string.h>

static inline void *hkv_malloc(size_t n)
{
	return malloc(n);
}

static inline void *hkv_calloc(size_t nmemb, size_t size)
{
	return calloc(nmemb, size);
}

static inline void *hkv_realloc(void *p, size_t n)
{
	return realloc(p, n);
}

static inline void hkv_free(void *p)
{
	free(p);
}

static inline void *hkv_aligned_alloc(size_t align, size_t n)
{
	void *p = NULL;

	return posix_memalign(&p, align, n) ? NULL : p;
}

static inline char *hkv_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = hkv_malloc(n);

	if (d)
		memcpy(d, s, n);
	return d;
}

#endif /* HKV_ALLOC_H */
