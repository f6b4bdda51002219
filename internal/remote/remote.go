// Package remote runs one fm command in a secondmate home: `fm on`
// ([XFER-4]) and the transport of remote-bind ([XFER-5]).
//
// # Routes
//
// The routes are <home>/data/secondmates.json, a private file (one regular
// file, owned, mode 0600, at most MaxRoutesBytes) read strictly:
//
//	{"<secondmate-id>": {"home": "/abs/home", "root": "/abs/root", "host": "user@host"}}
//
// home is the secondmate's effective home and root its code root, whose
// bin/fm is the only program ever run; both must be absolute, clean, valid
// UTF-8 paths without control characters. host is optional: absent runs the
// command locally, present runs it over ssh; present, it must not be empty
// (an empty host never means "local"). It is [user@]host with letters,
// digits and ._:- only and never starts with '-', so ssh can never read it
// as an option. The root of a route with a host must also be spelled with
// letters, digits and ._/- only (RootCharset), because it is the one word of
// the remote command that is not encoded. One malformed route refuses the
// whole file, as for the binding registry: no reader selects around a bad
// record.
//
// # What crosses
//
// Only the argv of one fm subcommand, and with --stdin a bounded input. ssh
// joins its arguments into one command string for the remote login shell,
// whatever shell that is (sh, bash, zsh, fish, csh, ...), and the shells
// disagree on quoting. So nothing is quoted: the command is exactly three
// words, each of characters that no shell treats specially,
//
//	<root>/bin/fm on-receive <job>
//
// where <job> is the unpadded base64url (RFC 4648 §5: [A-Za-z0-9_-]) of the
// canonical JSON {"argv":[...],"home":"<home>","schema":JobSchema}
// (EncodeJob). The hidden verb `fm on-receive` of the secondmate's fm
// decodes and checks it (DecodeJob: strict JSON, canonical form, a command
// of Commands, no control character) and replaces itself (execve) with
// <root>/bin/fm <argv...> in an environment of exactly
//
//	PATH=<fixed system path>  FM_HOME=<home>  HOME=<the account's home, from /etc/passwd>
//
// (HOME only where the account is in /etc/passwd). Everything else of the
// ssh session's environment is dropped there, on the remote side, because
// the client cannot be made to send nothing: the system ssh_config of
// Debian and others has "SendEnv LANG LC_*", a user's config may add SendEnv
// or SetEnv lines, and a command-line "-o SendEnv=-*" is applied before
// those files and so clears nothing. Dropping FM_ROOT_OVERRIDE and
// FM_STATE_OVERRIDE also keeps the remote login environment from choosing
// another code root or state root than the route names. No environment
// variable, credential or token of the caller reaches the remote fm ([XFER-5]):
// ssh runs with -T (no terminal), -a (no agent forwarding), -x (no X11
// forwarding), ClearAllForwardings=yes and BatchMode=yes (never a prompt).
//
// A local route runs <root>/bin/fm directly, without a shell, with the
// caller's environment less FM_HOME, FM_ROOT_OVERRIDE and FM_STATE_OVERRIDE,
// plus FM_HOME=<home>.
//
// # The job
//
// Stdin is at most MaxStdin bytes, read completely before the job starts;
// stdout and stderr are collected up to MaxStdout and MaxStderr, and a job
// that writes more is stopped (response-oversized). Arguments must not hold
// control characters and, encoded, fit MaxJob (request-oversized).
//
// The job runs in a process group of its own (the transport and whatever it
// starts). It has a deadline (DefaultTimeout, or the caller's --timeout, 0
// for none): at the deadline, on an overflow or an interrupt the whole
// group gets TERM, then KILL after StopGrace, and a deadline is
// remote-invalid naming it. ssh also bounds the
// connection and its liveness itself (SSHOptions: ConnectTimeout,
// ServerAliveInterval, ServerAliveCountMax, BatchMode), so a dead link ends
// the job before any deadline.
//
// # The answer
//
// What the secondmate's fm answered is presented only when it has the form
// of an fm answer (CheckAnswer); ssh's own failure (exit 255, which fm never
// uses) is process-failed, and anything else that is not such an answer is
// remote-invalid, with nothing of its stdout presented as a result
// ([CLI-3]): a transport that prints terminal noise and exits, a remote that
// dies half-way.
package remote

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/strictjson"
)

