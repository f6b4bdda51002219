#!/usr/bin/env bash
# Runs every fuzz target for a few seconds, so CI keeps the seed corpora and
# a short search alive. Longer runs: FUZZTIME=10m bash scripts/fuzz-short.sh
#
# A target that fails prints its log. A failure that saved a crasher under
# testdata/fuzz/ is a finding and fails the run; one that saved nothing (the
# fuzzing engine's own worker hang or time-out on a loaded machine) is retried
# once, and fails the run if it happens again.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-4s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz $pkg $target ($t)"
		for try in 1 2; do
			if go test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$t" >"$log" 2>&1; then
				break
			fi
			tail -n 40 "$log"
			if [ -n "$(git status --porcelain -- "$dir/testdata/fuzz/$target")" ] || [ "$try" = 2 ]; then
				echo "fuzz $pkg $target: FAILED"
				exit 1
			fi
			echo "fuzz $pkg $target: failed without a crasher; retrying once"
		done
	done
done
