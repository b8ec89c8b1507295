/* fdlimit.c - see fdlimit.h. */
#include "common/fdlimit.h"

#include <sys/resource.h>

#include "common/log.h"

long hkv_fd_limit_raise(const char *prog)
{
	struct rlimit lim;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &lim))
		return 1024;
	was = lim.rlim_cur;
	if (lim.rlim_cur < lim.rlim_max) {
		lim.rlim_cur = lim.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &lim))
			lim.rlim_cur = was;
	}
	if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > (1u << 30))
		lim.rlim_cur = 1u << 30;
	if (lim.rlim_cur != was)
		hkv_info("%s: file descriptors: %llu (raised from %llu)", prog,
			 (unsigned long long)lim.rlim_cur, (unsigned long long)was);
	return (long)lim.rlim_cur;
}
