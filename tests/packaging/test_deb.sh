#!/bin/sh
# test_deb.sh BUILD SRC - the three Debian packages CPack makes of this tree
# (packaging/package.cmake): libhatchkv0 (the library in the multiarch
# directory), libhatchkv-dev (headers, libhatchkv.so, hatchkv.pc) and
# hatchkv (programs, units, /etc/default files, man pages, docs).
#   1. their names, versions, dependencies (every library an ELF file needs,
#      by its package), files, copyright and changelog, control files
#      (conffiles, ldconfig trigger, shlibs, maintainer scripts that pass
#      sh -n and use deb-systemd-helper/-invoke, never systemctl but for
#      daemon-reload);
#   2. lintian: no error, no warning (packaging/lintian/ overrides the ones
#      that do not apply, each saying why);
#   3. as root with a mount namespace and overlayfs: a throwaway root, a
#      copy-on-write overlay of this machine's /, where dpkg installs the
#      three packages, the package's server runs as hatchkv on postinst's
#      token and a client built with pkg-config alone sets and gets through
#      it, the administrator enables two units and edits a conffile, the
#      same version with release 2 upgrades them (token, links and edit
#      kept), dpkg removes and purges them: no hatchkv enable link is left,
#      /etc/hatchkv and the user are gone, /var/lib/hatchkv with a memory
#      file in it survives (and goes when empty).
# Nothing is installed on this machine.
set -eu
B=$(cd "$1" && pwd)
S=$(cd "$2" && pwd)
name=packaging_deb
fail() { echo "$name: FAIL: $*" >&2; exit 1; }
note() { echo "$name: $*"; }

