#!/usr/bin/env bash
# make powercut: the full power-loss sweep (docs/reliability.md, "Power
# loss"). Every durable path is cut before each of its operations on the
# powercut file system, under the strict model and then the ext4-ordered-like
# one, and the mutation proof runs; the "cut points" lines are printed, the
# total last. Needs FUSE (/dev/fuse and fusermount3: apt-get install fuse3).
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
go test -count=1 ./internal/powercut/ ./internal/fsutil/ >"$log" 2>&1 || status=$?
for model in strict ordered; do
	FM_POWERCUT_FULL=1 FM_POWERCUT_MODEL=$model go test -count=1 -timeout 0 -v -run '^TestPowerCut$' ./internal/reliability/ >>"$log" 2>&1 || status=$?
done
go test -count=1 -timeout 0 -v -run '^TestPowerCutMutations$' ./internal/reliability/ >>"$log" 2>&1 || status=$?
grep -E 'site [a-z-]+:|no swept path' "$log" | sed 's/^ *//' || true
if [ "$status" != 0 ]; then
	grep -E -- '--- FAIL|FAIL|powercut_test.go' "$log" | head -40
	echo "powercut: FAILED (exit $status)"
	exit "$status"
fi
grep -E 'powercut [a-z-]+ \(' "$log" | sed 's/^ *powercut_test.go:[0-9]*: //'
awk '/powercut total/ { match($0, /: [0-9]+ cut points/); n += substr($0, RSTART + 2, RLENGTH - 13) } END { printf "powercut all models: %d cut points, 0 violations\n", n }' "$log"
