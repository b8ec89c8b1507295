#!/bin/sh
# test_install.sh BUILD SRC - `cmake --install` into a temporary prefix puts
# the programs, libhatchkv (with its soname link), the headers, hatchkv.pc
# (naming that prefix) and the docs; a client built with
# `cc $(pkg-config --cflags --libs hatchkv)` alone - the prefix's .pc the only
# one pkg-config may see - runs against the prefix's library and does a
# set/get on a shm server started from the prefix; SIGTERM stops it with 0.
set -eu
B=$(cd "$1" && pwd)
S=$(cd "$2" && pwd)
name=packaging_install
fail() { echo "$name: FAIL: $*" >&2; exit 1; }
note() { echo "$name: $*"; }

tmp=$(mktemp -d /tmp/hkv-install.XXXXXX)
srv=
cleanup() {
	[ -n "$srv" ] && kill "$srv" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
P=$tmp/prefix

cmake --install "$B" --prefix "$P" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log" >&2; fail "cmake --install $B --prefix $P failed"; }

# What must be there. The library's directory is GNUInstallDirs' choice:
# find it from the .pc.
for f in bin/hatchkv-server bin/hatchkv-memcached bin/hatchkv-admin bin/hatchkv-bench; do
	[ -x "$P/$f" ] || fail "$f is not installed (or not executable)"
done
for f in "$P"/bin/*; do
	case ${f##*/} in
	hatchkv-server|hatchkv-memcached|hatchkv-admin|hatchkv-bench) ;;
	*) fail "bin/${f##*/} is installed: only the four programs belong there" ;;
	esac
done
pc=$(find "$P" -path '*/pkgconfig/hatchkv.pc')
[ -n "$pc" ] && [ "$(echo "$pc" | wc -l)" -eq 1 ] || fail "not one hatchkv.pc under $P: '$pc'"
libdir=${pc%/pkgconfig/hatchkv.pc}
for f in include/hatchkv.h include/hatchkv_err.h share/doc/hatchkv/README.md \
	 share/doc/hatchkv/design.md share/doc/hatchkv/operating.md; do
	[ -f "$P/$f" ] || fail "$f is not installed"
done
real=$(ls "$libdir"/libhatchkv.so.*.*.* 2>/dev/null | head -n1)
[ -f "$real" ] && [ ! -L "$real" ] || fail "no libhatchkv.so.X.Y.Z in $libdir"
[ -L "$libdir/libhatchkv.so.0" ] && [ "$(readlink "$libdir/libhatchkv.so.0")" = "${real##*/}" ] ||
	fail "libhatchkv.so.0 is not a link to ${real##*/}"
[ -L "$libdir/libhatchkv.so" ] || fail "no libhatchkv.so link (for -lhatchkv)"
soname=$(objdump -p "$real" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = libhatchkv.so.0 ] || fail "soname of ${real##*/} is '$soname', not libhatchkv.so.0"
[ -z "$(find "$P" -name 'test_*' -o -name '*.a' -o -name 'hkv-*')" ] ||
	fail "test programs or static archives installed: $(find "$P" -name 'test_*' -o -name '*.a' -o -name 'hkv-*')"

# The .pc must name this prefix (made at install time), and nothing else
# may be needed: PKG_CONFIG_LIBDIR is the prefix's directory alone, so no
# -dev package's .pc of the machine can fill a gap (Requires would fail).
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig" PKG_CONFIG_PATH=
flags=$(pkg-config --cflags --libs hatchkv) || fail "pkg-config --cflags --libs hatchkv failed"
note "pkg-config: $flags"
case $flags in *"-I$P/include"*) ;; *) fail "Cflags do not name $P/include: $flags" ;; esac
case $flags in *"-L$libdir "*|*"-L$libdir") ;; *) fail "Libs do not name $libdir: $flags" ;; esac
[ "$(pkg-config --modversion hatchkv)" = "$(sed -n 's/^project(hatchkv VERSION \([0-9.]*\).*/\1/p' "$S/CMakeLists.txt")" ] ||
	fail "hatchkv.pc's version $(pkg-config --modversion hatchkv) is not the project's"

cat >"$tmp/client.c" <<'CEOF'
/* a program of a user of the installed library: version, config, set, get */
#include <hatchkv.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	struct hkv_config *cfg = hkv_config_new();
	struct hkv_client *c;
	char buf[64];
	size_t n = 0;
	int ret;

	if (argc != 3 || !cfg)
		return 2;
	printf("hatchkv %s (header 0x%06x)\n", hkv_version(), HKV_VERSION_NUMBER);
	if (hkv_config_add_server(cfg, argv[1]) || hkv_config_set_token_file(cfg, argv[2]))
		return 3;
	ret = hkv_open(cfg, &c);
	if (ret) {
		printf("open: %s\n", hkv_strerror(ret));
		return 4;
	}
	ret = hkv_set(c, "installed", 9, "works", 5, NULL);
	if (!ret)
		ret = hkv_get(c, "installed", 9, buf, sizeof(buf), &n, NULL);
	if (ret) {
		printf("set/get: %s\n", hkv_strerror(ret));
		return 5;
	}
	printf("get installed = %.*s\n", (int)n, buf);
	hkv_close(c);
	hkv_config_free(cfg);
	return n == 5 && !memcmp(buf, "works", 5) ? 0 : 6;
}
CEOF
san=
case ${HKV_SANITIZE:-} in # the library of an ASan tree needs its runtime first
address) san=-fsanitize=address,undefined ;;
thread) san=-fsanitize=thread ;;
esac
# shellcheck disable=SC2086 # (flags split on purpose)
cc -std=c11 -Wall -Werror $san -o "$tmp/client" "$tmp/client.c" $flags 2>"$tmp/cc.log" ||
	{ cat "$tmp/cc.log" >&2; fail "the client does not build with pkg-config's flags alone"; }
export LD_LIBRARY_PATH="$libdir"
ldd "$tmp/client" | grep -q "libhatchkv.so.0 => $libdir/libhatchkv.so.0" ||
	fail "the client does not load the prefix's libhatchkv: $(ldd "$tmp/client" | grep hatchkv)"

# A shm server from the prefix, a token of its own making.
sock=$tmp/hkv.sock
"$P/bin/hatchkv-server" --transport shm --socket "$sock" --memory 32M \
	--token-file "$tmp/hatchkv.token" >"$tmp/server.log" 2>&1 &
srv=$!
i=0
until grep -q "server: ready" "$tmp/server.log"; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 "$srv" 2>/dev/null; then
		cat "$tmp/server.log" >&2
		fail "the installed hatchkv-server did not get ready"
	fi
	sleep 0.1
done
out=$("$tmp/client" "shm:$sock" "$tmp/hatchkv.token" 2>&1) ||
	{ echo "$out" >&2; fail "the client failed (exit $?)"; }
note "client: $(echo "$out" | tr '\n' ';')"
echo "$out" | grep -q "get installed = works" || fail "the client did not read back its value"
kill -TERM "$srv"
rc=0
wait "$srv" || rc=$?
srv=
[ $rc -eq 0 ] || { cat "$tmp/server.log" >&2; fail "hatchkv-server exited $rc on SIGTERM, not 0"; }
note "ok (prefix $P, lib ${real##*/})"