// Bounds of the routes file and of one job.
const (
	MaxRoutesBytes = 65536
	MaxStdin       = 1 << 20
	MaxStdout      = 16 << 20
	MaxStderr      = 64 << 10
)

// SSHEnv names the ssh client to run; DefaultSSH is used when it is unset.
const (
	SSHEnv     = "FM_SSH_BIN"
	DefaultSSH = "ssh"
)

// sshFailed is ssh's own exit status for a connection or authentication
// failure.
const sshFailed = 255

// The deadline of a job and how its process group is stopped.
const (
	// DefaultTimeout is the deadline of a job when the caller sets none:
	// above the default binding timeout (300 s) of a poll run through fm
	// on. Commands that run until stopped (procevent serve, wake watch) are
	// not jobs for fm on; --timeout 0 runs one anyway.
	DefaultTimeout = 10 * time.Minute
	// StopGrace is the time between TERM and KILL to the job's group.
	StopGrace = 2 * time.Second
)

// SSHOptions are the ssh options of every job besides -T, -a and -x: never a
// prompt, no forwarding, a connection bounded to 30 s and a link that stops
// answering ended after 3 keepalives 15 s apart.
var SSHOptions = []string{
	"-o", "BatchMode=yes",
	"-o", "ClearAllForwardings=yes",
	"-o", "ConnectTimeout=30",
	"-o", "ServerAliveInterval=15",
	"-o", "ServerAliveCountMax=3",
}

// ParseTimeout reads a --timeout value: a Go duration ("90s", "15m") or a
// whole number of milliseconds; 0 is no deadline. Anything else, negative
// or empty, is usage.
func ParseTimeout(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && strings.TrimLeft(s, "0123456789") == "" && n <= int64(math.MaxInt64/time.Millisecond) {
		return time.Duration(n) * time.Millisecond, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return d, nil
	}
	return 0, errcode.New(errcode.Usage, "--timeout %q is not a duration (90s, 15m) or a number of milliseconds (0: no deadline)", s)
}

// The remote end of `fm on` over ssh.
const (
	// ReceiveVerb is the hidden fm command that runs a job on the remote
	// side: fm on-receive <job>.
	ReceiveVerb = "on-receive"
	// JobSchema is the schema of the encoded job.
	JobSchema = "firstmate.fm-on-job.v1"
	// MaxJob bounds a job's canonical JSON (its base64url word is 4/3 of
	// that), far below the kernel's 128 KiB limit on one argument, which the
	// remote shell's -c command string must fit.
	MaxJob = 65536
)

// Commands are the fm commands a job may run: those that work in a home.
// `on` is not one (one hop only), nor is on-receive.
var Commands = []string{"extension", "procevent", "wake", "doctor", "help", "version"}

// RootCharset is what the root of a route with a host may be spelled with:
// the characters no shell treats specially.
const RootCharset = "letters, digits, '.', '_', '/' and '-'"

// Route is where one secondmate home lives.
type Route struct {
	Home string `json:"home"`
	Root string `json:"root"`
	Host string `json:"host,omitzero"`
}

// The patterns of routes are compiled on first use (lazyRegexp): most fm
// processes never read a route.
var (
	idRe   = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	hostRe = lazyRegexp(`^([A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9_:][A-Za-z0-9._:-]*$`)
	rootRe = lazyRegexp(`^[A-Za-z0-9._/-]+$`)
)

// lazyRegexp returns pattern's compiler, run once on first use: compiled
// at start-up, the patterns of this package cost every fm process 0.2 ms
// before main.
func lazyRegexp(pattern string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
}

// Lookup reads and validates the routes of h and returns the route of id.
func Lookup(h *home.Home, id string) (*Route, error) {
	routes, err := Routes(h)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errcode.New(errcode.SecondmateMissing, "unknown secondmate %q: there are no routes (%s does not exist); add one there (mode 0600)", id, h.Secondmates())
	}
	if err != nil {
		return nil, err
	}
	r, ok := routes[id]
	if !ok {
		known := "none"
		if len(routes) > 0 {
			known = strings.Join(slices.Sorted(maps.Keys(routes)), ", ")
		}
		return nil, errcode.New(errcode.SecondmateMissing, "unknown secondmate %q; the routes in %s are: %s", id, h.Secondmates(), known)
	}
	return &r, nil
}

