package launch

import (
	"os"
	"syscall"
)

// BarrierArg is the hidden argv[1] that makes fm (or a test binary) act as the
// launch barrier [GRP-1].
const BarrierArg = "__fm-launch-barrier"

// barrierArgvArg is the hidden argv[1] of a barrier for a Spec with Argv:
// [exe, barrierArgvArg, path, argv...] execve's path with argv.
const barrierArgvArg = "__fm-launch-barrier-argv"

// releaseByte is the one byte the host writes to release the barrier.
const releaseByte = 'G'

// Exit statuses of a barrier that never became the entrypoint.
const (
	barrierNotReleased = 125 // no release byte: the host died or gave up
	barrierExecFailed  = 127 // execve of the entrypoint failed
)

// init runs the barrier before the rest of the program initialises: the
// launch barrier is on the path of every invocation, and the Go specification
// initialises the packages of a program in import-path order as far as their
// dependencies allow, so this package's init runs right after its few
// dependencies and before the packages that compile regular expressions or
// build tables at start-up (manifest, protocol, binding, cli, ...): those are
// never initialised in a barrier. Measured in docs/performance.md.
func init() { MaybeBarrier() }

// MaybeBarrier is the launch barrier's entry. This package's init already
// calls it, so every program that imports launch acts as the barrier when
// os.Args[1] is BarrierArg; main() and TestMain call it as well, first, to
// say so. If os.Args[1] is BarrierArg it runs the barrier and never returns;
// otherwise it returns at once.
//
// The barrier is the process Run starts in a new process group: argv is
// [exe, BarrierArg, entrypoint, verb], its environment and working directory
// are already the entrypoint's, and descriptor 3 is the read end of the
// release pipe. It blocks reading that descriptor. Only the exact release byte
// (which the host writes after the group's owner record is published) makes it
// close the descriptor and execve the entrypoint with argv [entrypoint, verb]
// and its own environment; execve keeps its pid, process group and start time,
// so the recorded leader identity is the entrypoint's. End of file (the host
// died: nobody else holds the write end) or any other byte makes it exit 125
// without running package code. There is no shell, no PATH search and no
// generated source. A Spec with Argv starts the barrier as
// [exe, barrierArgvArg, path, argv...] instead, and the release execve's path
// with exactly argv; everything else is the same.
func MaybeBarrier() {
	if len(os.Args) < 2 || (os.Args[1] != BarrierArg && os.Args[1] != barrierArgvArg) {
		return
	}
	os.Exit(barrier())
}

func barrier() int {
	var path string
	var argv []string
	switch {
	case os.Args[1] == BarrierArg && len(os.Args) == 4:
		path, argv = os.Args[2], []string{os.Args[2], os.Args[3]}
	case os.Args[1] == barrierArgvArg && len(os.Args) >= 4:
		// A Spec with Argv: execve path with exactly that argv.
		path, argv = os.Args[2], os.Args[3:]
	default:
		return barrierNotReleased
	}
	rel := os.NewFile(3, "release")
	var b [1]byte
	if n, _ := rel.Read(b[:]); n != 1 || b[0] != releaseByte {
		return barrierNotReleased
	}
	rel.Close()
	_ = syscall.Exec(path, argv, os.Environ())
	return barrierExecFailed
}
