#!/bin/sh
# A fake package entrypoint for the CLI tests. Its behaviour for each verb is
# chosen by the file $FIRSTMATE_EXTENSION_STATE/mode-<verb> (default "good"),
# so one installed package (one digest) can play every hostile part; for an
# invoke, $FIRSTMATE_EXTENSION_STATE/mode-invoke.<source-id> overrides it for
# one source. It logs each request and its environment into the state
# directory.
state=$FIRSTMATE_EXTENSION_STATE
req=$(cat)
printf '%s\n' "$req" >>"$state/requests"
env | grep -v -e "^PWD=" -e "^OLDPWD=" -e "^SHLVL=" -e "^_=" | sort >"$state/env-$1"
rid=$(printf '%s' "$req" | sed -n 's/.*"request_id":"\(sha256:[0-9a-f]*\)".*/\1/p')
src=$(printf '%s' "$req" | sed -n 's/.*"source_id":"\([A-Za-z0-9._-]*\)".*/\1/p')
mode=good
[ -f "$state/mode-$1" ] && mode=$(cat "$state/mode-$1")
[ -n "$src" ] && [ -f "$state/mode-$1.$src" ] && mode=$(cat "$state/mode-$1.$src")

if [ "$1" = handshake ]; then
	names=$(printf '%s' "$req" | sed -n 's/.*"adapter_names":\(\[[^]]*\]\).*/\1/p')
	body='"adapter_names":'"$names"',"capability":"process-event-adapter","capability_version":1,"extension_id":"'"$FIRSTMATE_EXTENSION_ID"'","extension_version":"'"$FIRSTMATE_EXTENSION_VERSION"'","host_protocol":1,"schema":"firstmate.extension-handshake-response.v1"'
	case $mode in
	good) printf '{%s,"request_id":"%s"}' "$body" "$rid" ;;
	slow)
		# answer well after 3 s, having said so in $state/handshaking: a
		# test acts while a bind holds the lifecycle lock [LIFE-1].
		: >"$state/handshaking"
		sleep 3
		printf '{%s,"request_id":"%s"}' "$body" "$rid" ;;
	big-output) ok '{"output":"'"$(head -c 32769 /dev/zero | tr '\0' a)"'","status":"result"}' ;;
bad-status) ok '{"output":"x","status":"maybe"}' ;;
null-result) ok null ;;
ok-false-bad-code) printf '{"error":{"code":"teapot","diagnostic":"d","retryable":false},"ok":false,"request_id":"%s","result":null,"schema":"firstmate.extension-response.v1"}' "$rid" ;;
wrong-id) printf '{%s,"request_id":"sha256:%064d"}' "$body" 0 ;;
	extra-field) printf '{%s,"request_id":"%s","force":true}' "$body" "$rid" ;;
	duplicate-key) printf '{%s,"request_id":"%s","request_id":"%s"}' "$body" "$rid" "$rid" ;;
	malformed) printf '{%s,"request_id":"%s"' "$body" "$rid" ;;
	exit9) exit 9 ;;
	hang) sleep 30 ;;
	linger)
		# answer well, then keep running (an open watcher would): the host
		# must say it answered but did not exit.
		printf '{%s,"request_id":"%s"}' "$body" "$rid"
		sleep 30 ;;
	script)
		# run $state/script (package code, in the installed copy), then
		# answer well; the script's exit ends the handshake.
		. "$state/script"
		printf '{%s,"request_id":"%s"}' "$body" "$rid" ;;
	tamper)
		# answer well, but first change this installed entrypoint (mode
		# restored): the invoke that follows must not run [INV-1].
		chmod u+w "$0" && echo "# tampered" >>"$0" && chmod 0555 "$0"
		printf '{%s,"request_id":"%s"}' "$body" "$rid" ;;
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
echo)
	# like keep, but the output names the poll's source and request id, so a
	# captured result proves which sequence's poll produced it [RID-1].
	case $req in
	*'"operation":"source.poll"'*) ok '{"output":"event '"$src $rid"'","status":"result"}' ;;
	*'"operation":"result.classify"'*) ok '{"classification":"fake-signal"}' ;;
	*) ok '{"value":false}' ;;
	esac ;;
