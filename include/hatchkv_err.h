/*
 * hatchkv_err.h - the one error convention of hatchkv.
 *
 * Every int-returning function in hatchkv returns 0 on success or a negative
 * code: either -errno (e.g. -EINVAL, -ENOMEM) or one of the HKV_E* codes
 * below, which live far outside errno's range. Pointer-returning functions
 * return NULL and set errno to the positive value of such a code.
 * hkv_strerror() names both kinds. Codes are stable ABI: never renumber.
 */
#ifndef HKV_ERR_H
#define HKV_ERR_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HKV_BUILDING) && defined(__GNUC__)
#define HKV_EXPORT __attribute__((visibility("default")))
#else
#define HKV_EXPORT
#endif

enum hkv_error {
	HKV_OK = 0,
	HKV_ENOTFOUND = -1001,      /* key is not stored (or expired) */
	HKV_EEXISTS = -1002,        /* add: key already stored */
	HKV_EVERSION = -1003,       /* cas: item changed since its version was read */
	HKV_ETOOBIG = -1004,        /* key or value over the configured limit */
	HKV_EFULL = -1005,          /* no free block or index slot (store mode) */
	HKV_EDISCONNECTED = -1006,  /* peer gone, or connection in error state */
	HKV_ETIMEDOUT = -1007,      /* no completion within the timeout */
	HKV_EREMOTE_ACCESS = -1008, /* remote access error: bad rkey, bounds, rights */
	HKV_EREMOTE_INVAL = -1009,  /* remote invalid request (e.g. misaligned atomic) */
	HKV_EFLUSHED = -1010,       /* request flushed: an earlier one in the chain failed */
	HKV_ETRANSPORT = -1011,     /* other transport failure (see log) */
	HKV_ECORRUPT = -1012,       /* remote memory failed validation */
	HKV_EAUTH = -1013,          /* control plane refused the token */
	HKV_EPROTO = -1014,         /* protocol version or message malformed */
	HKV_EAGAIN = -1015,         /* too much contention: retries exhausted */
	HKV_ENOTNUM = -1016,        /* incr/decr on a value that is not a number */
	HKV_ENODEV = -1017,         /* no RDMA device / transport unavailable */
	HKV_EUNAVAILABLE = -1018,   /* cluster: the key's server is out of service
				     * (gone, or refusing); nothing was done */
	HKV_EUNKNOWN = -1019,       /* replicated write cut off after it may have
				     * taken effect: it did, or will (the next
				     * write of the key finishes it), or not */
	HKV_ESERVERAUTH = -1020,    /* the server did not prove it holds the token:
				     * not the server it claims to be; nothing
				     * was sent to it but a nonce */
};

/* Human-readable text for 0, -errno or HKV_E*; never NULL, static storage. */
HKV_EXPORT const char *hkv_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif /* HKV_ERR_H */
