package barrier

// sysExecveat is execveat's number on amd64, which the syscall package does
// not export there.
const sysExecveat = 322
