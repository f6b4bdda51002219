#!/usr/bin/env bash
# bench/run.sh: measure fm against its physical floor, everything in one run,
# and print every figure (docs/performance.md explains each one).
#
#   bash bench/run.sh            # or: make bench
#
# Environment knobs: ROUNDS (alternating rounds per CLI comparison, 300),
# SOURCES (serve sources, 200), SOURCES_LARGE (the scale figures, 1000),
# SECONDS_MEASURED (serve window, 10; an idle window is at least serve's 30 s
# maintenance period), BIND_ROUNDS (20), NODE_ROUNDS (40),
# BENCHTIME (go test -benchtime for the launch/host pieces, 300x).
#
# Needs Go and, for everything about invocations, gcc (the trivial compiled
# entrypoint, internal/host/testdata/floor.c); without gcc those sections are
# skipped with a note. The Node figures need node: the script installs the
# Debian package nodejs when it is missing and it runs as root. Every
# comparison runs fm and its floor alternately in the same process, so load
# on the machine hits both sides; medians are reported. The summary repeats
# every figure, one "name: value" line each (docs/performance.md has the
# targets):
#   digest-vs-sha256sum, bind-1000-vs-floor, bind-60m-vs-floor,
#   invoke-vs-bare-exec, invoke-vs-design-floor, design-startups-ms (the
#   floor's fm version + 2 barriers), the last two again under two busy loops
#   (invoke-vs-design-floor-loaded, design-startups-loaded-ms),
#   poll-node-overhead-ms, poll-node-overhead-loaded-ms (and, for comparison
#   with earlier rounds, poll-node-files-floor-overhead-ms: the bare runs
#   given the request file and /dev/null instead of pipes), the loaded/quiet
#   ratios poll-node-loaded-vs-quiet and design-startups-loaded-vs-quiet,
#   serve-captures-per-second,
#   serve-cpu-per-child-cpu, serve-idle-cpu-percent, serve-idle-rss-kib,
#   serve-idle-1000-rss-kib, serve-idle-1000-cpu-percent, serve-stop-1000-ms,
#   confine-build-us, confine-cost-us (what confinement adds per launch)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-300}
SOURCES=${SOURCES:-200}
SECONDS_MEASURED=${SECONDS_MEASURED:-10}
BENCHTIME=${BENCHTIME:-300x}
SOURCES_LARGE=${SOURCES_LARGE:-1000}
BIND_ROUNDS=${BIND_ROUNDS:-20}
NODE_ROUNDS=${NODE_ROUNDS:-40}
summary=() # "name: value" lines, printed again at the end
# figure <output>: echo the output and keep its "name: number" figure lines.
figure() {
	echo "$1"
	local l
	while IFS= read -r l; do summary+=("$l"); done < <(sed 's/ (.*//' <<<"$1" | grep -E '^(digest|bind|invoke|poll|serve|design|confine)-[a-z0-9-]+: -?[0-9.]+$')
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fm-bench.XXXXXX")
cleanup() {
	chmod -R u+w "$tmp" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
unset FM_ROOT_OVERRIDE FM_STATE_OVERRIDE

section() { printf '\n== %s\n' "$*"; }
# metric <go-bench-line> <unit>: the value printed before unit.
metric() { awk -v u="$2" '{ for (i = 2; i <= NF; i++) if ($i == u) { print $(i-1); exit } }' <<<"$1"; }
ms() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e6 }'; }

section "machine"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "nproc: $(nproc)"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "kernel: $(uname -sr)"
fs=$(findmnt -n -o SOURCE,FSTYPE,OPTIONS -T "$tmp" 2>/dev/null || df -PT "$tmp" | awk 'NR == 2 { print $1, $2 }')
journal=""
case $fs in
*ext4*) dev=$(basename "$(awk '{ print $1 }' <<<"$fs")")
	[ -d "/proc/fs/ext4/$dev" ] && { ls /proc/fs/jbd2 2>/dev/null | grep -q "^$dev-" && journal=" (journal)" || journal=" (no journal)"; } ;;
esac
echo "temp dir: $tmp on $fs$journal"
echo "go: $(go version)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

section "build"
if [ -n "${FM:-}" ]; then
	# FM=<an fm binary>: measure that one (an earlier build, for before/after
	# figures from one script); the harness is still built from this tree.
	mkdir -p "$tmp/bin" && cp "$FM" "$tmp/bin/fm"
	fmbin=$tmp/bin/fm
