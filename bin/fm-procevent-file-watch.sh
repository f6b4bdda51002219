#!/bin/sh
# fm-procevent-file-watch.sh: the built-in "file-watch" process-event adapter.
#
# Built-in adapter interface (docs/procevent.md):
#   poll <absolute-file> [<wait-seconds>]
#       The source command: register it with
#         fm procevent register file-watch <source-id> -- <this script> poll /abs/file [secs]
#       Waits up to <wait-seconds> (default 55) for the file to exist and be
#       non-empty, then takes it (renames it aside, so it is reported once) and
#       prints its contents: exit 0 = a result. Nothing within the wait: exit
#       75 = no result. A file larger than 32768 bytes is left in place and
#       the poll fails (exit 65).
#   classify <source-id> <seq>   (the captured result on stdin)
#       prints "file-watch".
#   terminal <source-id> <seq>   (the captured result on stdin)
#       prints "true" when the result's first line is exactly "done".
#   silent <source-id> <seq>     (the captured result on stdin)
#       prints "true" when the result is blank (only white space).
# Verdicts print "true" or "false"; anything else counts as false.
set -eu

verb=${1-}
case $verb in
poll)
	file=${2-}
	wait=${3-55}
	case $file in
	/*) ;;
	*) echo "fm-procevent-file-watch: poll needs an absolute file path" >&2; exit 64 ;;
	esac
	case $wait in
	'' | *[!0-9]*) echo "fm-procevent-file-watch: wait must be whole seconds" >&2; exit 64 ;;
	esac
	waited=0
	while [ ! -s "$file" ]; do
		[ "$waited" -ge "$wait" ] && exit 75
		sleep 1
		waited=$((waited + 1))
	done
	if [ "$(wc -c <"$file")" -gt 32768 ]; then
		echo "fm-procevent-file-watch: $file is larger than 32768 bytes" >&2
		exit 65
	fi
	taken="$file.taken.$$"
	mv -f "$file" "$taken" || exit 75
	cat "$taken"
	rm -f "$taken"
	;;
classify)
	cat >/dev/null
	echo file-watch
	;;
terminal)
	if [ "$(head -n 1)" = done ]; then echo true; else echo false; fi
	;;
silent)
	if [ -z "$(tr -d ' \t\r\n')" ]; then echo true; else echo false; fi
	;;
*)
	echo "usage: fm-procevent-file-watch.sh poll <absolute-file> [<wait-seconds>] | classify|terminal|silent <source-id> <seq>" >&2
	exit 64
	;;
esac
