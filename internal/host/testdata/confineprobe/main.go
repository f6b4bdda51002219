// Command confineprobe is the Go package of the confinement tests
// (internal/host confine_test.go): it tries each thing a binding's consents
// allow or refuse and prints name=ok or name=<errno> for each.
//
// Usage: confineprobe <secret file> <tcp port> <outside pid> <file to write>
package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
)

func main() {
	secret, port, pid, target := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	var out []string
	try := func(name string, err error) {
		var e syscall.Errno
		switch {
		case err == nil:
			out = append(out, name+"=ok")
		case errors.As(err, &e):
			out = append(out, name+"="+errName(e))
		default:
			out = append(out, name+"=other")
		}
	}
	_, err := os.ReadFile(secret)
	try("secret", err)
	try("write", os.WriteFile(target, nil, 0o600))
	try("state", os.WriteFile(os.Getenv("FIRSTMATE_EXTENSION_STATE")+"/probe", nil, 0o600))
	f, err := os.CreateTemp("", "probe")
	if err == nil {
		f.Close()
		err = os.Remove(f.Name())
	}
	try("tmp", err)
	try("devnull", os.WriteFile("/dev/null", []byte("x"), 0o600))
	c, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err == nil {
		c.Close()
	}
	try("tcp", err)
	var n int
	fmt.Sscan(pid, &n)
	try("kill", syscall.Kill(n, 0))
	_, err = os.ReadFile("/etc/hostname")
	try("etc", err)
	fmt.Print(strings.Join(out, " "))
}

func errName(e syscall.Errno) string {
	switch e {
	case syscall.EACCES:
		return "EACCES"
	case syscall.EPERM:
		return "EPERM"
	case syscall.ECONNREFUSED:
		return "ECONNREFUSED"
	case syscall.ENOENT:
		return "ENOENT"
	}
	return fmt.Sprintf("errno%d", int(e))
}