else
	go build -o bin/fm ./cmd/fm
	fmbin=bin/fm
fi
go build -o "$tmp/fmbench" ./bench/fmbench
echo "fm: $fmbin, $(stat -c %s "$fmbin") bytes"

section "tree digest: 4,096 files / 64 MiB vs sha256sum over the same files"
line=$(go test -run '^$' -bench 'Scan/4096x16KiB' -benchtime 20x ./internal/pkgtree/ | grep '^BenchmarkScan')
echo "$line"
digest=$(metric "$line" fm/sha256sum-time)
echo "fm: $(metric "$line" fm-MB/s) MB/s; sha256sum: $(metric "$line" sha256sum-MB/s) MB/s (two sha256sum processes: $(metric "$line" sha256sum-P2-MB/s) MB/s)"
figure "digest-vs-sha256sum: $digest"

if ! command -v gcc >/dev/null; then
	section "invocations: SKIPPED (gcc is not installed; it builds the trivial compiled entrypoint)"
else
	# One throwaway home per entrypoint variant, each with the floor package
	# bound (org.example.floor@1.0.0, adapter "floor").
	floor_flags=(-Os -s)
	nolibc=(-Os -static -nostdlib -ffreestanding -fno-stack-protector -fno-pie -no-pie
		-fno-tree-loop-distribute-patterns -fno-asynchronous-unwind-tables -DFLOOR_NOLIBC
		-Wl,--build-id=none,-z,noseparate-code -s)
	if [ "$(uname -m)" = x86_64 ] && gcc "${nolibc[@]}" -o "$tmp/probe" internal/host/testdata/floor.c 2>/dev/null; then
		floor_flags=("${nolibc[@]}")
	elif gcc -Os -static -s -o "$tmp/probe" internal/host/testdata/floor.c 2>/dev/null; then
		floor_flags=(-Os -static -s)
	fi
	mkhome() { # mkhome <name> <extra gcc flags...>: prints the home
		local name=$1
		shift
		local d=$tmp/$name
		mkdir -p "$d/home" "$d/pkg/bin"
		chmod 700 "$d/home"
		gcc "${floor_flags[@]}" "$@" -o "$d/pkg/bin/floor" internal/host/testdata/floor.c
		cat >"$d/pkg/firstmate-extension.json" <<-'EOF'
			{"schema":"firstmate.extension-manifest.v1","id":"org.example.floor","version":"1.0.0","host_protocols":[1],"entrypoint":"bin/floor","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["floor"]}],"required_consents":[]}
		EOF
		chmod -R go-w "$d/pkg"
		FM_HOME=$d/home "$fmbin" extension bind "$d/pkg" --adapter floor --trust-same-user-code --timeout-ms 3600000 >/dev/null
		echo "$d/home"
	}
	invoke_home=$(mkhome invoke)
	echo
	echo "trivial entrypoint: $(stat -c %s "$tmp/invoke/pkg/bin/floor") bytes (gcc ${floor_flags[*]})"

	# The serve figures come first, before the sections that create and
	# remove files by the thousand (every one-shot call below unlinks its
	# owner records; each bind round removes a tree of 1,000 files): on ext4
	# without a journal every file created for the next ~30 s in nearby
	# inode groups searches past the inodes they freed (the kernel's
	# recently_deleted; docs/performance.md, "Eighth pass"), and serve's
	# figures would pay for the bench's own clean-up. The bind rounds come
	# last of all (bind and its floor, cp -a, pay that cost alike, but the
	# Node calls' owner records would not).

	section "serve with $SOURCES sources: captures per second, adapter answering at once"
	home=$(mkhome captures -DFLOOR_RESULT)
	figure "$(FM_HOME=$home "$tmp/fmbench" -fm "$fmbin" -adapter floor -sources "$SOURCES" -seconds "$SECONDS_MEASURED" serve-captures)"

	section "serve with $SOURCES sources: idle long-poll"
	home=$(mkhome idle -DFLOOR_LONGPOLL)
	figure "$(FM_HOME=$home "$tmp/fmbench" -fm "$fmbin" -adapter floor -sources "$SOURCES" -seconds "$SECONDS_MEASURED" serve-idle)"

	section "serve with $SOURCES_LARGE sources: idle long-poll (scale)"
	home=$(mkhome idle-large -DFLOOR_LONGPOLL)
	figure "$(FM_HOME=$home "$tmp/fmbench" -fm "$fmbin" -adapter floor -sources "$SOURCES_LARGE" -seconds "$SECONDS_MEASURED" -label "$SOURCES_LARGE" serve-idle)"



	section "one fm extension process-event ... source.poll (CLI, process start included) vs two bare execs"
	out=$(FM_HOME=$invoke_home "$tmp/fmbench" -fm "$fmbin" -adapter floor -n "$ROUNDS" -label poll-static invoke)
	figure "$out"
	cli_ms=$(sed -n 's/^invoke: fm process-event: median \([0-9.]*\) ms.*/\1/p' <<<"$out")
	bare2_ms=$(sed -n 's/^invoke: two bare execs: median \([0-9.]*\) ms.*/\1/p' <<<"$out")

	section "launch barrier (bin/fm re-executed) and fm start-up, vs a bare exec"
	bout=$(FM_HOME=$invoke_home "$tmp/fmbench" -fm "$fmbin" -adapter floor -n "$ROUNDS" barrier)
	echo "$bout"
	startup_ms=$(sed -n 's/^fm-startup: fm start-up and exit: median \([0-9.]*\) ms.*/\1/p' <<<"$bout")
	barrier_ms=$(sed -n 's/^barrier-overhead: \([0-9.]*\) ms/\1/p' <<<"$bout")

	section "the same call vs its design floor: fm version + 2 barriers (execve of a static exit) + 2 bare execs"
	gcc "${floor_flags[@]}" -DFLOOR_EXIT -o "$tmp/exit0" internal/host/testdata/floor.c
	figure "$(FM_HOME=$invoke_home "$tmp/fmbench" -fm "$fmbin" -adapter floor -exit "$tmp/exit0" -n "$ROUNDS" design)"
	section "the same with two busy loops competing for the two cores (what the design floor itself costs under load)"
	figure "$(FM_HOME=$invoke_home "$tmp/fmbench" -fm "$fmbin" -adapter floor -exit "$tmp/exit0" -n "$ROUNDS" -busy 2 -label loaded design)"

	section "confinement: what the Landlock ruleset adds per launch (enforce vs --confinement off; goal <= 100 us)"
	figure "$(FM_HOME=$invoke_home "$tmp/fmbench" -fm "$fmbin" -adapter floor -n "$ROUNDS" confine)"

	section "fm extension list, cold start (fresh process; target under 10 ms)"
	FM_HOME=$invoke_home "$tmp/fmbench" -fm "$fmbin" -n "$ROUNDS" list

	section "the pieces (go test -bench, in-process)"
	hline=$(go test -run '^$' -bench 'Invoke|Revalidate' -benchtime "$BENCHTIME" ./internal/host/ | grep '^Benchmark')
	echo "$hline"
	lline=$(go test -run '^$' -bench 'Run$|RecordWrite|Members' -benchtime "$BENCHTIME" ./internal/launch/ | grep '^Benchmark')
	echo "$lline"
	inv=$(grep '^BenchmarkInvoke' <<<"$hline")
	run=$(grep '^BenchmarkRun' <<<"$lline")
	reval=$(metric "$(grep '^BenchmarkRevalidate' <<<"$hline")" ns/op)
	span() { ms "$(metric "$run" "$1-ns/op")"; }

	section "where one process-event call goes (medians, ms)"
	printf '%-62s %8s\n' "whole CLI call (fmbench invoke)" "$cli_ms"
	printf '%-62s %8s\n' "  floor: two bare execs of the entrypoint" "$bare2_ms"
	printf '%-62s %8s\n' "in-process host.Invoke (BenchmarkInvoke fm-ns/op)" "$(ms "$(metric "$inv" fm-ns/op)")"
	printf '%-62s %8s\n' "  so fm start-up, CLI work (home, registry) and exit" "$(awk -v a="$cli_ms" -v b="$(ms "$(metric "$inv" fm-ns/op)")" 'BEGIN { printf "%.3f", a - b }')"
	printf '%-62s %8s\n' "  of which bare fm start-up and exit (runtime, init)" "$startup_ms"
	printf '%-62s %8s\n' "revalidation of the installed tree (once per call)" "$(ms "$reval")"
	echo "per launch (two per call: handshake, invoke; BenchmarkRun, barrier = launch.test):"
	printf '%-62s %8s\n' "  owner record, phase reserved (write + rename, no fsync)" "$(span record-reserve)"
	printf '%-62s %8s\n' "  barrier fork + execve" "$(span barrier-start)"
	printf '%-62s %8s\n' "  leader identity + owner record, phase group (exchange)" "$(span record-group)"
	printf '%-62s %8s\n' "  release, barrier start-up, execve, entrypoint to output" "$(span barrier-to-output)"
	printf '%-62s %8s\n' "  entrypoint exit, group proved gone, streams drained" "$(span exit-and-proof)"
	printf '%-62s %8s\n' "  owner record removed" "$(span record-remove)"
	printf '%-62s %8s\n' "barrier overhead with bin/fm, per launch (fmbench barrier)" "$barrier_ms"
	printf '%-62s %8s\n' "entrypoint exec itself, per launch (half the floor)" "$(awk -v a="$bare2_ms" 'BEGIN { printf "%.3f", a / 2 }')"
	printf '%-62s %8s\n' "group proof by /proc scan when needed (BenchmarkMembers)" "$(ms "$(metric "$(grep '^BenchmarkMembers' <<<"$lline")" ns/op)")"
	echo "(the invoke launch is prepared while the handshake runs, so the sum exceeds the whole)"

fi

if ! command -v node >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	section "installing nodejs (Debian package) for the Node figures"
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs; } >/dev/null 2>&1 || true
fi
if ! command -v node >/dev/null; then
	section "Node poll: SKIPPED (node is not installed)"