tmp=$(mktemp -d /tmp/hkv-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM

command -v lintian >/dev/null || fail "lintian is missing: scripts/install-deps installs it"
[ -f "$B/CPackConfig.cmake" ] || fail "no $B/CPackConfig.cmake (packaging/package.cmake not included?)"
# cpack BUILD OUT [args...]: the packages of this tree into OUT
cpack_into() {
	out=$1
	shift
	(cd "$B" && cpack -G DEB --config "$B/CPackConfig.cmake" -B "$out" "$@") >"$out.log" 2>&1 ||
		{ cat "$out.log" >&2; fail "cpack -G DEB $* failed"; }
}
cpack_into "$tmp/out"

version=$(sed -n 's/^project(hatchkv VERSION \([0-9.]*\).*/\1/p' "$S/CMakeLists.txt")
arch=$(dpkg --print-architecture)
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || cc -print-multiarch)
[ -n "$ma" ] || fail "no multiarch triplet (dpkg-architecture, cc -print-multiarch)"
pkgs="libhatchkv0 libhatchkv-dev hatchkv"
n=0
for d in "$tmp"/out/*.deb; do n=$((n + 1)); done
[ $n -eq 3 ] || fail "cpack made $n .debs, not 3: $(ls "$tmp/out")"
for p in $pkgs; do
	set -- "$tmp/out/${p}_$version"-*_"$arch".deb
	[ -f "$1" ] || fail "no ${p}_$version-*_$arch.deb: $(ls "$tmp/out")"
	eval "deb_$(echo "$p" | tr -- - _)=\$1"
done
# deb PACKAGE: its .deb (release 1)
deb() { eval "echo \$deb_$(echo "$1" | tr -- - _)"; }
note "built $(cd "$tmp/out" && echo *.deb)"

# -- control fields
release=
for p in $pkgs; do
	f=$(deb "$p")
	[ "$(dpkg-deb -f "$f" Package)" = "$p" ] || fail "${f##*/} is package '$(dpkg-deb -f "$f" Package)'"
	v=$(dpkg-deb -f "$f" Version)
	case $v in "$version"-*) ;; *) fail "$p's version $v is not the project's $version-N" ;; esac
	[ -z "$release" ] || [ "$v" = "$version-$release" ] || fail "$p's version $v differs from the others'"
	release=${v#"$version"-}
	[ "$(dpkg-deb -f "$f" Architecture)" = "$arch" ] || fail "$p's architecture $(dpkg-deb -f "$f" Architecture)"
	[ -n "$(dpkg-deb -f "$f" Maintainer)" ] || fail "$p has no Maintainer"
	dpkg-deb -x "$f" "$tmp/root-$p"
	dpkg-deb -e "$f" "$tmp/control-$p"
	dpkg-deb -c "$f" | awk '{s = $6; for (i = 7; i <= NF; i++) s = s " " $i; print s}' |
		sed 's|^\./|/|' >"$tmp/list-$p"
done
fver="$version-$release"
[ "$(dpkg-deb -f "$(deb libhatchkv0)" Section)" = libs ] || fail "libhatchkv0 is not in section libs"
[ "$(dpkg-deb -f "$(deb libhatchkv-dev)" Section)" = libdevel ] || fail "libhatchkv-dev is not in section libdevel"
dev_dep=$(dpkg-deb -f "$(deb libhatchkv-dev)" Depends)
echo "$dev_dep" | tr ',' '\n' | sed 's/^ *//' | grep -qx "libhatchkv0 (= $fver)" ||
	fail "libhatchkv-dev does not depend on libhatchkv0 (= $fver): $dev_dep"

# depends PACKAGE: its Depends, one package name a line
depends() {
	dpkg-deb -f "$(deb "$1")" Depends | tr ',' '\n' | sed 's/^ *//; s/ .*//; s/|.*//'
}
# the libraries each package's ELF files load, by their Debian 12 packages;
# the verbs providers (dlopen'ed) for both, adduser (postinst) for hatchkv
need="libc6 libibverbs1 librdmacm1 libevent-core-2.1-7 libsodium23 libjson-c5 ibverbs-providers"
case ${HKV_SANITIZE:-} in address|thread) ;; *) [ "${HKV_JEMALLOC:-ON}" = OFF ] || need="$need libjemalloc2" ;; esac
for p in libhatchkv0 hatchkv; do
	extra=
	[ "$p" = hatchkv ] && extra=adduser
	for d in $need $extra; do
		depends "$p" | grep -qx "$d" || fail "$p's Depends lacks $d: $(dpkg-deb -f "$(deb "$p")" Depends)"
	done
done
# and every shared library a packaged ELF file needs is in a package its
# Depends names (one dpkg -S for all: it reads every package's file list).
# The programs link libhatchkv statically: if one ever needs
# libhatchkv.so.0, hatchkv must depend on libhatchkv0 (= this version).
: >"$tmp/paths"
for p in libhatchkv0 hatchkv; do
	for f in "$tmp/root-$p"/usr/bin/* "$tmp/root-$p/usr/lib/$ma/libhatchkv.so.0"; do
		[ -e "$f" ] || continue
		objdump -p "$f" | awk -v p="$p" '$1 == "NEEDED" {print p, $2}'
	done
done | sort -u >"$tmp/needed"
if grep -q '^hatchkv libhatchkv\.so\.0$' "$tmp/needed"; then
	dpkg-deb -f "$(deb hatchkv)" Depends | tr ',' '\n' | sed 's/^ *//' | grep -qx "libhatchkv0 (= $fver)" ||
		fail "the programs load libhatchkv.so.0 but hatchkv does not depend on libhatchkv0 (= $fver)"
	note "the programs load libhatchkv.so.0: hatchkv depends on libhatchkv0 (= $fver)"
else
	note "the programs link libhatchkv statically: hatchkv needs no libhatchkv0"
fi
grep -v ' libhatchkv\.so' "$tmp/needed" | while read -r p lib; do
	path=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
	[ -n "$path" ] || fail "$lib (needed by $p) is not in ldconfig's cache"
	path=$(readlink -f "$path")
	# merged /usr: dpkg may know the file under /lib or under /usr/lib
	echo "$p $path ${path#/usr}"
