package launch

import (
	"os"
	"syscall"
)

// BarrierArg is the hidden argv[1] that makes fm (or a test binary) act as the
// launch barrier [GRP-1].
const BarrierArg = "__fm-launch-barrier"

// releaseByte is the one byte the host writes to release the barrier.
const releaseByte = 'G'

// Exit statuses of a barrier that never became the entrypoint.
const (
	barrierNotReleased = 125 // no release byte: the host died or gave up
	barrierExecFailed  = 127 // execve of the entrypoint failed
)

// MaybeBarrier must be the first call in main() and in TestMain of any package
// whose tests launch. If os.Args[1] is BarrierArg it runs the barrier and never
// returns; otherwise it returns at once.
//
// The barrier is the process Run starts in a new process group: argv is
// [exe, BarrierArg, entrypoint, verb], its environment and working directory
// are already the entrypoint's, and descriptor 3 is the read end of the
// release pipe. It blocks reading that descriptor. Only the exact release byte
// (which the host writes after the group's owner record is durable) makes it
// close the descriptor and execve the entrypoint with argv [entrypoint, verb]
// and its own environment; execve keeps its pid, process group and start time,
// so the recorded leader identity is the entrypoint's. End of file (the host
// died: nobody else holds the write end) or any other byte makes it exit 125
// without running package code. There is no shell, no PATH search and no
// generated source.
func MaybeBarrier() {
	if len(os.Args) < 2 || os.Args[1] != BarrierArg {
		return
	}
	os.Exit(barrier())
}

func barrier() int {
	if len(os.Args) != 4 {
		return barrierNotReleased
	}
	rel := os.NewFile(3, "release")
	var b [1]byte
	if n, _ := rel.Read(b[:]); n != 1 || b[0] != releaseByte {
		return barrierNotReleased
	}
	rel.Close()
	path, verb := os.Args[2], os.Args[3]
	_ = syscall.Exec(path, []string{path, verb}, os.Environ())
	return barrierExecFailed
}
