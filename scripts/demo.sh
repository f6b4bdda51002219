#!/usr/bin/env bash
# The main job, end to end, on a throwaway home: bind the example package,
# register a source, capture a signal, classify it, handle it, retire the
# source and the binding. Every command is printed before it runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fm=$root/bin/fm
[ -x "$fm" ] || (cd "$root" && go build -o bin/fm ./cmd/fm)

tmp=$(mktemp -d /tmp/fm-demo.XXXXXX)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
export FM_HOME=$tmp/home
mkdir -m 700 "$FM_HOME"
unset FM_ROOT_OVERRIDE FM_STATE_OVERRIDE

run() { printf '\n$ %s\n' "$*" >&2; "$@"; }

# The package must live outside any Git tree and outside the home.
mkdir "$tmp/pkg"
cp -R "$root/examples/process-event-extension/." "$tmp/pkg/"

chmod -R go-w "$tmp/pkg"

out=$(run "$fm" extension bind "$tmp/pkg" --adapter file-signal --trust-same-user-code --consent artifact-references)
echo "$out"
digest=$(echo "$out" | sed -n 's/^binding-digest: //p')
id=$(echo "$out" | sed -n 's/^bound: \(.*\)@.*/\1/p')

run "$fm" extension list
run "$fm" extension verify

out=$(run "$fm" procevent register-extension file-signal demo --config-ref "file:$tmp/signal")
echo "$out"
token=$(echo "$out" | sed -n 's/^owner-token: //p')

echo "build 42 is green" >"$tmp/signal"
out=$(run "$fm" procevent start demo)
echo "$out"
result=$(echo "$out" | sed -n 's/^captured: //p')
[ -n "$result" ] || { echo "demo: nothing was captured" >&2; exit 1; }

run "$fm" wake list
run "$fm" procevent inbox
run "$fm" procevent classify "$result"
run "$fm" procevent handled demo 1
run "$fm" procevent retire demo --if-owner "$token"
run "$fm" extension retire-binding "$id" --if-binding-digest "$digest"
run "$fm" extension list
echo
echo "demo: ok"