else
	section "one source.poll with a Node entrypoint (bench/node-adapter) minus two bare execs of it ($(node --version))"
	d=$tmp/node
	mkdir -p "$d/home"
	chmod 700 "$d/home"
	cp -R bench/node-adapter "$d/pkg"
	chmod -R go-w "$d/pkg"
	FM_HOME=$d/home "$fmbin" extension bind "$d/pkg" --adapter node-floor --trust-same-user-code >/dev/null
	figure "$(FM_HOME=$d/home "$tmp/fmbench" -fm "$fmbin" -adapter node-floor -n "$NODE_ROUNDS" -label poll-node invoke | grep -v '^invoke-vs-bare-exec')"
	section "the same with the bare runs given the request file and /dev/null (the floor of earlier rounds; node starts faster without pipes)"
	figure "$(FM_HOME=$d/home "$tmp/fmbench" -fm "$fmbin" -adapter node-floor -n "$NODE_ROUNDS" -floor-stdio files -label poll-node-files-floor invoke | grep -v '^invoke-vs-bare-exec')"
	section "the same with two busy loops competing for the two cores"
	figure "$(FM_HOME=$d/home "$tmp/fmbench" -fm "$fmbin" -adapter node-floor -n "$NODE_ROUNDS" -busy 2 -label poll-node-overhead-loaded invoke | grep -v '^invoke-vs-bare-exec' | sed 's/^poll-node-overhead-loaded-overhead-ms/poll-node-overhead-loaded-ms/')"
