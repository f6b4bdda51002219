package testpkg

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Landlock's system call numbers, the same on every architecture.
const (
	sysLandlockFirst = 444 // landlock_create_ruleset
	sysLandlockLast  = 446 // landlock_restrict_self
)

// HideLandlock makes this process, every thread of it and everything it
// starts see a kernel without Landlock: a seccomp filter answers the three
// Landlock system calls with ENOSYS, as a kernel built without it does. It
// sets no-new-privileges, which a filter needs. The confinement tests run
// fm through it to show what enforce and strict do on such a kernel.
func HideLandlock() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // the system call's number
		{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, K: sysLandlockFirst, Jt: 0, Jf: 2},
		{Code: unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K, K: sysLandlockLast, Jt: 1, Jf: 0},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	if e != 0 {
		return e
	}
	return nil
}
