// Package confine turns a binding's consent facts into a Landlock ruleset
// that the launch barrier applies to itself right before it becomes the
// entrypoint ([CONF-1]..[CONF-5] in docs/spec.md).
//
// The full fm builds the ruleset (this package); the barrier, which imports
// only os, strconv, syscall and unsafe, receives it as a descriptor and only
// sets no-new-privileges and restricts itself on the thread that calls
// execve. Nothing here restricts the calling process.
//
// Rules [CONF-1]: everything a package may need to run is readable and
// executable (the system roots, SystemRoots, and its own package root);
// its state directory is the one place it may write (and create, rename,
// remove); a few character devices are usable (Devices) and /dev/shm is
// writable; TCP bind and connect are refused without the network consent;
// abstract unix sockets and signals are scoped to the package's own
// processes. credential-store adds read on the credential directories fm
// passes (HOME and the XDG directories); artifact-references adds read and
// write (not execute) on the whole tree, because an artifact reference names
// any path an operator's task produced, and a package may consume what it
// names (the Python example removes the spooled files it answered): TCP and
// signals stay confined. Everything else (the operator's home, fm's home and the
// other packages' state) is refused with EACCES, and a signal to a process
// outside the package's own domain with EPERM.
//
// What the kernel cannot enforce (an ABI without a feature) is named in the
// Plan, never silently dropped [CONF-3].
package confine

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// SystemRoots are read and executed by every confined package: where
// interpreters, libraries, certificates and the system's configuration live,
// and /proc and /sys, which language runtimes read about themselves (Go
// reads its cgroup limits, Python and node /proc/self). Landlock's own
// ptrace rule keeps /proc/<pid> of processes outside the domain (such as
// fm's environ) unreadable. A root that does not exist is skipped.
var SystemRoots = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys"}

// Devices are readable and writable character devices: without /dev/null
// every `>/dev/null` of a shell fails.
var Devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}

// SharedMemory is writable: Python's multiprocessing makes its semaphores
// there.
const SharedMemory = "/dev/shm"

// Landlock's filesystem access rights, by the ABI that introduced them.
const (
	fsABI1 = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR |
		unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR |
		unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_MAKE_SOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	readExec  = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	readOnly  = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	allFS     = fsABI1 | unix.LANDLOCK_ACCESS_FS_REFER | unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	deviceUse = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	tcp   = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
	scope = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
)

// Feature ABIs: the Landlock ABI version that first has each feature.
const (
	abiFS       = 1 // filesystem access
	abiRefer    = 2 // renames and links across directories
	abiTruncate = 3 // truncate(2) and O_TRUNC
	abiTCP      = 4 // TCP bind and connect
	abiIoctl    = 5 // ioctl on devices
	abiScope    = 6 // abstract unix sockets and signals
)