// Routes reads and validates every route of h. An absent routes file is an
// error wrapping os.ErrNotExist; one malformed route refuses the whole file.
func Routes(h *home.Home) (map[string]Route, error) {
	path := h.Secondmates()
	data, err := fsutil.ReadPrivateFile(path, MaxRoutesBytes)
	if err != nil {
		return nil, err
	}
	var routes map[string]Route
	if err := strictjson.Decode(data, MaxRoutesBytes, "routes "+path, &routes); err != nil {
		return nil, err
	}
	// "host": "" decodes like an absent host; which of the two the file
	// says is read separately, so that an empty host is refused rather than
	// run locally.
	var hosts map[string]struct {
		Host *string `json:"host"`
	}
	if err := json.Unmarshal(data, &hosts); err != nil {
		return nil, errcode.Wrap(errcode.Internal, nil, "routes %s: read the hosts", path)
	}
	for _, k := range slices.Sorted(maps.Keys(routes)) {
		if h := hosts[k].Host; h != nil && *h == "" {
			return nil, errcode.New(errcode.SchemaInvalid, "routes %s: %s.host is empty; name the [user@]host, or leave the key out for a secondmate on this machine", path, k)
		}
		if err := routes[k].check(path, k); err != nil {
			return nil, err
		}
	}
	return routes, nil
}

func (r Route) check(path, id string) error {
	if !idRe().MatchString(id) {
		return errcode.New(errcode.SchemaInvalid, "routes %s: secondmate id %q must be 1..64 letters, digits, '.', '_' or '-', starting with a letter or digit", path, id)
	}
	for _, p := range []struct{ key, val string }{{"home", r.Home}, {"root", r.Root}} {
		if !filepath.IsAbs(p.val) || filepath.Clean(p.val) != p.val || !plain(p.val) {
			return errcode.New(errcode.PathUnsafe, "routes %s: %s.%s %q must be an absolute clean path without control characters", path, id, p.key, p.val)
		}
	}
	if r.Host != "" && !hostRe().MatchString(r.Host) {
		return errcode.New(errcode.SchemaInvalid, "routes %s: %s.host %q must be [user@]host (letters, digits, '.', '_', ':', '-'; not starting with '-')", path, id, r.Host)
	}
	if r.Host != "" && !rootRe().MatchString(r.Root) {
		return errcode.New(errcode.SchemaInvalid, "routes %s: %s.root %q of a route with a host may hold only %s, so that it reaches the remote shell without quoting; install fm there under such a path", path, id, r.Root, RootCharset)
	}
	return nil
}

// plain reports whether s is valid UTF-8 without control characters.
func plain(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

// Result is a finished job.
type Result struct {
	Stdout, Stderr []byte
	Status         int
}

// Run runs fm with args in the home of r, with stdin as its input (nil: an
// empty input), within timeout (0: none), and returns what it wrote and its
// exit status; the caller checks the answer with CheckAnswer.
func Run(ctx context.Context, r *Route, args []string, stdin []byte, timeout time.Duration) (*Result, error) {
	if len(stdin) > MaxStdin {
		return nil, errcode.New(errcode.RequestOversized, "input for fm on is %d bytes; the bound is %d", len(stdin), MaxStdin)
	}
	for _, a := range args {
		if !plain(a) {
			return nil, errcode.New(errcode.Usage, "argument %q holds a control character or invalid utf-8", a)
		}
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(parent, timeout)
	}
	defer cancel()
	// The command runs in a process group of its own, which only fm's
	// stop-signal handling stops: it starts once they are caught.
	if !launch.AwaitSignals(ctx) {
		return nil, errcode.New(errcode.ProcessFailed, "fm on %s: interrupted", r.where())
	}
	cmd, err := r.command(ctx, args)
	if err != nil {
		return nil, err
	}
	cmd.Stdin = bytes.NewReader(stdin)
	stdout := &bounded{limit: MaxStdout, overflow: cancel}
	stderr := &bounded{limit: MaxStderr, overflow: cancel}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	stopped := stopGroup(cmd)
	err = cmd.Run()
	res := &Result{Stdout: stdout.buf.Bytes(), Stderr: stderr.buf.Bytes()}
	where := r.where()
	switch {
	case stdout.over || stderr.over:
		return nil, errcode.New(errcode.ResponseOversized, "fm on %s: the command wrote more than %d bytes to stdout or %d to stderr; it was stopped", where, MaxStdout, MaxStderr)
	case cmd.ProcessState == nil:
		return nil, errcode.Wrap(errcode.ProcessFailed, err, "fm on %s: cannot run %s", where, cmd.Path)
	case stopped() && parent.Err() != nil:
		return nil, errcode.New(errcode.ProcessFailed, "fm on %s: interrupted", where)
	case stopped():
		return nil, errcode.New(errcode.RemoteInvalid, "fm on %s: no answer within the deadline of %s; the transport and its process group were stopped (raise --timeout for a slow link or a long command; 0 is no deadline)", where, timeout)
	}
	res.Status = cmd.ProcessState.ExitCode()
	if res.Status < 0 {
		return nil, errcode.New(errcode.ProcessFailed, "fm on %s: %s", where, cmd.ProcessState)
	}
	if r.Host != "" && res.Status == sshFailed {
		line, _, _ := strings.Cut(strings.TrimSpace(string(res.Stderr)), "\n")
		return nil, errcode.New(errcode.ProcessFailed, "fm on %s: ssh failed (exit 255): %s", where, truncate(line, 200))
	}
	return res, nil
}

// stopGroup makes cmd start in a process group of its own and, when its
// context ends, stop that whole group: TERM, then KILL after StopGrace, so
// neither ssh nor anything it started (a ProxyCommand, a local fm's
// children) outlives the job. A leader already reaped keeps the group's
// number reserved while any member lives, so the KILL reaches only the
// job's own processes. The returned function reports whether the group was
// stopped.
func stopGroup(cmd *exec.Cmd) (stopped func() bool) {
	var done atomic.Bool
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		done.Store(true)
		pgid := cmd.Process.Pid
		unix.Kill(-pgid, unix.SIGTERM)
		time.AfterFunc(StopGrace, func() { unix.Kill(-pgid, unix.SIGKILL) })
		return nil
	}
	// Past the grace, Wait stops waiting for output a member still holds.
	cmd.WaitDelay = StopGrace + time.Second
	return done.Load
}

