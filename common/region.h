/*
 * region.h - the server's one big memory region, as a shared file mapping.
 *
 * Backed by a memfd (hugetlb pages when the system has them reserved, else
 * ordinary pages with MADV_HUGEPAGE) so the shm transport can hand it to
 * clients, or by a regular file (--memory-file) so it outlives the process.
 * The mapping is zero-filled at creation and MAP_SHARED, so RDMA
 * registration and other processes see the same bytes.
 */
#ifndef HKV_REGION_H
#define HKV_REGION_H

#include <stddef.h>

struct hkv_region {
	void *base;
	size_t length;
	int fd;
	int hugetlb; /* 1 if backed by hugetlb pages */
};

/*
 * Create a region of `length` bytes (rounded up to the page size). path NULL:
 * anonymous memfd. Otherwise the file at path is opened, created and sized
 * if missing or empty; a non-empty file keeps its size and its bytes
 * (*existed set to 1), for a warm restart.
 * Returns 0 or -errno.
 */
int hkv_region_create(struct hkv_region *r, size_t length, const char *path, int *existed);
void hkv_region_destroy(struct hkv_region *r);

/* Called as a region's pages are first touched (prefaulted, 256 MiB at a
 * time: a large region takes seconds): done and total bytes; once with
 * done == 0 before, once with done == total after. NULL: none. */
typedef void (*hkv_region_progress_fn)(size_t done, size_t total, void *arg);
void hkv_region_set_progress(hkv_region_progress_fn fn, void *arg);

#endif /* HKV_REGION_H */
