#!/usr/bin/env bash
# The long crash-injection run (docs/reliability.md): SIGKILLs every mutating
# fm command at FM_CRASH_POINTS randomized points (default 2000) and checks the
# invariants after each one. CI runs the same test with 200 points.
#   FM_CRASH_POINTS   effective kills to reach (default 2000)
#   FM_CRASH_WORKERS  homes killed in parallel (default 2)
#   FM_CRASH_SEED     replay the delays of an earlier run (printed by every run)
#   FM_TEST_BIN       an fm binary to test instead of building one
set -euo pipefail
cd "$(dirname "$0")/.."
export FM_CRASH_POINTS=${FM_CRASH_POINTS:-2000}
log=$(mktemp /tmp/fm-crash.XXXXXX)
trap 'rm -f "$log"' EXIT
if go test ./internal/reliability -run '^TestCrashInjection$' -count=1 -v -timeout 0 >"$log" 2>&1; then
	grep -E '^(crash-injection|  [a-z-]+ +killed|  debris)' "$log"
	grep -o 'crash seed [0-9]*' "$log" | head -1
else
	cat "$log"
	exit 1
fi