func (r *Route) where() string {
	if r.Host == "" {
		return r.Home
	}
	return r.Host + ":" + r.Home
}

// fm is the secondmate's own binary.
func (r *Route) fm() string { return filepath.Join(r.Root, "bin", "fm") }

// command builds the job: the secondmate's bin/fm run directly for a local
// route, ssh with the encoded remote command for a remote one.
func (r *Route) command(ctx context.Context, args []string) (*exec.Cmd, error) {
	if r.Host == "" {
		cmd := exec.CommandContext(ctx, r.fm(), args...)
		env := []string{"FM_HOME=" + r.Home}
		for _, kv := range os.Environ() {
			switch k, _, _ := strings.Cut(kv, "="); k {
			case "FM_HOME", "FM_ROOT_OVERRIDE", "FM_STATE_OVERRIDE":
			default:
				env = append(env, kv)
			}
		}
		cmd.Env = env
		return cmd, nil
	}
	command, err := RemoteCommand(r, args)
	if err != nil {
		return nil, err
	}
	ssh := os.Getenv(SSHEnv)
	if ssh == "" {
		ssh = DefaultSSH
	}
	return exec.CommandContext(ctx, ssh, slices.Concat([]string{"-T", "-a", "-x"}, SSHOptions, []string{"--", r.Host, command})...), nil
}

// RemoteCommand is the command string ssh hands to the remote login shell:
//
//	<root>/bin/fm on-receive <job>
//
// with <job> = EncodeJob(r.Home, args). Every character of it is a letter,
// a digit, one of ._/- or the two separating spaces (the root is checked
// against RootCharset with the route), so every shell splits it into those
// three words and interprets nothing in them.
func RemoteCommand(r *Route, args []string) (string, error) {
	if !rootRe().MatchString(r.Root) {
		return "", errcode.New(errcode.SchemaInvalid, "root %q of a route with a host may hold only %s", r.Root, RootCharset)
	}
	job, err := EncodeJob(r.Home, args)
	if err != nil {
		return "", err
	}
	return r.fm() + " " + ReceiveVerb + " " + job, nil
}

// Job is what crosses to the remote side: the secondmate's home and the fm
// argv to run there.
type Job struct {
	Schema string   `json:"schema"`
	Home   string   `json:"home"`
	Argv   []string `json:"argv"`
}

