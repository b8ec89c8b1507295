/*
 * fdlimit.h - a daemon's descriptor budget (issue 28, item 6): raise the
 * soft RLIMIT_NOFILE to the hard limit at start, and size every cap on
 * connections from what is left.
 */
#ifndef HKV_FDLIMIT_H
#define HKV_FDLIMIT_H

/* Raise the soft limit to the hard one (logs the change); the soft limit
 * now, or 1024 if it cannot be read. */
long hkv_fd_limit_raise(const char *prog);

#endif /* HKV_FDLIMIT_H */