done >"$tmp/paths"
# shellcheck disable=SC2046
dpkg -S $(awk '{print $2; print $3}' "$tmp/paths" | sort -u) >"$tmp/owners" 2>/dev/null || true
while read -r p path alias; do
	owner=$(grep -E ": ($path|$alias)\$" "$tmp/owners" | head -n1 | sed 's/:.*//')
	[ -n "$owner" ] || fail "no package owns $path (needed by $p)"
	depends "$p" | grep -qx "$owner" || fail "$p needs $path of $owner, which its Depends does not name"
done <"$tmp/paths"
note "libraries needed: $(awk '{print $2}' "$tmp/needed" | sort -u | tr '\n' ' ')"

# -- files
# has PACKAGE LINE: dpkg -c of PACKAGE lists LINE ("PATH" or "LINK -> TARGET")
has() { grep -Fqx -- "$2" "$tmp/list-$1" || fail "$1 lacks $2"; }
hasnt() { ! grep -q -- "$2" "$tmp/list-$1" || fail "$1 holds $(grep -- "$2" "$tmp/list-$1" | head -n1)"; }
L=/usr/lib/$ma
real=$(cd "$tmp/root-libhatchkv0/$L" && ls libhatchkv.so.*.*.*)
has libhatchkv0 "$L/$real"
has libhatchkv0 "$L/libhatchkv.so.0 -> $real"
soname=$(objdump -p "$tmp/root-libhatchkv0/$L/$real" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = libhatchkv.so.0 ] || fail "$real's soname is '$soname'"
has libhatchkv-dev "$L/libhatchkv.so -> libhatchkv.so.0"
has libhatchkv-dev /usr/include/hatchkv.h
has libhatchkv-dev /usr/include/hatchkv_err.h
has libhatchkv-dev "$L/pkgconfig/hatchkv.pc"
for p in libhatchkv0 libhatchkv-dev hatchkv; do
	has "$p" "/usr/share/doc/$p/copyright"
	has "$p" "/usr/share/doc/$p/changelog.Debian.gz"
	# nothing of the library's outside the multiarch directory
	hasnt "$p" '^/usr/lib/[^/]*\.so'
	hasnt "$p" '^/usr/lib/pkgconfig'
done
hasnt libhatchkv0 '^/usr/include'
hasnt libhatchkv0 'libhatchkv\.so -> '
hasnt libhatchkv-dev '^/usr/bin'
hasnt libhatchkv-dev '^[^ ]*libhatchkv\.so\.0'
hasnt hatchkv 'libhatchkv\.so'
hasnt hatchkv '^/usr/include'
for f in hatchkv-server hatchkv-memcached hatchkv-admin hatchkv-bench; do
	has hatchkv "/usr/bin/$f"
	[ -x "$tmp/root-hatchkv/usr/bin/$f" ] || fail "/usr/bin/$f is not executable"
	# its man page, gzipped -9n from docs/man/, a page man renders
	m=/usr/share/man/man1/$f.1.gz
	has hatchkv "$m"
	gzip -dc "$tmp/root-hatchkv/$m" | cmp -s - "$S/docs/man/$f.1" || fail "$m is not docs/man/$f.1"
	# gzip's header: no file name (flag 8), time stamp 0 (gzip -n)
	# shellcheck disable=SC2046
	set -- $(od -An -tu1 -j3 -N5 "$tmp/root-hatchkv/$m")
	if [ $(($1 & 8)) -ne 0 ] || [ "$2$3$4$5" != 0000 ]; then
		fail "$m keeps a name or time stamp (not gzip -n)"
	fi
	if command -v man >/dev/null; then
		w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$tmp/root-hatchkv/$m" 2>&1 >/dev/null)
		[ -z "$w" ] || fail "man warns about $f.1: $w"
	fi
