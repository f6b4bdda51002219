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
// command locally, present runs it over ssh. It is [user@]host with letters,
// digits and ._:- only and never starts with '-', so ssh can never read it
// as an option. One malformed route refuses the whole file, as for the
// binding registry: no reader selects around a bad record.
//
// # What crosses
//
// Only the argv of one fm subcommand, and with --stdin a bounded input. ssh
// joins its arguments into one command string for the remote login shell,
// so the string is built here from the route alone plus those arguments,
// every word single-quoted (see RemoteCommand), and the remote side runs
// exactly
//
//	env -u FM_ROOT_OVERRIDE -u FM_STATE_OVERRIDE FM_HOME=<home> <root>/bin/fm <args...>
//
// Nothing the caller typed is ever interpreted as shell text, provided the
// remote login shell is a POSIX shell (sh, dash, bash, ksh, zsh). Arguments
// must not hold control characters, which a remote shell could treat as
// command separators. The two unset variables would otherwise let the remote
// login environment pick another code root or state root than the route
// names. No environment variable, credential or token of the caller is sent:
// ssh runs with -T (no terminal), -a (no agent forwarding), -x (no X11
// forwarding), ClearAllForwardings=yes and BatchMode=yes (never a prompt). A
// local route runs <root>/bin/fm directly, without a shell, with the
// caller's environment less FM_HOME, FM_ROOT_OVERRIDE and FM_STATE_OVERRIDE,
// plus FM_HOME=<home>.
//
// # The job
//
// Stdin is at most MaxStdin bytes, read completely before the job starts;
// stdout and stderr are collected up to MaxStdout and MaxStderr, and a job
// that writes more is killed (response-oversized). The job's exit status is
// returned for the caller to pass on; ssh's own failure (exit 255, which fm
// never uses) is process-failed.
package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
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

// Route is where one secondmate home lives.
type Route struct {
	Home string `json:"home"`
	Root string `json:"root"`
	Host string `json:"host,omitzero"`
}

var (
	idRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	hostRe = regexp.MustCompile(`^([A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9_:][A-Za-z0-9._:-]*$`)
)

// Lookup reads and validates the routes of h and returns the route of id.
func Lookup(h *home.Home, id string) (*Route, error) {
	path := h.Secondmates()
	data, err := fsutil.ReadPrivateFile(path, MaxRoutesBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errcode.New(errcode.Usage, "unknown secondmate %q: %s does not exist; add a route there (mode 0600)", id, path)
	}
	if err != nil {
		return nil, err
	}
	var routes map[string]Route
	if err := strictjson.Decode(data, MaxRoutesBytes, "routes "+path, &routes); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(routes))
	for k := range routes {
		ids = append(ids, k)
	}
	sort.Strings(ids)
	for _, k := range ids {
		if err := routes[k].check(path, k); err != nil {
			return nil, err
		}
	}
	r, ok := routes[id]
	if !ok {
		return nil, errcode.New(errcode.Usage, "unknown secondmate %q; the routes in %s are: %s", id, path, strings.Join(ids, ", "))
	}
	return &r, nil
}

func (r Route) check(path, id string) error {
	if !idRe.MatchString(id) {
		return errcode.New(errcode.SchemaInvalid, "routes %s: secondmate id %q must be 1..64 letters, digits, '.', '_' or '-', starting with a letter or digit", path, id)
	}
	for _, p := range []struct{ key, val string }{{"home", r.Home}, {"root", r.Root}} {
		if !filepath.IsAbs(p.val) || filepath.Clean(p.val) != p.val || !plain(p.val) {
			return errcode.New(errcode.PathUnsafe, "routes %s: %s.%s %q must be an absolute clean path without control characters", path, id, p.key, p.val)
		}
	}
	if r.Host != "" && !hostRe.MatchString(r.Host) {
		return errcode.New(errcode.SchemaInvalid, "routes %s: %s.host %q must be [user@]host (letters, digits, '.', '_', ':', '-'; not starting with '-')", path, id, r.Host)
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
// empty input), and returns what it wrote and its exit status.
func Run(ctx context.Context, r *Route, args []string, stdin []byte) (*Result, error) {
	if len(stdin) > MaxStdin {
		return nil, errcode.New(errcode.RequestOversized, "input for fm on is %d bytes; the bound is %d", len(stdin), MaxStdin)
	}
	for _, a := range args {
		if !plain(a) {
			return nil, errcode.New(errcode.Usage, "argument %q holds a control character or invalid utf-8", a)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := r.command(ctx, args)
	cmd.Stdin = bytes.NewReader(stdin)
	stdout := &bounded{limit: MaxStdout, overflow: cancel}
	stderr := &bounded{limit: MaxStderr, overflow: cancel}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	res := &Result{Stdout: stdout.buf.Bytes(), Stderr: stderr.buf.Bytes()}
	where := r.where()
	switch {
	case stdout.over || stderr.over:
		return nil, errcode.New(errcode.ResponseOversized, "fm on %s: the command wrote more than %d bytes to stdout or %d to stderr; it was stopped", where, MaxStdout, MaxStderr)
	case cmd.ProcessState == nil:
		return nil, errcode.Wrap(errcode.ProcessFailed, err, "fm on %s: cannot run %s", where, cmd.Path)
	case ctx.Err() != nil:
		return nil, errcode.New(errcode.ProcessFailed, "fm on %s: interrupted", where)
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

func (r *Route) where() string {
	if r.Host == "" {
		return r.Home
	}
	return r.Host + ":" + r.Home
}

// fm is the secondmate's own binary.
func (r *Route) fm() string { return filepath.Join(r.Root, "bin", "fm") }

// command builds the job: the secondmate's bin/fm run directly for a local
// route, ssh with the quoted remote command for a remote one.
func (r *Route) command(ctx context.Context, args []string) *exec.Cmd {
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
		return cmd
	}
	ssh := os.Getenv(SSHEnv)
	if ssh == "" {
		ssh = DefaultSSH
	}
	return exec.CommandContext(ctx, ssh, "-T", "-a", "-x", "-o", "BatchMode=yes", "-o", "ClearAllForwardings=yes", "--", r.Host, RemoteCommand(r, args))
}

// RemoteCommand is the command string ssh hands to the remote shell: every
// word built from the route or args and single-quoted, so the shell runs
// exactly the secondmate's bin/fm with args in its home. Inside single
// quotes a POSIX shell interprets nothing; a quote itself is closed, written
// escaped and reopened, so the argument it's becomes
//
//	'it'\''s'
func RemoteCommand(r *Route, args []string) string {
	words := append([]string{"env", "-u", "FM_ROOT_OVERRIDE", "-u", "FM_STATE_OVERRIDE", "FM_HOME=" + r.Home, r.fm()}, args...)
	for i, w := range words {
		words[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(words, " ")
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
