#!/bin/sh
# test_units.sh BUILD SRC - the systemd units of packaging/systemd, offline
# (no running systemd): `systemd-analyze verify` in a scratch root laid out
# as the hatchkv .deb installs them (units in /lib/systemd/system, the
# programs in /usr/bin, the man pages their Documentation= names, systemd's
# own units for the targets they name), where any message
# about a hatchkv unit fails, not only a fatal one (verify exits 0 on a
# misspelt key or a bad value it ignores); a unit spoiled on purpose must
# fail it. Then what the units promise (User=hatchkv, LimitMEMLOCK=infinity,
# Restart=on-failure, EnvironmentFile=-/etc/default/NAME with $OPTIONS, the
# hardening, no PrivateDevices=/PrivateNetwork=), and every option in an
# ExecStart= and in the /etc/default files is one the program accepts.
set -eu
B=$(cd "$1" && pwd)
S=$(cd "$2" && pwd)
name=packaging_units
fail() { echo "$name: FAIL: $*" >&2; exit 1; }
note() { echo "$name: $*"; }

command -v systemd-analyze >/dev/null ||
	fail "systemd-analyze is missing: scripts/install-deps installs the systemd package"
[ -d /lib/systemd/system ] && [ -f /lib/systemd/system/multi-user.target ] ||
	fail "no /lib/systemd/system/multi-user.target (package systemd)"
tmp=$(mktemp -d /tmp/hkv-units.XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM
U=$S/packaging/systemd
D=$S/packaging/default
units="hatchkv-server.service hatchkv-memcached.service hatchkv-member@.service"
for u in $units; do
	[ -f "$U/$u" ] || fail "no packaging/systemd/$u"
done

R=$tmp/root
mkdir -p "$R/lib/systemd/system" "$R/usr/lib/systemd/system" "$R/usr/bin" "$R/etc/default"
cp -a /lib/systemd/system/. "$R/usr/lib/systemd/system/" # the targets the units name
for p in hatchkv-server hatchkv-memcached; do
	[ -x "$B/bin/$p" ] || fail "no $B/bin/$p: build the tree first"
	cp "$B/bin/$p" "$R/usr/bin/"
done
cp "$D"/* "$R/etc/default/"
# the man pages the units' Documentation= names, as the package installs
# them (verify runs man on each: MANPATH is this root's alone; without
# man-db, --man=no)
man=--man=yes
command -v man >/dev/null || man=--man=no
mkdir -p "$R/usr/share/man/man1"
for m in "$S"/docs/man/*.1; do
	gzip -9n -c "$m" >"$R/usr/share/man/man1/${m##*/}.gz"
done

# verify NAME... : the unit files in $R/lib/systemd/system, in root $R;
# fails on any message naming a hatchkv unit
verify() {
	rc=0
	out=$(MANPATH="$R/usr/share/man" systemd-analyze verify "$man" --root="$R" "$@" 2>&1) || rc=$?
	bad=$(echo "$out" | grep -i hatchkv || true)
	if [ $rc -ne 0 ] || [ -n "$bad" ]; then
		echo "$out"
		return 1
	fi
	return 0
}
for u in $units; do
	cp "$U/$u" "$R/lib/systemd/system/"
done
# a template is verified through an instance of it
out=$(verify hatchkv-server.service hatchkv-memcached.service hatchkv-member@a1.service) ||
	{ echo "$out" >&2; fail "systemd-analyze verify finds the problems above"; }
note "systemd-analyze verify: hatchkv-server, hatchkv-memcached, hatchkv-member@a1: clean"

# The check must be able to fail: each spoilt copy must be caught.
cp "$U/hatchkv-server.service" "$tmp/good"
for spoil in 's/^LimitMEMLOCK=.*/LimitMEMLOCK=lots/' \
	     's/^NoNewPrivileges=/NoNewPrivilege=/' \
	     's|^ExecStart=/usr/bin/hatchkv-server|ExecStart=/usr/bin/hatchkv-serve|' \
	     's/^ProtectSystem=strict/ProtectSystem=strikt/'; do
	sed "$spoil" "$tmp/good" >"$R/lib/systemd/system/hatchkv-server.service"
	cmp -s "$tmp/good" "$R/lib/systemd/system/hatchkv-server.service" &&
		fail "spoiling with '$spoil' changed nothing (fix the test)"
	if verify hatchkv-server.service >/dev/null; then
		fail "systemd-analyze verify passes a unit spoilt with '$spoil': the check cannot fail"
	fi
done
cp "$tmp/good" "$R/lib/systemd/system/hatchkv-server.service"
note "spoilt units caught: bad value, misspelt key, missing program, bad ProtectSystem"