done
has hatchkv /usr/share/hatchkv/etcd-roles
has hatchkv /usr/share/doc/hatchkv/README.md
for f in "$S"/docs/*.md; do
	case ${f##*/} in
	proposal-*) hasnt hatchkv "^/usr/share/doc/hatchkv/${f##*/}\$" ;;
	*) has hatchkv "/usr/share/doc/hatchkv/${f##*/}" ;;
	esac
done
for f in "$S"/packaging/systemd/*.service; do
	has hatchkv "/lib/systemd/system/${f##*/}"
	cmp -s "$f" "$tmp/root-hatchkv/lib/systemd/system/${f##*/}" || fail "${f##*/} differs from packaging/systemd/"
done
for u in hatchkv-server.service hatchkv-memcached.service hatchkv-member@.service; do
	has hatchkv "/lib/systemd/system/$u"
done
for f in "$S"/packaging/default/*; do
	has hatchkv "/etc/default/${f##*/}"
	cmp -s "$f" "$tmp/root-hatchkv/etc/default/${f##*/}" || fail "/etc/default/${f##*/} differs from packaging/default/"
done
for p in $pkgs; do
	if grep -E '/usr/local|test_|\.a$|/hkv-' "$tmp/list-$p"; then
		fail "$p holds /usr/local, test programs or static archives (above)"
	fi
done
pcvar() {
	PKG_CONFIG_SYSROOT_DIR='' PKG_CONFIG_LIBDIR="$tmp/root-libhatchkv-dev/$L/pkgconfig" PKG_CONFIG_PATH='' \
		pkg-config --variable="$1" hatchkv
}
[ "$(pcvar prefix)" = /usr ] || fail "hatchkv.pc's prefix is $(pcvar prefix), not /usr"
[ "$(pcvar libdir)" = "$L" ] || fail "hatchkv.pc's libdir is $(pcvar libdir), not $L (where the library is)"
[ "$(pcvar includedir)" = /usr/include ] || fail "hatchkv.pc's includedir is $(pcvar includedir)"

# copyright (DEP-5) and changelog: the same in every package; the
# changelog's latest entry is this version, by the Maintainer
for p in $pkgs; do
	d=$tmp/root-$p/usr/share/doc/$p
	head -n1 "$d/copyright" | grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
		fail "$p's copyright is not machine-readable (DEP-5): $(head -n1 "$d/copyright")"
	cmp -s "$d/copyright" "$S/packaging/debian/copyright" || fail "$p's copyright is not packaging/debian/copyright"
	gzip -dc "$d/changelog.Debian.gz" >"$tmp/changelog-$p" || fail "$p's changelog.Debian.gz is not gzip"
	cmp -s "$tmp/changelog-$p" "$S/packaging/debian/changelog" || fail "$p's changelog is not packaging/debian/changelog"
done
cl=$tmp/changelog-hatchkv
[ "$(dpkg-parsechangelog -l "$cl" -S Version)" = "$fver" ] ||
	fail "debian/changelog's latest entry is $(dpkg-parsechangelog -l "$cl" -S Version), the packages $fver"
[ "$(dpkg-parsechangelog -l "$cl" -S Maintainer)" = "$(dpkg-deb -f "$(deb hatchkv)" Maintainer)" ] ||
	fail "debian/changelog's latest entry is by $(dpkg-parsechangelog -l "$cl" -S Maintainer), not the Maintainer"

# -- control files
C=$tmp/control-hatchkv
for s in postinst prerm postrm; do
	[ -f "$C/$s" ] || fail "hatchkv has no $s"
	[ -x "$C/$s" ] || fail "$s is not executable"
	head -n1 "$C/$s" | grep -qx '#!/bin/sh' || fail "$s does not start with #!/bin/sh"
	sh -n "$C/$s" || fail "$s: sh -n finds a syntax error"
	if command -v dash >/dev/null; then dash -n "$C/$s" || fail "$s: dash -n finds a syntax error"; fi
	! grep -v '^\s*#' "$C/$s" | grep 'systemctl' | grep -v 'daemon-reload' ||
		fail "$s runs systemctl for more than daemon-reload (above): deb-systemd-invoke/-helper"
