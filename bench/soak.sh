#!/usr/bin/env bash
# The serve soak (docs/reliability.md): fm procevent serve over
# FM_SOAK_SOURCES sources (default 100) for FM_SOAK_DURATION (default 10m)
# while a driver writes signals, marks results handled, retires and registers
# sources, and SIGKILLs and restarts serve; then it checks that nothing was
# lost, no wake was repeated without a reason and no process group was left.
# CI runs a 12 s smoke version of the same code (TestSoakSmoke).
#   FM_TEST_BIN  an fm binary to test instead of building one
set -euo pipefail
cd "$(dirname "$0")/.."
export FM_SOAK=1 FM_SOAK_DURATION=${FM_SOAK_DURATION:-10m} FM_SOAK_SOURCES=${FM_SOAK_SOURCES:-100}
log=$(mktemp /tmp/fm-soak.XXXXXX)
trap 'rm -f "$log"' EXIT
if go test ./internal/reliability -run '^TestSoak$' -count=1 -v -timeout 0 >"$log" 2>&1; then
	grep '^soak:' "$log"
else
	cat "$log"
	exit 1
fi
