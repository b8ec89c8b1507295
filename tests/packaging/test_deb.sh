#!/bin/sh
# test_deb.sh BUILD SRC - the Debian package CPack makes of this tree
# (packaging/package.cmake): its name and version, its dependencies, its
# files (programs, libhatchkv with its soname link, headers, a .pc for
# /usr, units and /etc/default files as in packaging/, docs), its control
# files (conffiles, ldconfig trigger, maintainer scripts that pass sh -n).
# As root with a mount namespace, the maintainer scripts also run against a
# private copy of /etc and /var/lib: postinst makes the user, the token
# (32 hex digits, 0600, owned by hatchkv, kept by a second run) and
# /var/lib/hatchkv; the package's hatchkv-server, run as hatchkv, accepts
# that token and a --memory-file there; postrm purge removes them all.
# The package is never installed on this machine.
set -eu
B=$(cd "$1" && pwd)
S=$(cd "$2" && pwd)
name=packaging_deb
fail() { echo "$name: FAIL: $*" >&2; exit 1; }
note() { echo "$name: $*"; }

tmp=$(mktemp -d /tmp/hkv-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM

[ -f "$B/CPackConfig.cmake" ] || fail "no $B/CPackConfig.cmake (packaging/package.cmake not included?)"
(cd "$B" && cpack -G DEB --config "$B/CPackConfig.cmake" -B "$tmp/out") >"$tmp/cpack.log" 2>&1 ||
	{ cat "$tmp/cpack.log" >&2; fail "cpack -G DEB failed"; }
set -- "$tmp"/out/*.deb
[ $# -eq 1 ] && [ -f "$1" ] || fail "cpack made not one .deb: $*"
deb=$1
note "built ${deb##*/} ($(wc -c <"$deb") bytes)"

# -- control fields
version=$(sed -n 's/^project(hatchkv VERSION \([0-9.]*\).*/\1/p' "$S/CMakeLists.txt")
[ "$(dpkg-deb -f "$deb" Package)" = hatchkv ] || fail "package name is '$(dpkg-deb -f "$deb" Package)'"
case $(dpkg-deb -f "$deb" Version) in
"$version"|"$version"-*) ;;
*) fail "version $(dpkg-deb -f "$deb" Version) is not the project's $version" ;;
esac
[ "$(dpkg-deb -f "$deb" Architecture)" = "$(dpkg --print-architecture)" ] ||
	fail "architecture $(dpkg-deb -f "$deb" Architecture)"
[ -n "$(dpkg-deb -f "$deb" Maintainer)" ] || fail "no Maintainer"
depends=$(dpkg-deb -f "$deb" Depends)
note "Depends: $depends"
# every library the programs and libhatchkv load, by its Debian 12 package;
# the verbs providers (dlopen'ed) and adduser (postinst)
need="libc6 libibverbs1 librdmacm1 libevent-core-2.1-7 libsodium23 libjson-c5 ibverbs-providers adduser"
case ${HKV_SANITIZE:-} in address|thread) ;; *) [ "${HKV_JEMALLOC:-ON}" = OFF ] || need="$need libjemalloc2" ;; esac
for p in $need; do
	echo "$depends" | tr ',' '\n' | sed 's/^ *//; s/ .*//; s/|.*//' | grep -qx "$p" ||
		fail "Depends lacks $p: $depends"
done
# and every shared library a packaged ELF file needs is one of them (one
# dpkg -S for all: it reads every package's file list)
dpkg-deb -x "$deb" "$tmp/root"
for f in "$tmp"/root/usr/bin/* "$tmp"/root/usr/lib/libhatchkv.so.0; do
	objdump -p "$f" | awk '$1 == "NEEDED" {print $2}'
done | sort -u | grep -v '^libhatchkv\.so' >"$tmp/needed"
: >"$tmp/paths"
while read -r lib; do
	path=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
	[ -n "$path" ] || fail "$lib (needed by the package's programs) is not in ldconfig's cache"
	path=$(readlink -f "$path")
	# merged /usr: dpkg may know the file under /lib or under /usr/lib
	echo "$path ${path#/usr}" >>"$tmp/paths"
done <"$tmp/needed"
# shellcheck disable=SC2046
dpkg -S $(cat "$tmp/paths") >"$tmp/owners" 2>/dev/null || true
while read -r path alias; do
	pkg=$(grep -E ": ($path|$alias)\$" "$tmp/owners" | head -n1 | sed 's/:.*//')
	[ -n "$pkg" ] || fail "no package owns $path (needed by the package's programs)"
	echo "$depends" | tr ',' '\n' | sed 's/^ *//; s/ .*//' | grep -qx "$pkg" ||
		fail "the package's programs need $path of $pkg, which Depends does not name"