done
grep -q 'deb-systemd-helper update-state' "$C/postinst" || fail "postinst does not record the units' links (deb-systemd-helper update-state)"
grep -q 'deb-systemd-invoke stop' "$C/prerm" || fail "prerm does not stop the units with deb-systemd-invoke"
grep -q 'deb-systemd-helper purge' "$C/postrm" || fail "postrm does not purge the units' links (deb-systemd-helper purge)"
[ -f "$C/conffiles" ] || fail "hatchkv has no conffiles"
for f in "$S"/packaging/default/*; do
	grep -qx "/etc/default/${f##*/}" "$C/conffiles" || fail "/etc/default/${f##*/} is not a conffile"
done
while read -r f; do
	has hatchkv "$f"
done <"$C/conffiles"
C=$tmp/control-libhatchkv0
grep -qx 'activate-noawait ldconfig' "$C/triggers" 2>/dev/null || fail "libhatchkv0 has no ldconfig trigger"
grep -qx "libhatchkv 0 libhatchkv0 (>= $fver)" "$C/shlibs" 2>/dev/null ||
	fail "libhatchkv0's shlibs is not 'libhatchkv 0 libhatchkv0 (>= $fver)': $(cat "$C/shlibs" 2>/dev/null)"
[ ! -e "$tmp/control-libhatchkv-dev/postinst" ] || fail "libhatchkv-dev has a postinst"

# -- lintian: no error, no warning (overrides: packaging/lintian/PACKAGE)
# shellcheck disable=SC2046
if ! lintian --fail-on error,warning --tag-display-limit 0 $(for p in $pkgs; do deb "$p"; done) \
	>"$tmp/lintian.log" 2>&1; then
	grep -v 'running with root privileges' "$tmp/lintian.log" >&2
	fail "lintian finds errors or warnings in the packages (above)"
fi
note "lintian: no error, no warning"

# -- install, upgrade, remove, purge: only as root with a mount namespace
# and overlayfs; the throwaway root is this machine's / under an overlay
# whose upper layer is a tmpfs (the machine's files stay untouched)
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
	note "NOTE: no root or no mount namespace here: packages not installed"
	note "ok"
	exit 0
fi
if getent passwd hatchkv >/dev/null || [ -e /etc/hatchkv ] || [ -e /var/lib/hatchkv ] ||
	dpkg-query -W hatchkv libhatchkv0 >/dev/null 2>&1; then
	note "NOTE: this machine has a hatchkv user, /etc/hatchkv or the packages: not installed again"
	note "ok"
	exit 0
fi
mkdir "$tmp/probe"
# shellcheck disable=SC2016 # ($1 is the inner shell's)
if ! unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs "$1" &&
	mkdir "$1/u" "$1/w" "$1/r" &&
	mount -t overlay overlay -o "lowerdir=/,upperdir=$1/u,workdir=$1/w" "$1/r"' sh "$tmp/probe" 2>/dev/null; then
	note "NOTE: no overlayfs over / here: packages not installed"
	note "ok"
	exit 0
fi
# the same packages with release 2, to upgrade to
cpack_into "$tmp/out2" -D CPACK_DEBIAN_PACKAGE_RELEASE=$((release + 1))
fver2="$version-$((release + 1))"
cat >"$tmp/client.c" <<'CEOF'
/* a program of a user of libhatchkv-dev: set, then get */
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

	if (argc != 3 || !cfg || hkv_config_add_server(cfg, argv[1]) ||
	    hkv_config_set_token_file(cfg, argv[2]))
		return 2;
	ret = hkv_open(cfg, &c);
	if (!ret)
		ret = hkv_set(c, "packaged", 8, "works", 5, NULL);
	if (!ret)
		ret = hkv_get(c, "packaged", 8, buf, sizeof(buf), &n, NULL);
	if (ret) {
		printf("%s\n", hkv_strerror(ret));
		return 3;
	}
	printf("get packaged = %.*s\n", (int)n, buf);
	hkv_close(c);
	hkv_config_free(cfg);
	return n == 5 && !memcmp(buf, "works", 5) ? 0 : 4;
}
CEOF
cat >"$tmp/inside.sh" <<'IEOF'
#!/bin/sh
# in the throwaway root (chroot): dpkg on the packages in /debs
set -eu
ma=$1 fver=$2 fver2=$3 san=$4
fail() { echo "packaging_deb: FAIL (installed): $*" >&2; exit 1; }
say() { echo "packaging_deb: $*"; }
export PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive
W=/etc/systemd/system/multi-user.target.wants
S=/var/lib/systemd/deb-systemd-helper-enabled
status() { dpkg-query -W -f '${Version} ${db:Status-Abbrev}' "$1" 2>/dev/null | sed 's/ *$//'; }