# What each unit promises.
want() { # want UNIT REGEX WHY
	grep -Eq "$2" "$U/$1" || fail "$1: no line matching '$2' ($3)"
}
for u in $units; do
	base=${u%.service}
	base=${base%@}
	want "$u" "^EnvironmentFile=-/etc/default/$base\$" "its options file, optional"
	[ -f "$D/$base" ] || fail "$u reads /etc/default/$base, which packaging/default/ lacks"
	want "$u" '^ExecStart=/usr/bin/hatchkv-[a-z]+ .*\$OPTIONS' "options from the env file"
	want "$u" '^User=hatchkv$' "runs as the package's user"
	want "$u" '^LimitMEMLOCK=infinity$' "the region / buffers are pinned for the NIC"
	want "$u" '^Restart=on-failure$' "restart on failure"
	want "$u" '^NoNewPrivileges=yes$' "hardening"
	want "$u" '^ProtectSystem=strict$' "hardening"
	want "$u" '^ProtectHome=yes$' "hardening"
	want "$u" '^PrivateTmp=yes$' "hardening"
	want "$u" '^WantedBy=multi-user.target$' "systemctl enable"
	if grep -Eq '^(PrivateDevices|PrivateNetwork|DevicePolicy|ProtectClock|PrivateUsers)=' "$U/$u"; then
		fail "$u sets $(grep -E '^(PrivateDevices|PrivateNetwork|DevicePolicy|ProtectClock|PrivateUsers)=' "$U/$u"): that breaks RDMA (/dev/infiniband, the NIC)"
	fi
done
for u in hatchkv-server.service hatchkv-member@.service; do
	want "$u" '^RuntimeDirectory=hatchkv$' "/run/hatchkv for the shm sockets"
	want "$u" '^RuntimeDirectoryPreserve=yes$' "/run/hatchkv is shared: one unit's stop must not remove it"
	want "$u" '^ReadWritePaths=/var/lib/hatchkv /run/hatchkv$' "writable state and runtime"
	want "$u" '^ExecStart=.* --token-file /etc/hatchkv/hatchkv.token ' "postinst's token"
done
want hatchkv-member@.service '^EnvironmentFile=-/etc/default/hatchkv-member-%i$' "a member's own options"
want hatchkv-member@.service '^ExecStart=.* --id %i ' "the member's name is the instance"

# systemd's own score of the hardening (offline), where it can give one
if systemd-analyze security --help 2>&1 | grep -q -- '--offline'; then
	for u in hatchkv-server.service hatchkv-memcached.service hatchkv-member@a1.service; do
		out=$(systemd-analyze security --offline=yes --root="$R" --threshold=50 "$u" 2>&1) ||
			{ echo "$out" | tail -n 5 >&2; fail "$u: exposure above 5.0 (hardening lost?)"; }
		note "$(echo "$out" | grep 'Overall exposure' | sed 's/ *[^ ]*$//')"
	done
fi

# Every option the units and env files pass is one the program knows: the
# command line (fixed options, then the shipped OPTIONS / CLUSTER with %i
# as "a1") must parse; --help at its end exits 0 after parsing the rest.
cmdline() { # cmdline UNIT ENVFILE: the ExecStart words, expanded as systemd would
	(
		OPTIONS= CLUSTER= MEMBER_OPTIONS= ETCD_OPTIONS=
		# shellcheck disable=SC1090
		. "$2"
		line=$(sed -n 's/^ExecStart=//p' "$U/$1" | sed "s/%i/a1/g")
		line=$(echo "$line" | sed "s|\${CLUSTER}|$CLUSTER|g")
		eval "set -- $line"
		echo "$@"
	)
}
check_opts() { # check_opts UNIT ENVFILE
	line=$(cmdline "$1" "$2")
	prog=$(echo "$line" | awk '{print $1}')
	args=${line#"$prog"}
	[ -x "$B/bin/${prog##*/}" ] || fail "$1: ExecStart runs $prog, not one of the programs built"
	# shellcheck disable=SC2086
	out=$("$B/bin/${prog##*/}" $args --help 2>&1) ||
		{ echo "$out" | head -n 5 >&2; fail "$1 with $2: '${prog##*/}$args' does not parse"; }
	for o in $(echo "$args" | grep -oE -- '--[a-z-]+'); do
		echo "$out" | grep -q -- "$o" || fail "$1: $o is not in ${prog##*/} --help"
	done
}
check_opts hatchkv-server.service "$D/hatchkv-server"
check_opts hatchkv-memcached.service "$D/hatchkv-memcached"
check_opts hatchkv-member@.service "$D/hatchkv-member"
# the options in the env files' commented examples are real too
for f in hatchkv-server:hatchkv-server hatchkv-memcached:hatchkv-memcached hatchkv-member:hatchkv-server; do
	env=${f%%:*} prog=${f#*:}
	help=$("$B/bin/$prog" --help 2>&1)
	for o in $(grep '^#' "$D/$env" | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
		echo "$help" | grep -q -- "$o" || fail "/etc/default/$env mentions $o, which $prog --help does not list"
	done
	grep -Eq '^OPTIONS=' "$D/$env" || fail "/etc/default/$env sets no OPTIONS="
done
# HKV_LOG named in the env files must be one of common/log.c's levels
grep -ho '^#\?HKV_LOG=[a-z]*' "$D"/* | sed 's/.*=//' | while read -r lvl; do
	case $lvl in error|warn|info|debug) ;; *) fail "HKV_LOG=$lvl is no level of common/log.c" ;; esac
done
note "ok: units verified, options of ExecStart and /etc/default known to the programs"
