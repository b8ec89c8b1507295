/* err.c - hkv_strerror(): names for -errno and HKV_E* codes. */
#include "hatchkv_err.h"

#include <errno.h>
#include <string.h>

static const char *const hkv_messages[] = {
	[1] = "key not found",
	[2] = "key already exists",
	[3] = "item changed since its version was read",
	[4] = "key or value too large",
	[5] = "store is full",
	[6] = "disconnected from the memory server",
	[7] = "timed out waiting for the memory server",
	[8] = "remote access error (bad rkey, bounds or rights)",
	[9] = "remote invalid request",
	[10] = "request flushed after an earlier error",
	[11] = "transport failure",
	[12] = "remote memory failed validation (corrupt)",
	[13] = "authentication refused",
	[14] = "protocol error or version mismatch",
	[15] = "too much contention, retries exhausted",
	[16] = "value is not a number",
	[17] = "no RDMA device or transport unavailable",
	[18] = "the key's server is out of service; nothing was done",
	[19] = "replicated write cut off: it may have taken effect (outcome unknown)",
	[20] = "the server did not prove it holds the token (not the server it claims to be)",
};

HKV_EXPORT const char *hkv_strerror(int err)
{
	int idx = -err - 1000;

	if (err == 0)
		return "success";
	if (idx > 0 && idx < (int)(sizeof(hkv_messages) / sizeof(hkv_messages[0])) &&
	    hkv_messages[idx])
		return hkv_messages[idx];
	if (err == -EKEYREJECTED) /* (common/etcd.c's: etcd's authentication) */
		return "etcd refused the user or its password";
	if (err < 0 && err > -1000)
		return strerror(-err); /* glibc: static for known errno values */
	return "unknown error";
}