fi

# The bind rounds come last (see the note before the serve figures): each
# removes a tree of 1,000 files. They bind the floor package built above.
if [ -d "$tmp/invoke/pkg" ]; then
	section "bind: 1,000 files of 113 bytes in 10 directories vs cp -a + sync -f of the same tree"
	figure "$("$tmp/fmbench" -fm "$fmbin" -adapter floor -pkg "$tmp/invoke/pkg" -files 1000 -size 113 -dirs 10 -n "$BIND_ROUNDS" -warm 2 -label bind-1000 bind)"
	section "bind: 60 files of 1 MiB vs cp -a + sync -f of the same tree"
	figure "$("$tmp/fmbench" -fm "$fmbin" -adapter floor -pkg "$tmp/invoke/pkg" -files 60 -size 1048576 -dirs 1 -n "$BIND_ROUNDS" -warm 2 -label bind-60m bind)"
fi

# ratio <name> <numerator figure> <denominator figure>: one more summary line.
ratio() {
	local a b
	a=$(printf '%s\n' "${summary[@]}" | sed -n "s/^$2: //p")
	b=$(printf '%s\n' "${summary[@]}" | sed -n "s/^$3: //p")
	[ -n "$a" ] && [ -n "$b" ] && summary+=("$1: $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')")
	return 0
}
# Loaded over quiet: the Node call's overhead (target <= 2), and the same for
# the start-ups the design mandates (fm version + 2 barriers), which bound it.
ratio poll-node-loaded-vs-quiet poll-node-overhead-loaded-ms poll-node-overhead-ms
ratio design-startups-loaded-vs-quiet design-startups-loaded-ms design-startups-ms

section "summary (ratios are fm over its floor; see docs/performance.md for the targets)"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s\n' "${summary[@]}"
