/* hkv-rawserve: the server half of tests/support/rawserve.h, run by exec. */
#include "tests/support/rawserve.h"

int main(int argc, char **argv)
{
	return rawserve_main(argc, argv);
}
