#!/usr/bin/env bash
# Runs every fuzz target for a few seconds, so CI keeps the seed corpora and
# a short search alive. Longer runs: FUZZTIME=10m bash scripts/fuzz-short.sh
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-4s}
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz $pkg $target ($t)"
		go test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$t" >/dev/null
	done
done