dpkg -i /debs/1/libhatchkv0_*.deb /debs/1/libhatchkv-dev_*.deb /debs/1/hatchkv_*.deb \
	>/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log >&2; fail "dpkg -i of the three packages failed"; }
for p in libhatchkv0 libhatchkv-dev hatchkv; do
	[ "$(status $p)" = "$fver ii" ] || fail "$p is '$(status $p)' after dpkg -i, not '$fver ii'"
done
[ -f "/usr/lib/$ma/libhatchkv.so.0" ] || fail "no /usr/lib/$ma/libhatchkv.so.0"
ldconfig -p | grep -q "libhatchkv.so.0 .*/$ma/libhatchkv.so.0" || fail "ldconfig's cache lacks libhatchkv.so.0 (trigger)"
for m in hatchkv-server hatchkv-memcached hatchkv-admin hatchkv-bench; do
	[ -f "/usr/share/man/man1/$m.1.gz" ] || fail "no man page /usr/share/man/man1/$m.1.gz"
done
pw=$(getent passwd hatchkv) || fail "no user hatchkv"
uid=$(echo "$pw" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "hatchkv is not a system user (uid $uid)"
[ "$(id -gn hatchkv)" = hatchkv ] || fail "hatchkv's group is $(id -gn hatchkv)"
tok=/etc/hatchkv/hatchkv.token
[ "$(stat -c '%a %U %G' "$tok")" = "600 hatchkv hatchkv" ] ||
	fail "$tok is $(stat -c '%a %U %G' "$tok"), not 600 hatchkv hatchkv"
grep -Eqx '[0-9a-f]{32}' "$tok" || fail "$tok is not 32 hex digits"
[ "$(stat -c '%U' /var/lib/hatchkv)" = hatchkv ] || fail "/var/lib/hatchkv is not hatchkv's"
[ -f /etc/hatchkv/hatchkv.token.package ] || fail "no marker hatchkv.token.package beside the token"
before=$(cat "$tok")
# the units: recorded for purge, none enabled by the package
for u in hatchkv-server.service hatchkv-memcached.service; do
	[ -f "$S/$u.dsh-also" ] || fail "postinst did not record $u's links ($S/$u.dsh-also)"
	[ ! -e "$W/$u" ] || fail "the package enabled $u"
done

# the package's server, as hatchkv, on that token and a memory file in
# /var/lib/hatchkv; a client built with libhatchkv-dev's pkg-config alone
setpriv --reuid=hatchkv --regid=hatchkv --clear-groups --inh-caps=-all \
	/usr/bin/hatchkv-server --transport shm --socket /var/lib/hatchkv/t.sock \
	--token-file "$tok" --memory 16M --memory-file /var/lib/hatchkv/t.region \
	>/tmp/server.log 2>&1 &
pid=$!
i=0
until grep -q "server: ready" /tmp/server.log; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 $pid 2>/dev/null; then
		cat /tmp/server.log >&2
		kill $pid 2>/dev/null || true
		fail "the package's hatchkv-server, as hatchkv, did not start on postinst's token"
	fi
	sleep 0.1
done
if command -v cc >/dev/null && [ -z "$san" ]; then
	# shellcheck disable=SC2046
	cc -std=c11 -Wall -Werror -o /tmp/client /tmp/client.c $(pkg-config --cflags --libs hatchkv) \
		2>/tmp/cc.log || { cat /tmp/cc.log >&2; kill $pid; fail "a client does not build with pkg-config hatchkv"; }
	ldd /tmp/client | grep -q "libhatchkv.so.0 => /.*lib/$ma/libhatchkv.so.0" ||
		{ kill $pid; fail "the client does not load /usr/lib/$ma/libhatchkv.so.0: $(ldd /tmp/client | grep hatchkv)"; }
	out=$(setpriv --reuid=hatchkv --regid=hatchkv --clear-groups /tmp/client \
		shm:/var/lib/hatchkv/t.sock "$tok" 2>&1) || { echo "$out" >&2; kill $pid; fail "the client failed"; }
	say "client built with pkg-config hatchkv: $out"
fi
kill -TERM $pid
wait $pid || fail "hatchkv-server exited $? on SIGTERM"
[ "$(stat -c '%a %U' /var/lib/hatchkv/t.region)" = "600 hatchkv" ] || fail "memory file not 600 hatchkv"

# the administrator enables a unit and a member, and edits a conffile
systemctl enable hatchkv-server.service hatchkv-member@a.service >/dev/null 2>&1 ||
	fail "systemctl enable of the units failed"
[ -L "$W/hatchkv-server.service" ] && [ -L "$W/hatchkv-member@a.service" ] || fail "systemctl enable made no links"
echo 'OPTIONS="--memory 2G"' >>/etc/default/hatchkv-server

# upgrade: release 2 of the same version
dpkg -i /debs/2/libhatchkv0_*.deb /debs/2/libhatchkv-dev_*.deb /debs/2/hatchkv_*.deb \
	>/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log >&2; fail "dpkg -i of release 2 (upgrade) failed"; }