signal | signal:*)
	# a file-signal adapter that replays by request id: a poll answers the
	# signal an earlier attempt with the same request id took
	# ($state/taken.<request-id>), else takes $state/signal.<source-id> by
	# renaming it to that name, else waits up to the seconds after "signal:"
	# for one (0.5 s steps), else no-result. The output is the signal's text
	# (no quotes or backslashes), a space and the request id. Verdicts as keep.
	case $req in
	*'"operation":"source.poll"'*)
		n=0
		case $mode in signal:*) n=$((${mode#signal:} * 2)) ;; esac
		while [ ! -f "$state/taken.$rid" ] && ! mv "$state/signal.$src" "$state/taken.$rid" 2>/dev/null && [ "$n" -gt 0 ]; do
			sleep 0.5
			n=$((n - 1))
		done
		if [ -f "$state/taken.$rid" ]; then
			ok '{"output":"'"$(cat "$state/taken.$rid") $rid"'","status":"result"}'
		else
			ok '{"output":"","status":"no-result"}'
		fi ;;
	*'"operation":"result.classify"'*) ok '{"classification":"fake-signal"}' ;;
	*) ok '{"value":false}' ;;
	esac ;;
stderr-fail)
	# a line on stderr with an escape sequence and a byte that is not UTF-8,
	# then exit 7.
	printf 'boom \033[31mred\377 at line 3\n' >&2
	exit 7 ;;
verdict-fail)
	# like keep, but the terminal and silent verdicts fail (exit 7).
	case $req in
	*'"operation":"source.poll"'*) ok '{"output":"kept result","status":"result"}' ;;
	*'"operation":"result.classify"'*) ok '{"classification":"fake-signal"}' ;;
	*) exit 7 ;;
	esac ;;
no-result) ok '{"output":"","status":"no-result"}' ;;
big-output) ok '{"output":"'"$(head -c 32769 /dev/zero | tr '\0' a)"'","status":"result"}' ;;
bad-status) ok '{"output":"x","status":"maybe"}' ;;
null-result) ok null ;;
ok-false-bad-code) printf '{"error":{"code":"teapot","diagnostic":"d","retryable":false},"ok":false,"request_id":"%s","result":null,"schema":"firstmate.extension-response.v1"}' "$rid" ;;
wrong-id) printf '{"error":null,"ok":true,"request_id":"sha256:%064d","result":{"output":"x","status":"result"},"schema":"firstmate.extension-response.v1"}' 0 ;;
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
linger) ok '{"output":"x","status":"result"}'; sleep 30 ;;
hang-child)
	# a TERM-ignoring child, then a hang: only a group KILL ends both.
	(trap '' TERM; sleep 60) &
	echo $! >"$state/child.tmp" && mv "$state/child.tmp" "$state/child"
	sleep 60 ;;
leak-child)
	(trap '' TERM; sleep 30) &
	echo $! >"$state/child"
	ok '{"output":"x","status":"result"}' ;;
tamper)
	# answer well, but first change this installed entrypoint in place (mode
	# restored): the answer must be refused, and the binding from then on
	# [INV-1]. $0 is /dev/fd/3, the very file the host verified and ran.
	chmod u+w "$0" && echo "# tampered" >>"$0" && chmod 0555 "$0"
	ok '{"output":"x","status":"result"}' ;;
ok-false) printf '{"error":{"code":"unavailable","diagnostic":"SECRET-DIAGNOSTIC-TEXT","retryable":true},"ok":false,"request_id":"%s","result":null,"schema":"firstmate.extension-response.v1"}' "$rid" ;;
esac
