/* hkv-rekey FILE [HEX32]: tests/support/rekey.h from a script (the memcached
 * tests). Without HEX32 the test secret hkv_test_secret. */
#include <stdio.h>
#include <string.h>

#include "hatchkv.h"
#include "tests/support/rekey.h"

int main(int argc, char **argv)
{
	uint8_t key[16];
	int ret;

	memcpy(key, hkv_test_secret, sizeof(key));
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s REGION-FILE [SECRET-HEX32]\n", argv[0]);
		return 2;
	}
	for (int i = 0; argc == 3 && i < 16; i++)
		if (strlen(argv[2]) != 32 || sscanf(argv[2] + 2 * i, "%2hhx", &key[i]) != 1) {
			fprintf(stderr, "%s: the secret is 32 hex digits\n", argv[0]);
			return 2;
		}
	ret = hkv_test_rekey(argv[1], key);
	if (ret)
		fprintf(stderr, "%s: %s: %s\n", argv[0], argv[1], hkv_strerror(ret));
	return ret ? 1 : 0;
}
