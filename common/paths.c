/* paths.c - see paths.h. */
#include "common/paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

/* dir exists (made with mode if missing), is ours or root's, and nobody
 * else may write it. */
static int own_dir(const char *dir, mode_t mode)
{
	struct stat st;

	if (mkdir(dir, mode) && errno != EEXIST)
		return -errno;
	if (lstat(dir, &st))
		return -errno;
	if (!S_ISDIR(st.st_mode) || (st.st_uid != geteuid() && st.st_uid != 0) ||
	    (st.st_mode & 022)) {
		hkv_err("%s: not a directory of this user that only it can write; refusing to "
			"put the control socket there", dir);
		return -EPERM;
	}
	return 0;
}

int hkv_default_socket(char *buf, size_t cap, int make_dir)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dir[256];
	int n;

	if (geteuid() == 0)
		snprintf(dir, sizeof(dir), "/run/hatchkv");
	else if (xdg && xdg[0] == '/' && strlen(xdg) < 200)
		snprintf(dir, sizeof(dir), "%s", xdg);
	else
		snprintf(dir, sizeof(dir), "/tmp/hatchkv-%u", (unsigned)geteuid());
	n = snprintf(buf, cap, "%s/hatchkv.sock", dir);
	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	if (!make_dir)
		return 0;
	return own_dir(dir, geteuid() == 0 ? 0755 : 0700);
}
