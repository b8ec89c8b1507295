/* region.c - see region.h. */
#include "common/region.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/token.h"

#define HUGE_2M (2u << 20)

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#define TOUCH_CHUNK (256ul << 20)

static hkv_region_progress_fn progress_fn;
static void *progress_arg;

void hkv_region_set_progress(hkv_region_progress_fn fn, void *arg)
{
	progress_fn = fn;
	progress_arg = arg;
}

/* Map fd (already sized) shared and prefaulted, a chunk at a time so that
 * the progress hook can say how far it is; NULL on failure. A kernel
 * without MADV_POPULATE_WRITE faults each chunk in by touching a byte per
 * page (read: the bytes of a kept file stay as they are). */
static void *region_map(int fd, size_t length)
{
	void *p = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	long page = sysconf(_SC_PAGESIZE);

	if (p == MAP_FAILED)
		return NULL;
	if (progress_fn)
		progress_fn(0, length, progress_arg);
	for (size_t off = 0; off < length; off += TOUCH_CHUNK) {
		size_t n = length - off < TOUCH_CHUNK ? length - off : TOUCH_CHUNK;

		if (madvise((char *)p + off, n, MADV_POPULATE_WRITE)) {
			if (errno != EINVAL) { /* (EINVAL: an older kernel) */
				munmap(p, length);
				return NULL;
			}
			for (size_t i = 0; i < n; i += (size_t)page)
				(void)*(volatile char *)((char *)p + off + i);
		}
		if (progress_fn)
			progress_fn(off + n, length, progress_arg);
	}
	return p;
}

/*
 * A memfd region goes to shm clients (SCM_RIGHTS, or a read-only reopen of
 * it): its size is sealed, so no client can shrink it under the server
 * (SIGBUS, every item lost) or grow it, and its mode is 0600, so a client of
 * another uid cannot reopen it through /proc/<pid>/fd with more rights than
 * it was handed. (A client of the server's own uid can: docs/reliability.md.)
 */
static int region_seal(int fd)
{
	if (fchmod(fd, 0600) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		return -errno;
	return 0;
}

/* hugetlb pages only when the system has enough reserved; else fail quietly. */
static int region_try_hugetlb(struct hkv_region *r, size_t length)
{
	size_t len2m = (length + HUGE_2M - 1) & ~(size_t)(HUGE_2M - 1);
	int fd = memfd_create("hatchkv-region", MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)len2m) == 0 && (r->base = region_map(fd, len2m))) {
		r->length = len2m;
		r->fd = fd;
		r->hugetlb = 1;
		if (region_seal(fd) == 0)
			return 0;
		munmap(r->base, len2m);
		r->base = NULL;
	}
	close(fd);
	return -1;
}

int hkv_region_create(struct hkv_region *r, size_t length, const char *path, int *existed)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct stat st;
	int fd, err;

	memset(r, 0, sizeof(*r));
	length = (length + page - 1) & ~(page - 1);
	if (existed)
		*existed = 0;
	if (!path && region_try_hugetlb(r, length) == 0)
		goto done;
	fd = path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)
		  : memfd_create("hatchkv-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		if (path && errno == ELOOP)
			hkv_err("memory file %s is a symbolic link; refusing it", path);
		return -errno;
	}
	if (path && (err = hkv_secret_file_ok(fd, path, "memory file"))) {
		close(fd);
		return err;
	}
	if (path && fstat(fd, &st) == 0 && st.st_size > 0) {
		length = (size_t)st.st_size; /* an existing region keeps its size and bytes */
		if (existed)
			*existed = 1;
	} else if (ftruncate(fd, (off_t)length) < 0) {
		err = -errno;
		close(fd);
		return err;
	}
	if (!(r->base = region_map(fd, length))) {
		err = -errno;
		close(fd);
		return err;
	}
	madvise(r->base, length, MADV_HUGEPAGE);
	r->length = length;
	r->fd = fd;
	if (!path && (err = region_seal(fd))) {
		hkv_region_destroy(r);
		return err;
	}
done:
	hkv_debug("region: %zu bytes, %s%s", r->length, path ? path : "memfd",
		  r->hugetlb ? " (hugetlb)" : "");
	return 0;
}

void hkv_region_destroy(struct hkv_region *r)
{
	if (r->base)
		munmap(r->base, r->length);
	if (r->fd >= 0)
		close(r->fd);
	r->base = NULL;
	r->fd = -1;
}
