/* token.c - see token.h. */
#include "common/token.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "hatchkv_err.h"

static int token_create(const char *path)
{
	static const char hex[] = "0123456789abcdef";
	unsigned char rnd[16];
	char text[34];
	int fd;

	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
		return -errno;
	for (int i = 0; i < 16; i++) {
		text[2 * i] = hex[rnd[i] >> 4];
		text[2 * i + 1] = hex[rnd[i] & 15];
	}
	text[32] = '\n';
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return errno == EEXIST ? 0 : -errno;
	if (write(fd, text, 33) != 33) {
		int err = -errno;

		close(fd);
		return err;
	}
	if (close(fd))
		return -errno;
	{ /* say where: a relative default lands in the working directory */
		char *abs = realpath(path, NULL);

		hkv_info("made a new random token in %s (0600): clients need a copy of it",
			 abs ? abs : path);
		free(abs);
	}
	return 0;
}

int hkv_secret_file_ok(int fd, const char *path, const char *what)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	if (!S_ISREG(st.st_mode)) {
		hkv_err("%s %s is not a regular file; refusing it", what, path);
		return -EPERM;
	}
	if (st.st_uid != geteuid()) {
		hkv_err("%s %s belongs to uid %u, not to this server's uid %u; refusing it "
			"(chown it, or move it away to start with a new one)", what, path,
			(unsigned)st.st_uid, (unsigned)geteuid());
		return -EPERM;
	}
	if (st.st_mode & 077) {
		hkv_err("%s %s has mode %04o: group or others may use it; refusing it "
			"(chmod 600 %s)", what, path, (unsigned)(st.st_mode & 07777), path);
		return -EPERM;
	}
	return 0;
}

int hkv_token_load(const char *path, char *buf, size_t cap, int create)
{
	struct stat st;
	ssize_t n;
	int fd, ret;

	if (create && (ret = token_create(path)))
		return ret;
	fd = open(path, O_RDONLY | O_CLOEXEC | (create ? O_NOFOLLOW : 0));
	if (fd < 0) {
		if (create && errno == ELOOP)
			hkv_err("token file %s is a symbolic link; refusing it", path);
		return -errno;
	}
	if (create && (ret = hkv_secret_file_ok(fd, path, "token file"))) {
		close(fd);
		return ret;
	}
	if (!create && !fstat(fd, &st) && (st.st_mode & 004))
		hkv_warn("token file %s can be read by any user (mode %04o)", path,
			 (unsigned)(st.st_mode & 07777));
	n = read(fd, buf, cap);
	close(fd);
	if (n < 0)
		return -errno;
	while (n > 0 && isspace((unsigned char)buf[n - 1]))
		n--;
	if (n < HKV_TOKEN_MIN || (size_t)n >= cap)
		return HKV_EAUTH;
	for (ssize_t i = 0; i < n; i++)
		if (!isprint((unsigned char)buf[i]))
			return HKV_EAUTH;
	buf[n] = 0;
	if (create) { /* a guessable token: say so (the server still starts) */
		int distinct = 0;
		uint8_t seen[256] = {0};

		for (ssize_t i = 0; i < n; i++)
			distinct += !seen[(uint8_t)buf[i]]++;
		if (distinct < 8)
			hkv_warn("token file %s: the token has only %d distinct characters; use "
				 "16 or more random bytes (delete the file and the server makes one)",
				 path, distinct);
	}
	return (int)n;
}
