package barrier

import "syscall"

// sysExecveat is execveat's number on arm64.
const sysExecveat = syscall.SYS_EXECVEAT
