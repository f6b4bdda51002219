package launch

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
)

// Identity names one process exactly: its pid, its kernel start time (field
// 22 of /proc/<pid>/stat, clock ticks since boot) and the boot it ran in. A
// pid alone is reused; pid plus start time plus boot id is not [GRP-4].
type Identity struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	BootID    string `json:"boot_id"`
}

// BootID returns this boot's /proc/sys/kernel/random/boot_id, checked to
// be the kernel's form: the third part of every Identity, and of every
// owner record's name.
func BootID() (string, error) { return bootID() }

var bootID = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "read boot id")
	}
	id := strings.TrimSpace(string(b))
	if !validBootID(id) {
		return "", errcode.New(errcode.Internal, "malformed boot id in /proc/sys/kernel/random/boot_id")
	}
	return id, nil
})

// validBootID accepts the kernel's boot id form: 36 characters, lower-case
// hex in groups 8-4-4-4-12.
func validBootID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// selfIdentity is the identity of this process, written into every record it
// owns as the host.
var selfIdentity = sync.OnceValues(func() (Identity, error) {
	boot, err := BootID()
	if err != nil {
		return Identity{}, err
	}
	pid := os.Getpid()
	st, err := procstat.Read(pid)
	if err != nil {
		return Identity{}, errcode.Wrap(errcode.Internal, err, "read own process identity")
	}
	return Identity{PID: pid, StartTime: st.Start, BootID: boot}, nil
})

// alive reports whether the exact process named by id still runs: same boot,
// same pid, same start time, and not a zombie.
func alive(id Identity) (bool, error) {
	boot, err := BootID()
	if err != nil {
		return false, err
	}
	if id.BootID != boot {
		return false, nil
	}
	st, err := procstat.Read(id.PID)
	if errors.Is(err, procstat.ErrNoProcess) {
		return false, nil
	}
	if err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "read process %d", id.PID)
	}
	return st.Start == id.StartTime && !st.Dead(), nil
}

// member is one process whose process group id is the one asked for.
type member struct {
	pid int
	procstat.Stat
}

// members lists the processes whose pgid is exactly pgid, read from
// /proc/<pid>/stat. It is used only to tell live members from zombies of a
// group the caller already owns by identity [GRP-4]; it never decides
// ownership. The scan is a snapshot: a member forking while it runs can be
// missed, so callers use it only after a kernel check (a group signal, or a
// pidfd probe) that a scan cannot race with, or to refuse conservatively.
//
// It reads /proc with getdents into one buffer and each stat file with one
// openat relative to /proc and one read into another, and parses a full
// line only for the members: a few microseconds per process.
func members(pgid int) ([]member, error) {
	proc, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "open /proc")
	}
	defer unix.Close(proc)
	var (
		out  []member
		stat = make([]byte, 1024)
		path = make([]byte, 0, 32)
	)
	err = eachPID(proc, "/proc", make([]byte, 32<<10), func(name []byte, pid int) error {
		path = append(append(path[:0], name...), "/stat"...)
		line, err := readAt(proc, path, stat)
		if err == unix.ENOENT || err == unix.ESRCH {
			return nil // gone since the directory was read
		}
		if err != nil {
			return errcode.Wrap(errcode.Internal, err, "read process %d", pid)
		}
		if g, ok := procstat.PGID(line); ok && g != pgid {
			return nil
		}
		st, err := procstat.Parse(line)
		if err != nil {
			return errcode.Wrap(errcode.Internal, err, "read process %d", pid)
		}
		if st.PGID == pgid {
			out = append(out, member{pid, st})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachPID calls fn with the name and number of every entry of the open
// directory dir (at path) whose name is a pid (/proc, /proc/self/task), read
// with getdents into dirents; it stops at fn's first error and returns it.
func eachPID(dir int, path string, dirents []byte, fn func(name []byte, pid int) error) error {
	for {
		n, err := unix.Getdents(dir, dirents)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return errcode.Wrap(errcode.Internal, err, "read %s", path)
		}
		if n == 0 {
			return nil
		}
		for buf := dirents[:n]; len(buf) > 0; {
			reclen := int(uint16(buf[16]) | uint16(buf[17])<<8)
			name := buf[19:reclen]
			buf = buf[reclen:]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if pid, ok := atoiPID(name); ok {
				if err := fn(name, pid); err != nil {
					return err
				}
			}
		}
	}
}

// atoiPID parses a /proc entry name that is a pid: decimal digits, no sign,
// no leading zero, positive.
func atoiPID(name []byte) (int, bool) {
	if len(name) == 0 || len(name) > 9 || name[0] == '0' {
		return 0, false
	}
	n := 0
	for _, c := range name {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// readAt reads the file at path relative to dir into buf with one read (a
// stat line is far shorter than buf) and returns the bytes read.
func readAt(dir int, path []byte, buf []byte) ([]byte, error) {
	fd, err := unix.Openat(dir, string(path), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == len(buf) {
			return nil, errors.New("stat line longer than expected")
		}
		return buf[:n], nil
	}
}

// readAllAt reads the whole file at path relative to dir into *buf, growing
// it as needed, and returns the bytes read.
func readAllAt(dir int, path []byte, buf *[]byte) ([]byte, error) {
	fd, err := unix.Openat(dir, string(path), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := *buf
	n := 0
	for {
		if n == len(b) {
			b = append(b, make([]byte, len(b))...)
			*buf = b
		}
		m, err := unix.Read(fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			return b[:n], nil
		}
		n += m
	}
}
