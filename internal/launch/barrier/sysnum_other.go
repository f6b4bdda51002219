//go:build arm64 || loong64 || riscv64 || s390x

package barrier

import "syscall"

// sysExecveat is execveat's number, which the syscall package exports on
// these architectures.
const sysExecveat = syscall.SYS_EXECVEAT
