//go:build ppc64 || ppc64le

package barrier

// sysExecveat is execveat's number on ppc64, which the syscall package does
// not export there.
const sysExecveat = 362
