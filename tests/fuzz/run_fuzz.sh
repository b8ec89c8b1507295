#!/bin/sh
# run_fuzz.sh BINARY CORPUS SECONDS - run one libFuzzer target for SECONDS
# over a copy of its seed corpus (the source tree is never written), with
# crash artifacts in the same temporary folder. Prints
#   "<target>: N executions in S s"
# and exits non-zero on any crash, leak, timeout or sanitizer report, after
# printing the offending input in hex (and keeping it in /var/tmp).
set -u
bin=$1 corpus=$2 secs=$3
name=$(basename "$bin")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hkv-$name.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/corpus" "$tmp/artifacts"
cp "$corpus"/* "$tmp/corpus/" 2>/dev/null
"$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$tmp/artifacts/" "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/log" | tail -n1)
if [ "$rc" -ne 0 ]; then
  tail -n 80 "$tmp/log"
  for f in "$tmp"/artifacts/*; do
    [ -f "$f" ] || continue
    keep=/var/tmp/hkv-fuzz-$name-$(basename "$f")
    cp "$f" "$keep"
    echo "== failing input ($keep), hex:"
    od -An -tx1 -v "$f" | head -n 64
  done
fi
echo "$name: ${execs:-0} executions in $secs s (exit $rc)"
exit "$rc"
