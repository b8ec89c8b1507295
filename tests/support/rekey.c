/* rekey.c - see rekey.h. */
#include "tests/support/rekey.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/layout.h"

const uint8_t hkv_test_secret[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* PATH.geom, as the server keeps it: a new region's geometry, mode 0600. */
static int save_geom(const char *path, const struct hkv_geometry *g)
{
	char gpath[4096];
	int fd, ret = 0;

	snprintf(gpath, sizeof(gpath), "%s.geom", path);
	fd = open(gpath, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, g, sizeof(*g)) != (ssize_t)sizeof(*g) || fsync(fd))
		ret = -EIO;
	close(fd);
	return ret;
}

int hkv_test_rekey(const char *path, const uint8_t key[16])
{
	struct hkv_geometry *g;
	struct stat st;
	void *map;
	int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC), ret;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) || st.st_size < HKV_HEADER_SIZE) {
		close(fd);
		return -EINVAL;
	}
	map = mmap(NULL, HKV_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return -errno;
	g = map;
	ret = hkv_geometry_check(g, (uint64_t)st.st_size);
	if (!ret) {
		memcpy(g->hash_key, key, sizeof(g->hash_key));
		hkv_geometry_seal(g);
		ret = msync(map, HKV_HEADER_SIZE, MS_SYNC) ? -errno : 0;
	}
	if (!ret) /* the server's own record of the geometry (server/store.c geom_save) */
		ret = save_geom(path, g);
	munmap(map, HKV_HEADER_SIZE);
	return ret;
}
