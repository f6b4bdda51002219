#!/usr/bin/env bash
# Runs every test package again as an unprivileged user (uid/gid 65534),
# because root hides permission bugs: root can write into 0555 directories,
# rename them across parents and read 0600 files of others.
#
# Test binaries are compiled as the caller, then run by setpriv from a
# world-readable copy of the source tree (the clone may sit under a private
# directory), with TMPDIR and HOME owned by the unprivileged user.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "test-unprivileged: not root; the normal run already was unprivileged"
	exit 0
fi
command -v setpriv >/dev/null || { echo "test-unprivileged: setpriv is missing (util-linux)"; exit 1; }

work=$(mktemp -d /tmp/fm-unpriv.XXXXXX)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
chmod 755 "$work"
mkdir -p "$work/src" "$work/bin" "$work/tmp"
git ls-files -z | xargs -0 cp --parents -t "$work/src"
chmod -R a+rX "$work/src" "$work/bin"
chown 65534:65534 "$work/tmp"
go build -o "$work/src/bin/fm" ./cmd/fm
chmod 755 "$work/src/bin/fm"

status=0 passed=0 failed=0
for pkg in $(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do
	rel=${pkg#firstmate.dev/fm}
	rel=${rel#/}
	name=$(echo "${rel:-root}" | tr / _)
	go test -c -o "$work/bin/$name.test" "./$rel"
	chmod 755 "$work/bin/$name.test"
	if (cd "$work/src/$rel" && setpriv --reuid=65534 --regid=65534 --clear-groups \
		env -i PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin TMPDIR="$work/tmp" HOME="$work/tmp" \
		FM_TEST_BIN="$work/src/bin/fm" "$work/bin/$name.test" -test.count=1 -test.timeout=10m >"$work/out" 2>&1); then
		echo "ok (uid 65534)   $pkg"
		passed=$((passed + 1))
	else
		cat "$work/out"
		echo "FAIL (uid 65534) $pkg"
		failed=$((failed + 1))
		status=1
	fi
done
echo "unprivileged: $passed passed, $failed failed"
exit $status
