#!/bin/sh
# Fake process-event adapter for the procevent tests. Its behaviour per
# operation comes from $FIRSTMATE_EXTENSION_STATE/mode-<operation> (poll,
# classify, terminal, silent); a file mode-poll.<source-id> overrides mode-poll
# for one source. It appends "<operation> <source-id> <request-id>" to
# $state/log for every invoke, the whole request to $state/requests, and its
# pid (= its process group) to $state/pids.
#
# poll modes: result (default; output "event <source-id> <request-id>"),
#   text:<output>, no-result, crash, exit7, hang, malformed, ok-false,
#   debug-line (a stray debug line on stdout before a good answer),
#   unknown-key (a result with an extra member "debug"),
#   noisy-fail (two lines on stderr, one with an escape sequence, then exit 3),
#   stderr-flood (9,000 bytes on stderr, then a result),
#   gate (write $state/started.<source-id>, wait for $state/release, result),
#   inherit (write its pid to $state/inherit.pid, then exec sleep 3),
#   slow (record start and end times in $state/times, sleep 2, result),
#   rendezvous (as slow, but instead of sleeping wait until as many sources
#   as $state/rendezvous names have started a poll, at most 60 s),
#   file (the result object is the content of $state/poll-result, verbatim).
# classify: the token in mode-classify (default fake-class).
# handshake: timed (record start and end times in $state/times, as slow
#   does, under the name hs<pid>, around a 0.3 s sleep); else answer at once.
# terminal, silent: true or false (default false), crash, or slow-true (sleep
#   4 s, then true).
state=$FIRSTMATE_EXTENSION_STATE
req=$(cat)
field() { printf '%s' "$req" | sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p"; }
rid=$(field request_id)

if [ "$1" = handshake ]; then
	if [ "$(cat "$state/mode-handshake" 2>/dev/null)" = timed ]; then
		echo "start hs$$ $(date +%s.%N)" >>"$state/times"
		sleep 0.3
		echo "end hs$$ $(date +%s.%N)" >>"$state/times"
	fi
	names=$(printf '%s' "$req" | sed -n 's/.*"adapter_names":\(\[[^]]*\]\).*/\1/p')
	printf '{"adapter_names":%s,"capability":"process-event-adapter","capability_version":1,"extension_id":"%s","extension_version":"%s","host_protocol":1,"request_id":"%s","schema":"firstmate.extension-handshake-response.v1"}' \
		"$names" "$FIRSTMATE_EXTENSION_ID" "$FIRSTMATE_EXTENSION_VERSION" "$rid"
	exit 0
fi

op=$(field operation)
op=${op#*.}
src=$(field source_id)
echo "$op $src $rid" >>"$state/log"
printf '%s\n' "$req" >>"$state/requests"
echo "$$" >>"$state/pids"
mode=
[ -f "$state/mode-$op.$src" ] && mode=$(cat "$state/mode-$op.$src")
[ -z "$mode" ] && [ -f "$state/mode-$op" ] && mode=$(cat "$state/mode-$op")

ok() { printf '{"error":null,"ok":true,"request_id":"%s","result":%s,"schema":"firstmate.extension-response.v1"}' "$rid" "$1"; }
result() { ok "{\"output\":\"$1\",\"status\":\"result\"}"; }

case $op:$mode in
poll: | poll:result) result "event $src $rid" ;;
poll:text:*) result "${mode#text:}" ;;
poll:no-result) ok '{"output":"","status":"no-result"}' ;;
poll:file) ok "$(cat "$state/poll-result")" ;;
poll:crash) kill -KILL $$ ;;
poll:exit7) exit 7 ;;
poll:hang) sleep 60 ;;
poll:malformed) printf '{"error":null,"ok":true,' ;;
poll:debug-line) echo "polling $src"; result "event $src $rid" ;;
poll:noisy-fail) printf 'traceback: boom\n\033[2Jbad\tline\n' >&2; exit 3 ;;
poll:stderr-flood) head -c 9000 /dev/zero | tr '\0' e >&2; result "event $src $rid" ;;
poll:unknown-key) ok '{"debug":"PACKAGE-VALUE-TEXT","output":"x","status":"result"}' ;;
poll:ok-false) printf '{"error":{"code":"unavailable","diagnostic":"PACKAGE-SECRET-TEXT","retryable":true},"ok":false,"request_id":"%s","result":null,"schema":"firstmate.extension-response.v1"}' "$rid" ;;
poll:inherit)
	# for the inheritance test: publish this process's pid, then become
	# sleep (which opens nothing) so the test can read what it inherited.
	echo $$ >"$state/inherit.tmp" && mv "$state/inherit.tmp" "$state/inherit.pid"
	exec sleep 3 ;;
poll:gate)
	: >"$state/started.$src"
	i=0
	while [ ! -f "$state/release" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
	result "event $src $rid" ;;
poll:slow)
	echo "start $src $(date +%s.%N)" >>"$state/times"
	sleep 2
	echo "end $src $(date +%s.%N)" >>"$state/times"
	result "event $src $rid" ;;
poll:rendezvous)
	echo "start $src $(date +%s.%N)" >>"$state/times"
	: >"$state/arrived.$src" # after its start line: no poll ends before every start is written
	want=$(cat "$state/rendezvous")
	i=0
	while [ $i -lt 300 ]; do
		set -- "$state"/arrived.*
		[ $# -ge "$want" ] && break
		sleep 0.2
		i=$((i + 1))
	done
	echo "end $src $(date +%s.%N)" >>"$state/times"
	result "event $src $rid" ;;
classify:) ok '{"classification":"fake-class"}' ;;
classify:*) ok "{\"classification\":\"$mode\"}" ;;
terminal:crash | silent:crash) exit 7 ;;
terminal:slow-true | silent:slow-true) sleep 4; ok '{"value":true}' ;;
terminal: | silent:) ok '{"value":false}' ;;
terminal:* | silent:*) ok "{\"value\":$mode}" ;;
esac