done <"$tmp/paths"
note "libraries needed: $(tr '\n' ' ' <"$tmp/needed")"

# -- files
dpkg-deb -c "$deb" | awk '{s = $6; for (i = 7; i <= NF; i++) s = s " " $i; print s}' |
	sed 's|^\./|/|' >"$tmp/list"
has() { grep -q "^$1\$" "$tmp/list" || fail "the package lacks $1"; }
for f in hatchkv-server hatchkv-memcached hatchkv-admin hatchkv-bench; do
	has "/usr/bin/$f"
	[ -x "$tmp/root/usr/bin/$f" ] || fail "/usr/bin/$f is not executable"
done
real=$(cd "$tmp/root/usr/lib" && ls libhatchkv.so.*.*.*)
has "/usr/lib/$real"
has "/usr/lib/libhatchkv.so.0 -> $real"
has "/usr/lib/libhatchkv.so -> libhatchkv.so.0"
has /usr/include/hatchkv.h
has /usr/include/hatchkv_err.h
has /usr/lib/pkgconfig/hatchkv.pc
has /usr/share/doc/hatchkv/README.md
for f in "$S"/docs/*.md; do
	case ${f##*/} in
	proposal-*) ! grep -q "^/usr/share/doc/hatchkv/${f##*/}\$" "$tmp/list" ||
		fail "the package ships the working paper ${f##*/}" ;;
	*) has "/usr/share/doc/hatchkv/${f##*/}" ;;
	esac
done
for f in "$S"/packaging/systemd/*.service; do
	has "/lib/systemd/system/${f##*/}"
	cmp -s "$f" "$tmp/root/lib/systemd/system/${f##*/}" || fail "${f##*/} differs from packaging/systemd/"
done
for u in hatchkv-server.service hatchkv-memcached.service hatchkv-member@.service; do
	has "/lib/systemd/system/$u"
done
for f in "$S"/packaging/default/*; do
	has "/etc/default/${f##*/}"
	cmp -s "$f" "$tmp/root/etc/default/${f##*/}" || fail "/etc/default/${f##*/} differs from packaging/default/"
done
if grep -E '/usr/local|test_|\.a$|/hkv-' "$tmp/list"; then
	fail "the package holds /usr/local, test programs or static archives (above)"
fi
pc=$tmp/root/usr/lib/pkgconfig/hatchkv.pc
grep -qx 'prefix=/usr' "$pc" || fail "hatchkv.pc does not say prefix=/usr: $(grep prefix= "$pc")"
pcvar() {
	PKG_CONFIG_SYSROOT_DIR= PKG_CONFIG_LIBDIR="$tmp/root/usr/lib/pkgconfig" PKG_CONFIG_PATH= \
		pkg-config --variable="$1" hatchkv
}
[ "$(pcvar libdir)" = /usr/lib ] || fail "hatchkv.pc's libdir is $(pcvar libdir), not /usr/lib (where the library is)"
[ "$(pcvar includedir)" = /usr/include ] || fail "hatchkv.pc's includedir is $(pcvar includedir)"

# -- control files
dpkg-deb -e "$deb" "$tmp/control"
C=$tmp/control
for s in postinst prerm postrm; do
	[ -f "$C/$s" ] || fail "no $s"
	[ -x "$C/$s" ] || fail "$s is not executable"
	head -n1 "$C/$s" | grep -qx '#!/bin/sh' || fail "$s does not start with #!/bin/sh"
	sh -n "$C/$s" || fail "$s: sh -n finds a syntax error"
	if command -v dash >/dev/null; then dash -n "$C/$s" || fail "$s: dash -n finds a syntax error"; fi
