#!/bin/sh
# The confinement tests' entrypoint: the poll's config_ref is
# "<language> <secret file> <tcp port> <outside pid> <file to write>"; the probe of that
# language (lib/) runs under the invocation's confinement and its line is
# the poll's output.
req=$(cat)
rid=$(printf '%s' "$req" | sed -n 's/.*"request_id":"\(sha256:[0-9a-f]*\)".*/\1/p')
if [ "$1" = handshake ]; then
	printf '{"adapter_names":["a"],"capability":"process-event-adapter","capability_version":1,"extension_id":"%s","extension_version":"%s","host_protocol":1,"request_id":"%s","schema":"firstmate.extension-handshake-response.v1"}' "$FIRSTMATE_EXTENSION_ID" "$FIRSTMATE_EXTENSION_VERSION" "$rid"
	exit 0
fi
set -- $(printf '%s' "$req" | sed -n 's/.*"config_ref":"\([^"]*\)".*/\1/p')
lang=$1
shift
case $lang in
sh) out=$(sh ./lib/probe.sh "$@") ;;
python) out=$(python3 ./lib/probe.py "$@" 2>&1) ;;
node) out=$(node ./lib/probe.js "$@" 2>&1) ;;
go) out=$(./lib/confineprobe "$@" 2>&1) ;;
fail) exit 3 ;;
esac
out=$(printf '%s' "$out" | tr -d '"\\' | tr '\n' ' ')
printf '{"error":null,"ok":true,"request_id":"%s","result":{"output":"%s","status":"result"},"schema":"firstmate.extension-response.v1"}' "$rid" "$out"