for p in libhatchkv0 libhatchkv-dev hatchkv; do
	[ "$(status $p)" = "$fver2 ii" ] || fail "$p is '$(status $p)' after the upgrade, not '$fver2 ii'"
done
[ "$(cat "$tok")" = "$before" ] || fail "the upgrade changed the token"
[ "$(getent passwd hatchkv | cut -d: -f3)" = "$uid" ] || fail "the upgrade changed hatchkv's uid"
[ -e "$W/hatchkv-server.service" ] || fail "the upgrade dropped hatchkv-server's enable link"
[ ! -e "$W/hatchkv-memcached.service" ] || fail "the upgrade enabled hatchkv-memcached"
tail -n1 /etc/default/hatchkv-server | grep -q -- '--memory 2G' || fail "the upgrade lost the edit of a conffile"

# remove: the programs and library go, configuration stays
dpkg -r hatchkv libhatchkv-dev libhatchkv0 >/tmp/dpkg.log 2>&1 ||
	{ cat /tmp/dpkg.log >&2; fail "dpkg -r failed"; }
for f in /usr/bin/hatchkv-server "/usr/lib/$ma/libhatchkv.so.0" /usr/include/hatchkv.h \
	/lib/systemd/system/hatchkv-server.service /usr/share/man/man1/hatchkv-server.1.gz; do
	[ ! -e "$f" ] || fail "dpkg -r left $f"
done
[ -f "$tok" ] && getent passwd hatchkv >/dev/null && [ -f /etc/default/hatchkv-server ] ||
	fail "dpkg -r took what only purge may (token, user, conffiles)"

# purge: configuration, user and enable links go; the memory file stays
dpkg -P hatchkv libhatchkv-dev libhatchkv0 >/tmp/dpkg.log 2>&1 ||
	{ cat /tmp/dpkg.log >&2; fail "dpkg -P failed"; }
