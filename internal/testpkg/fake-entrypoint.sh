#!/bin/sh
# A fake package entrypoint for the CLI tests. Its behaviour for each verb is
# chosen by the file $FIRSTMATE_EXTENSION_STATE/mode-<verb> (default "good"),
# so one installed package (one digest) can play every hostile part. It logs
# each request and its environment into the state directory.
state=$FIRSTMATE_EXTENSION_STATE
req=$(cat)
printf '%s\n' "$req" >>"$state/requests"
env | grep -v -e "^PWD=" -e "^OLDPWD=" -e "^SHLVL=" -e "^_=" | sort >"$state/env-$1"
rid=$(printf '%s' "$req" | sed -n 's/.*"request_id":"\(sha256:[0-9a-f]*\)".*/\1/p')
mode=good
[ -f "$state/mode-$1" ] && mode=$(cat "$state/mode-$1")

if [ "$1" = handshake ]; then
	names=$(printf '%s' "$req" | sed -n 's/.*"adapter_names":\(\[[^]]*\]\).*/\1/p')
	body='"adapter_names":'"$names"',"capability":"process-event-adapter","capability_version":1,"extension_id":"'"$FIRSTMATE_EXTENSION_ID"'","extension_version":"'"$FIRSTMATE_EXTENSION_VERSION"'","host_protocol":1,"schema":"firstmate.extension-handshake-response.v1"'
	case $mode in
	good) printf '{%s,"request_id":"%s"}' "$body" "$rid" ;;
	wrong-id) printf '{%s,"request_id":"sha256:%064d"}' "$body" 0 ;;
	extra-field) printf '{%s,"request_id":"%s","force":true}' "$body" "$rid" ;;
	duplicate-key) printf '{%s,"request_id":"%s","request_id":"%s"}' "$body" "$rid" "$rid" ;;
	malformed) printf '{%s,"request_id":"%s"' "$body" "$rid" ;;
	exit9) exit 9 ;;
	esac
	exit 0
fi

ok() { printf '{"error":null,"ok":true,"request_id":"%s","result":%s,"schema":"firstmate.extension-response.v1"}' "$rid" "$1"; }
case $mode in
good)
	case $req in
	*'"operation":"source.poll"'*) ok '{"output":"hello from fake","status":"result"}' ;;
	*'"operation":"result.classify"'*) ok '{"classification":"fake-signal"}' ;;
	*) ok '{"value":true}' ;;
	esac ;;
keep)
	# like good, but neither silent nor terminal: the result stays unhandled
	# and the registration stays.
	case $req in
	*'"operation":"source.poll"'*) ok '{"output":"kept result","status":"result"}' ;;
	*'"operation":"result.classify"'*) ok '{"classification":"fake-signal"}' ;;
	*) ok '{"value":false}' ;;
	esac ;;
no-result) ok '{"output":"","status":"no-result"}' ;;
bom) printf '\357\273\277'; ok '{"output":"x","status":"result"}' ;;
bad-utf8) ok '{"output":"'"$(printf '\377')"'","status":"result"}' ;;
control) ok '{"output":"a'"$(printf '\001')"'b","status":"result"}' ;;
two-documents) ok '{"output":"x","status":"result"}'; ok '{"output":"x","status":"result"}' ;;
unknown-field) ok '{"output":"x","path":"/etc/passwd","status":"result"}' ;;
flood-stdout) head -c 70000 /dev/zero | tr '\0' 'a'; sleep 30 ;;
flood-stderr) head -c 9000 /dev/zero | tr '\0' 'e' >&2; sleep 30 ;;
exit7) exit 7 ;;
self-kill) kill -KILL $$ ;;
hang) sleep 30 ;;
leak-child)
	(trap '' TERM; sleep 30) &
	echo $! >"$state/child"
	ok '{"output":"x","status":"result"}' ;;
ok-false) printf '{"error":{"code":"unavailable","diagnostic":"SECRET-DIAGNOSTIC-TEXT","retryable":true},"ok":false,"request_id":"%s","result":null,"schema":"firstmate.extension-response.v1"}' "$rid" ;;
esac