// handledFS is every filesystem right the kernel of abi knows: the ruleset
// handles them all, so what no rule allows is refused.
func handledFS(abi int) uint64 {
	h := uint64(fsABI1)
	if abi >= abiRefer {
		h |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= abiTruncate {
		h |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= abiIoctl {
		h |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	return h
}

// Probe returns the kernel's Landlock ABI version, 0 when the kernel has no
// Landlock (not built, disabled at boot, or refused by a seccomp filter).
func Probe() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 || int(v) < 0 {
		return 0
	}
	return int(v)
}

// Grant is what one binding grants its package: the consents of its record
// and the directories they stand for.
type Grant struct {
	PackageRoot string // read and execute
	State       string // read and write ($FIRSTMATE_EXTENSION_STATE)
	Temp        string // read and write ($TMPDIR)
	Network     bool   // TCP bind and connect
	// Credentials are the credential directories the environment passes
	// under the credential-store consent (HOME, XDG_*_HOME): readable.
	Credentials []string
	// Everywhere is the artifact-references consent: read and write (not
	// execute) on the whole tree.
	Everywhere bool
}

// Plan says what one invocation is confined to: the mode, the kernel's ABI,
// the rules in force and what the kernel could not enforce.
type Plan struct {
	Mode   Mode
	ABI    int
	Rules  []string // "rx /usr", "rw <state>", "no tcp", "scoped signals", ...
	Lacked []string // what the binding's ruleset needs and the kernel lacks
}

// Confined reports whether a ruleset is applied at all.
func (p Plan) Confined() bool { return p.Mode != Off && p.ABI >= abiFS }

// String is the one-line account of the plan, for error lines and doctor.
func (p Plan) String() string {
	switch {
	case p.Mode == Off:
		return "confinement off (this home's setting)"
	case !p.Confined():
		return "NOT confined: this kernel has no Landlock (confinement " + string(p.Mode) + ")"
	}
	s := fmt.Sprintf("confined by Landlock ABI %d: %s", p.ABI, strings.Join(p.Rules, ", "))
	if len(p.Lacked) > 0 {
		s += "; NOT enforced (kernel lacks): " + strings.Join(p.Lacked, ", ")
	}
	return s
}

// Short is the plan in a few words, for an error line: the mode or the ABI
// and what the kernel refused to the package as a whole; `fm home
// confinement` lists the rules.
func (p Plan) Short() string {
	switch {
	case p.Mode == Off:
		return "confinement off"
	case !p.Confined():
		return "NOT confined: this kernel has no Landlock (confinement " + string(p.Mode) + ")"
	}
	var whole []string
	for _, r := range p.Rules {
		if !strings.Contains(r, "/") {
			whole = append(whole, r)
		}
	}
	s := fmt.Sprintf("confined by Landlock ABI %d (writes only in its state and TMPDIR", p.ABI)
	if len(whole) > 0 {
		s += "; " + strings.Join(whole, ", ")
	}
	s += ")"
	if len(p.Lacked) > 0 {
		s += ", NOT enforced (kernel lacks): " + strings.Join(p.Lacked, ", ")
	}
	return s
}

// rulesetAttr is the kernel's struct landlock_ruleset_attr up to the scoped
// field (ABI 6); size passes only the part an older kernel knows.
type rulesetAttr struct {
	fs, net, scoped uint64
}

// Build makes the ruleset of g for mode on a kernel of abi and returns it
// as a file to pass to the barrier (nil when nothing is applied: mode off,
// or enforce on a kernel without Landlock) with its Plan. In strict mode a
// kernel that lacks anything the ruleset needs is confinement-unavailable.
func Build(mode Mode, abi int, g Grant) (*os.File, Plan, error) {
	p := Plan{Mode: mode, ABI: abi}
	var err error
	if p.Lacked, err = Check(mode, abi, g); err != nil || mode == Off || abi < abiFS {
		return nil, p, err
	}
	f, err := create(abi, g, &p)
	if err != nil {
		return nil, p, errcode.Wrap(errcode.Internal, err, "build the Landlock ruleset of %q", g.PackageRoot)
	}
	return f, p, nil
}

// Check returns what g's ruleset needs and a kernel of abi lacks under mode
// (nothing when mode is Off), and for Strict with anything lacking the
// refusal, confinement-unavailable. It creates nothing.
func Check(mode Mode, abi int, g Grant) ([]string, error) {
	var l []string
	switch {
	case mode == Off:
		return nil, nil
	case abi < abiFS:
		l = []string{"landlock"}
	default:
		l = lacked(abi, g)
	}
	if mode == Strict && len(l) > 0 {
		return l, errcode.New(errcode.ConfinementUnavailable,
			"this home's confinement is strict and the kernel (Landlock ABI %d) cannot enforce: %s; see fm doctor, or run `fm home confinement enforce` to run packages with what the kernel can enforce", abi, strings.Join(l, ", "))
	}
	return l, nil
}

// lacked lists what g's ruleset needs and a kernel of abi (>= 1) lacks.
func lacked(abi int, g Grant) []string {
	var l []string
	if abi < abiTruncate {
		l = append(l, "truncate")
	}
	if abi < abiTCP && !g.Network {
		l = append(l, "tcp")
	}
	if abi < abiScope {
		l = append(l, "scoped signals and abstract sockets")
	}
	return l
}

// create makes the ruleset and adds g's rules, noting each in p.
func create(abi int, g Grant, p *Plan) (*os.File, error) {
	attr := rulesetAttr{fs: handledFS(abi)}
	size := unsafe.Sizeof(attr.fs)
	if abi >= abiTCP {
		size += unsafe.Sizeof(attr.net)
		if !g.Network {
			attr.net = tcp
			p.Rules = append(p.Rules, "no tcp")
		}
	}
	if abi >= abiScope {
		size += unsafe.Sizeof(attr.scoped)
		attr.scoped = scope
		p.Rules = append(p.Rules, "scoped signals and abstract sockets")
	}
	fd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if e != 0 {
		return nil, os.NewSyscallError("landlock_create_ruleset", e)
	}
	f := os.NewFile(fd, "landlock-ruleset")
	type rule struct {
		tag    string
		access uint64
		paths  []string
	}
	rules := []rule{
		{"rx", readExec, SystemRoots},
		{"rx", readExec, []string{g.PackageRoot}},
		{"rw", allFS, []string{g.State, g.Temp}},
		{"dev", deviceUse, Devices},
		{"rw", allFS &^ unix.LANDLOCK_ACCESS_FS_EXECUTE, []string{SharedMemory}},
		{"r", readOnly, g.Credentials},
	}
	if g.Everywhere {
		rules = append(rules, rule{"rw", allFS &^ (unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV), []string{"/"}})
	}
	for _, r := range rules {
		for _, path := range r.paths {
			added, err := addPath(f, path, r.access&attr.fs)
			if err != nil {
				f.Close()
				return nil, err
			}
			if added {
				p.Rules = append(p.Rules, r.tag+" "+path)
			}
		}
	}
	return f, nil
}

// fileRights are the rights the kernel accepts on a rule for a file that is
// not a directory.
const fileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
	unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV

// addPath allows access beneath path (opened O_PATH, following links: the
// rule applies to what the name reaches, such as /lib -> usr/lib). A path
// that does not exist is skipped (false).
func addPath(ruleset *os.File, path string, access uint64) (bool, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return false, nil
	}
	if err != nil {
		return false, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= fileRights
	}
	attr := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(fd)}
	// The kernel's struct is packed: 8 bytes of rights, 4 of descriptor.
	if _, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, ruleset.Fd(), unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&attr)), 0, 0, 0); e != 0 {
		return false, &os.PathError{Op: "landlock_add_rule", Path: path, Err: e}
	}
	return true, nil
}