grep -q 'kept /var/lib/hatchkv' /tmp/dpkg.log || fail "purge did not say it kept /var/lib/hatchkv"
for p in libhatchkv0 libhatchkv-dev hatchkv; do
	[ -z "$(status $p)" ] || [ "$(status $p | cut -d' ' -f2)" = pn ] || fail "$p is '$(status $p)' after purge"
done
[ ! -e /etc/hatchkv ] || fail "purge left /etc/hatchkv"
! getent passwd hatchkv >/dev/null || fail "purge left the user hatchkv"
! getent group hatchkv >/dev/null || fail "purge left the group hatchkv"
for f in /etc/default/hatchkv-server /etc/default/hatchkv-memcached /etc/default/hatchkv-member; do
	[ ! -e "$f" ] || fail "purge left the conffile $f"
done
left=$(find /etc/systemd /lib/systemd/system /usr/lib/systemd/system \( -name '*hatchkv*' -o -lname '*hatchkv*' \) 2>/dev/null)
[ -z "$left" ] || fail "purge left systemd links or units: $left"
[ -z "$(ls "$S" 2>/dev/null | grep hatchkv)" ] || fail "purge left deb-systemd-helper state: $(ls "$S" | grep hatchkv)"
[ -f /var/lib/hatchkv/t.region ] || fail "purge deleted the memory file (the stored items)"

# an empty /var/lib/hatchkv goes with the purge
dpkg -i /debs/2/libhatchkv0_*.deb /debs/2/hatchkv_*.deb >/tmp/dpkg.log 2>&1 ||
	{ cat /tmp/dpkg.log >&2; fail "dpkg -i after purge failed"; }
rm -f /var/lib/hatchkv/*
dpkg -P hatchkv libhatchkv0 >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log >&2; fail "dpkg -P (again) failed"; }
[ ! -e /var/lib/hatchkv ] || fail "purge left an empty /var/lib/hatchkv"
say "installed $fver, upgraded to $fver2 (token, uid, enable link, conffile edit kept), removed, purged:" \
	"no hatchkv unit link left, memory file kept"
IEOF
cat >"$tmp/sandbox.sh" <<'SEOF'
#!/bin/sh
# in the mount namespace: an overlay of / over a tmpfs, then chroot
set -eu
T=$1
shift
mount -t tmpfs tmpfs "$T/ovl"
mkdir "$T/ovl/upper" "$T/ovl/work" "$T/ovl/root"
R=$T/ovl/root
mount -t overlay overlay -o "lowerdir=/,upperdir=$T/ovl/upper,workdir=$T/ovl/work" "$R"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run" # (no /run/systemd/system: nothing started or stopped)
mount -t tmpfs tmpfs "$R/tmp"
mkdir -p "$R/debs/1" "$R/debs/2"
cp "$T"/out/*.deb "$R/debs/1/"
cp "$T"/out2/*.deb "$R/debs/2/"
cp "$T/inside.sh" "$T/client.c" "$R/tmp/"
rm -f "$R/var/lib/man-db/auto-update" # (no man-db index rebuilt on each dpkg run)
chroot "$R" sh /tmp/inside.sh "$@"
SEOF
mkdir "$tmp/ovl"
# (a sanitizer build's library needs its runtime first: no client then)
san=
case ${HKV_SANITIZE:-} in address|thread) san=$HKV_SANITIZE ;; esac
unshare -m --propagation private sh "$tmp/sandbox.sh" "$tmp" "$ma" "$fver" "$fver2" "$san" ||
	fail "the packages failed in the throwaway root (above)"
getent passwd hatchkv >/dev/null && fail "the sandbox leaked: this machine has a hatchkv user now"
dpkg-query -W hatchkv >/dev/null 2>&1 && fail "the sandbox leaked: this machine has the package hatchkv now"
note "ok"