// EncodeJob returns the one-word encoding of a job: the unpadded base64url of
// its canonical JSON. The word holds only [A-Za-z0-9_-] and, since the JSON
// starts with '{', never starts with '-'.
func EncodeJob(home string, argv []string) (string, error) {
	data, err := strictjson.Canonical(&Job{Schema: JobSchema, Home: home, Argv: argv})
	if err != nil {
		return "", err
	}
	if len(data) > MaxJob {
		return "", errcode.New(errcode.RequestOversized, "the fm command for the secondmate is %d bytes as json; the bound is %d", len(data), MaxJob)
	}
	return base64.RawURLEncoding.EncodeToString(data), nil
}

// DecodeJob reverses EncodeJob and checks the job: strict base64url without
// padding, strict JSON of exactly the job's keys in canonical form (so one
// job has one word), the schema, an absolute clean home without control
// characters, and an argv whose first word is one of Commands and whose
// words hold no control character or invalid UTF-8. Every refusal is usage.
func DecodeJob(word string) (*Job, error) {
	bad := func(why string) error {
		return errcode.New(errcode.Usage, "%s takes one job written by fm on: %s", ReceiveVerb, why)
	}
	if base64.RawURLEncoding.EncodedLen(MaxJob) < len(word) {
		return nil, bad("it is too long")
	}
	data, err := base64.RawURLEncoding.Strict().DecodeString(word)
	if err != nil {
		return nil, bad("it is not unpadded base64url")
	}
	var j Job
	if err := strictjson.Decode(data, MaxJob, "fm on job", &j); err != nil {
		return nil, bad(err.Error())
	}
	if canon, err := strictjson.Canonical(&j); err != nil || !bytes.Equal(canon, data) {
		return nil, bad("its json is not canonical")
	}
	switch {
	case j.Schema != JobSchema:
		return nil, bad("its schema is not " + JobSchema + " (is fm the same version on both ends?)")
	case !filepath.IsAbs(j.Home) || filepath.Clean(j.Home) != j.Home || !plain(j.Home):
		return nil, bad("its home is not an absolute clean path")
	case len(j.Argv) == 0 || !slices.Contains(Commands, j.Argv[0]):
		return nil, bad("its command is not one of " + strings.Join(Commands, ", "))
	}
	for _, a := range j.Argv {
		if !plain(a) {
			return nil, bad("an argument holds a control character or invalid utf-8")
		}
	}
	return &j, nil
}

// JobEnv is the whole environment of the fm a job runs: the fixed system
// PATH, FM_HOME, and HOME where accountHome knows it. Nothing of the ssh
// session's environment is in it.
func JobEnv(j *Job) []string {
	env := []string{"PATH=" + host.SystemPath, "FM_HOME=" + j.Home}
	if h := accountHome(); h != "" {
		env = append(env, "HOME="+h)
	}
	return env
}

// ExecJob is `fm on-receive <word>`: it decodes the job and replaces the
// running fm with the same fm executable running the job's argv in JobEnv,
// so the job's stdin, stdout, stderr and exit status are the session's. It
// returns only on failure.
func ExecJob(word string) error {
	j, err := DecodeJob(word)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "locate the running fm")
	}
	err = unix.Exec(exe, append([]string{exe}, j.Argv...), JobEnv(j))
	return errcode.Wrap(errcode.ProcessFailed, err, "run %s", exe)
}

// accountHome is the home directory of the effective user's entry in
// /etc/passwd, or "" when there is none (an account of a directory service)
// or it is not an absolute clean path. It is the remote account's own, never
// anything the caller sent.
func accountHome() string {
	data, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return ""
	}
	uid := strconv.Itoa(os.Geteuid())
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) == 7 && f[2] == uid {
			if d := f[5]; filepath.IsAbs(d) && filepath.Clean(d) == d && plain(d) {
				return d
			}
			return ""
		}
	}
	return ""
}

// bounded collects up to limit bytes; past that it drops the rest, records
// the overflow and stops the job.
type bounded struct {
	buf      bytes.Buffer
	limit    int
	over     bool
	overflow func()
}

func (b *bounded) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > b.limit {
		b.over = true
		b.overflow()
		return 0, io.ErrShortWrite
	}
	return b.buf.Write(p)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// ReadInput reads the --stdin input of a job: at most MaxStdin bytes, read
// completely before the job starts (request-oversized beyond).
func ReadInput(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxStdin+1))
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read stdin")
	}
	if len(data) > MaxStdin {
		return nil, errcode.New(errcode.RequestOversized, "stdin for fm on is larger than %d bytes", MaxStdin)
	}
	return data, nil
}
