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

#endif /* HKV_REGION_H */