done
[ -f "$C/conffiles" ] || fail "no conffiles"
for f in "$S"/packaging/default/*; do
	grep -qx "/etc/default/${f##*/}" "$C/conffiles" || fail "/etc/default/${f##*/} is not a conffile"
done
while read -r f; do
	has "$f"
done <"$C/conffiles"
grep -qx 'activate-noawait ldconfig' "$C/triggers" 2>/dev/null || fail "no ldconfig trigger"
grep -q '^libhatchkv 0 hatchkv' "$C/shlibs" 2>/dev/null || fail "no shlibs line for libhatchkv 0"

# -- the maintainer scripts, run: only as root, in a mount namespace of
# their own over copies of /etc and /var/lib (the machine's stay untouched)
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
	note "NOTE: no root or no mount namespace here: maintainer scripts checked with sh -n only"
	note "ok"
	exit 0
fi
if getent passwd hatchkv >/dev/null || [ -e /etc/hatchkv ] || [ -e /var/lib/hatchkv ]; then
	note "NOTE: this machine has a hatchkv user or /etc/hatchkv: maintainer scripts not run"
	note "ok"
	exit 0
fi
chmod 0755 "$tmp" # hatchkv runs the package's server from $tmp/root
cat >"$tmp/sandbox.sh" <<'SEOF'
#!/bin/sh
# in the mount namespace: /etc and /var/lib are copies
set -eu
C=$1 R=$2 T=$3
fail() { echo "packaging_deb: FAIL (maintainer scripts): $*" >&2; exit 1; }
cp -a /etc "$T/etc"
mkdir "$T/varlib"
mount --bind "$T/etc" /etc
mount --bind "$T/varlib" /var/lib
mount -t tmpfs tmpfs /run # (no /run/systemd/system: no systemctl)

"$C/postinst" configure || fail "postinst configure failed"
getent group hatchkv >/dev/null || fail "no group hatchkv"
pw=$(getent passwd hatchkv) || fail "no user hatchkv"
uid=$(echo "$pw" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "hatchkv is not a system user (uid $uid)"
[ "$(id -gn hatchkv)" = hatchkv ] || fail "hatchkv's group is $(id -gn hatchkv)"
tok=/etc/hatchkv/hatchkv.token
[ -f "$tok" ] || fail "no $tok"
[ "$(stat -c '%a %U %G' "$tok")" = "600 hatchkv hatchkv" ] ||
	fail "$tok is $(stat -c '%a %U %G' "$tok"), not 600 hatchkv hatchkv"
grep -Eqx '[0-9a-f]{32}' "$tok" || fail "$tok is not 32 hex digits: $(cat "$tok")"
[ "$(wc -l <"$tok")" -eq 1 ] || fail "$tok is not one line"
[ "$(stat -c '%U' /var/lib/hatchkv)" = hatchkv ] || fail "/var/lib/hatchkv is not hatchkv's"
[ -f /etc/hatchkv/hatchkv.token.package ] || fail "no marker hatchkv.token.package beside the token it made"
[ -z "$(ls -A /etc/hatchkv | grep -v '^hatchkv.token\(.package\)\?$')" ] || fail "leftovers in /etc/hatchkv: $(ls -A /etc/hatchkv)"
before=$(cat "$tok")
"$C/postinst" configure || fail "a second postinst configure failed"
[ "$(cat "$tok")" = "$before" ] || fail "a second postinst changed the token"

# the package's server, as hatchkv, takes that token and a memory file
# in /var/lib/hatchkv (both must be hatchkv's and 0600, or it refuses)
setpriv --reuid=hatchkv --regid=hatchkv --clear-groups --inh-caps=-all \
	"$R/usr/bin/hatchkv-server" --transport shm --socket /var/lib/hatchkv/t.sock \
	--token-file "$tok" --memory 16M --memory-file /var/lib/hatchkv/t.region \
	>"$T/server.log" 2>&1 &
pid=$!
i=0
until grep -q "server: ready" "$T/server.log"; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 $pid 2>/dev/null; then
		cat "$T/server.log" >&2
		kill $pid 2>/dev/null || true
		fail "the package's hatchkv-server, as hatchkv, did not start on postinst's token"
	fi
	sleep 0.1
done
kill -TERM $pid
wait $pid || fail "hatchkv-server exited $? on SIGTERM"
[ "$(stat -c '%a %U' /var/lib/hatchkv/t.region)" = "600 hatchkv" ] || fail "memory file not 600 hatchkv"

"$C/prerm" remove || fail "prerm remove failed"
"$C/postrm" remove || fail "postrm remove failed"
[ -f "$tok" ] && getent passwd hatchkv >/dev/null || fail "postrm remove took what only purge may"
"$C/postrm" purge || fail "postrm purge failed"
[ ! -e /etc/hatchkv ] || fail "postrm purge left /etc/hatchkv"
[ -f /var/lib/hatchkv/t.region ] || fail "postrm purge deleted the memory file (the stored items)"
rm -rf /var/lib/hatchkv
mkdir /var/lib/hatchkv
"$C/postrm" purge 2>/dev/null || fail "postrm purge (again) failed"
[ ! -e /var/lib/hatchkv ] || fail "postrm purge left an empty /var/lib/hatchkv"
! getent passwd hatchkv >/dev/null || fail "postrm purge left the user hatchkv"
! getent group hatchkv >/dev/null || fail "postrm purge left the group hatchkv"
echo "packaging_deb: maintainer scripts: user uid $uid, token 600 hatchkv (32 hex), server started as hatchkv on it; purge removed the token and user, kept the memory file"
SEOF
unshare -m --propagation private sh "$tmp/sandbox.sh" "$C" "$tmp/root" "$tmp" ||
	fail "the maintainer scripts failed in the sandbox (above)"
getent passwd hatchkv >/dev/null && fail "the sandbox leaked: this machine has a hatchkv user now"
note "ok"
