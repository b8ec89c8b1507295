/* token.c - see token.h. */
#include "common/token.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/random.h>
#include <unistd.h>

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
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return errno == EEXIST ? 0 : -errno;
	if (write(fd, text, 33) != 33) {
		int err = -errno;

		close(fd);
		return err;
	}
	return close(fd) ? -errno : 0;
}

int hkv_token_load(const char *path, char *buf, size_t cap, int create)
{
	ssize_t n;
	int fd, ret;

	if (create && (ret = token_create(path)))
		return ret;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
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
	return (int)n;
}
