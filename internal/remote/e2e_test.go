package remote_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/remote"
)

// root is a code root whose bin/fm is the real fm, built once by TestMain
// and shared by every home of these tests (controller and secondmates). It
// has no built-in adapters.
var root string

// TestMain builds cmd/fm into root/bin/fm, or copies FM_TEST_BIN there when
// it names a prebuilt fm (the unprivileged run of scripts/test-unprivileged.sh,
// whose user has no Go caches).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fm-remote-test-")
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir)
	}
	if err == nil {
		root = filepath.Join(dir, "root")
		err = installFM(filepath.Join(root, "bin", "fm"))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func installFM(dst string) error {
	prebuilt := os.Getenv("FM_TEST_BIN")
	if prebuilt == "" {
		out, err := exec.Command("go", "build", "-buildvcs=false", "-o", dst, "firstmate.dev/fm/cmd/fm").CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build fm: %v\n%s", err, out)
		}
		return nil
	}
	data, err := os.ReadFile(prebuilt)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(dst), 0o755)
	}
	if err == nil {
		err = os.WriteFile(dst, data, 0o755)
	}
	return err
}

const (
	exampleID = "org.firstmate.example.file-signal"
	bindArgs  = "--adapter file-signal --trust-same-user-code --consent artifact-references"
)

// world is one controller home, one secondmate home and the example package,
// all outside any work tree.
type world struct {
	base, controller, secondmate, pkg string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{base: base, controller: filepath.Join(base, "controller"), secondmate: filepath.Join(base, "secondmate"), pkg: filepath.Join(base, "pkg")}
	t.Cleanup(func() { // the store's 0555 directories, for a non-root run
		filepath.Walk(base, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
	for _, d := range []string{w.controller, w.secondmate} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join("..", "..", "examples", "process-event-extension")
	for rel, mode := range map[string]os.FileMode{"firstmate-extension.json": 0o644, "bin/firstmate-extension": 0o755} {
		data, err := os.ReadFile(filepath.Join(src, rel))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(w.pkg, rel), data, mode)
	}
	return w
}

func write(t *testing.T, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// route writes the controller's data/secondmates.json with one route "sm1".
func (w *world) route(t *testing.T, host string) {
	t.Helper()
	r := fmt.Sprintf(`{"sm1":{"home":%q,"root":%q`, w.secondmate, root)
	if host != "" {
		r += fmt.Sprintf(`,"host":%q`, host)
	}
	if err := os.Mkdir(filepath.Join(w.controller, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(w.controller, "data", "secondmates.json"), []byte(r+"}}"), 0o600)
}

// fm runs the real fm with FM_HOME=homeDir (and extra environment) and
// returns its stdout, failing the test on a non-zero exit.
func fm(t *testing.T, homeDir string, env []string, stdin []byte, args ...string) string {
	t.Helper()
	out, errOut, code := run(homeDir, env, stdin, args...)
	if code != 0 {
		t.Fatalf("fm %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func run(homeDir string, env []string, stdin []byte, args ...string) (string, string, int) {
	cmd := exec.Command(filepath.Join(root, "bin", "fm"), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, "FM_HOME="+homeDir), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		if cmd.ProcessState != nil {
			code = cmd.ProcessState.ExitCode()
		}
	}
	return stdout.String(), stderr.String(), code
}

// field returns the value of the line "<key>: <value>" in out.
func field(t *testing.T, out, key string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, key+": "); ok {
			return v
		}
	}
	t.Fatalf("no %q line in:\n%s", key, out)
	return ""
}

// remoteBind runs remote-bind from the controller into sm1 and checks the
// outcome of [XFER-5]: the bind lines and the transfer digest come back, the
// secondmate home holds the binding with its package_root under that home,
// and the controller home got nothing at all. It returns remote-bind's
// output.
func (w *world) remoteBind(t *testing.T, env []string) string {
	t.Helper()
	out := fm(t, w.controller, env, nil, append([]string{"extension", "remote-bind", "sm1", w.pkg}, strings.Fields(bindArgs)...)...)
	if got := field(t, out, "bound"); got != exampleID+"@1.0.0" {
		t.Errorf("bound: %s", got)
	}
	if got := field(t, out, "binding"); got != filepath.Join(w.secondmate, "config", "extensions.d", exampleID+".json") {
		t.Errorf("binding: %s", got)
	}
	if got := field(t, out, "package"); !strings.HasPrefix(got, filepath.Join(w.secondmate, "data", "extensions", "packages")+"/") {
		t.Errorf("package: %s is not in the secondmate's store", got)
	}
	field(t, out, "transfer-digest")

	inspect := fm(t, w.controller, env, nil, "on", "sm1", "extension", "inspect", exampleID)
	if !strings.Contains(inspect, `"package_root": "`+filepath.Join(w.secondmate, "data", "extensions", "packages", exampleID)) {
		t.Errorf("secondmate's binding package_root is not under its home:\n%s", inspect)
	}
	if list := fm(t, w.controller, env, nil, "on", "sm1", "extension", "list"); !strings.Contains(list, exampleID) {
		t.Errorf("secondmate does not list the package:\n%s", list)
	}
	if list := fm(t, w.controller, nil, nil, "extension", "list"); list != "no extension bindings\n" {
		t.Errorf("controller lists:\n%s", list)
	}
	for _, p := range []string{"config", "data/extensions", "state"} {
		if _, err := os.Lstat(filepath.Join(w.controller, p)); !os.IsNotExist(err) {
			t.Errorf("the controller home got %s", p)
		}
	}
	return out
}

// TestRemoteBindFakeSSH runs remote-bind through a stand-in ssh that records
// every call and then runs the remote command through a shell, as sshd
// would. The envelope crosses exactly once, as the stdin of exactly one
// call, byte for byte what pack-transfer writes; the call's argv is the
// fixed ssh options, the host and the encoded fm command, which names the
// secondmate's fm, the hidden on-receive and one job word ([XFER-4],
// [XFER-5]).
func TestRemoteBindFakeSSH(t *testing.T) {
	w := newWorld(t)
	w.route(t, "me@secondmate.example")
	calls := filepath.Join(w.base, "calls")
	fake := filepath.Join(w.base, "fake-ssh")
	write(t, fake, []byte(`#!/bin/sh
n=$(ls `+calls+` | wc -l)
d=`+calls+`/$((n + 1))
mkdir -p "$d"
for a in "$@"; do printf '%s\n' "$a"; done >"$d/argv"
cat >"$d/stdin"
for cmd in "$@"; do :; done
exec sh -c "$cmd" <"$d/stdin"
`), 0o755)
	if err := os.Mkdir(calls, 0o700); err != nil {
		t.Fatal(err)
	}
	env := []string{"FM_SSH_BIN=" + fake}

	envelope := fm(t, w.controller, nil, nil, "extension", "pack-transfer", w.pkg)
	w.remoteBind(t, env) // remote-bind, then fm on ... inspect and fm on ... list
	ents, _ := os.ReadDir(calls)
	carried := 0
	for _, e := range ents {
		if data, _ := os.ReadFile(filepath.Join(calls, e.Name(), "stdin")); len(data) > 0 {
			carried++
		}
	}
	if len(ents) != 3 || carried != 1 {
		t.Fatalf("%d ssh calls, %d with a stdin; want 3 and 1", len(ents), carried)
	}
	stdin, _ := os.ReadFile(filepath.Join(calls, "1", "stdin"))
	if !bytes.Equal(stdin, []byte(envelope)) {
		t.Fatalf("remote-bind's ssh stdin is %d bytes, not the %d-byte envelope", len(stdin), len(envelope))
	}
	argv, _ := os.ReadFile(filepath.Join(calls, "1", "argv"))
	job, err := remote.EncodeJob(w.secondmate, append([]string{"extension", "receive-transfer-bind"}, strings.Fields(bindArgs)...))
	if err != nil {
		t.Fatal(err)
	}
	wantArgv := "-T\n-a\n-x\n-o\nBatchMode=yes\n-o\nClearAllForwardings=yes\n" +
		"-o\nConnectTimeout=30\n-o\nServerAliveInterval=15\n-o\nServerAliveCountMax=3\n--\nme@secondmate.example\n" +
		root + "/bin/fm on-receive " + job + "\n"
	if string(argv) != wantArgv {
		t.Fatalf("ssh argv\n%s\nwant\n%s", argv, wantArgv)
	}
}

// leakEnv is caller environment that must not reach the secondmate's fm
// ([XFER-5]): what ssh's SendEnv carries by default (LANG, LC_*) and
// anything else a user's ssh config might send.
var leakEnv = []string{"LANG=fm_LEAK.UTF-8", "LC_ALL=fm_LEAK", "LC_FMTEST=leak", "FMTEST_TOKEN=leak-token"}

// jobEnv runs `fm on sm1 wake watch --after <nonce>` from the controller with
// the extra caller environment env, finds the secondmate's fm among this
// user's processes by its exact argv, and returns that process's environment
// as the kernel holds it (/proc/<pid>/environ); then it stops that process,
// which ends the job.
func (w *world) jobEnv(t *testing.T, env []string) map[string]string {
	t.Helper()
	nonce := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000+1_000_000_000, 10)
	ctl := exec.Command(filepath.Join(root, "bin", "fm"), "on", "sm1", "wake", "watch", "--after", nonce)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FM_") {
			ctl.Env = append(ctl.Env, kv)
		}
	}
	ctl.Env = append(append(ctl.Env, "FM_HOME="+w.controller), env...)
	var out bytes.Buffer
	ctl.Stdout, ctl.Stderr = &out, &out
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { ctl.Wait(); close(done) }()
	t.Cleanup(func() {
		ctl.Process.Kill()
		<-done
	})
	want := []string{"wake", "watch", "--after", nonce}
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-done:
			t.Fatalf("fm on ... wake watch ended: %s", out.String())
		default:
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			data, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			argv := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
			if len(argv) != 5 || filepath.Base(argv[0]) != "fm" || !slices.Equal(argv[1:], want) {
				continue
			}
			raw, err := os.ReadFile(filepath.Join(filepath.Dir(p), "environ"))
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, kv := range strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00") {
				k, v, _ := strings.Cut(kv, "=")
				got[k] = v
			}
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			syscall.Kill(pid, syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Errorf("fm on did not end when its job was stopped")
			}
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the secondmate's fm wake watch never appeared: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkJobEnv checks the environment of a job's fm ([XFER-5]): exactly the
// fixed PATH, FM_HOME = the route's home and HOME (the account's own, from
// /etc/passwd, where it has an entry); nothing of the caller's.
func (w *world) checkJobEnv(t *testing.T, got map[string]string) {
	t.Helper()
	if got["PATH"] != "/usr/local/bin:/usr/bin:/bin" || got["FM_HOME"] != w.secondmate {
		t.Errorf("job environment %q: want PATH=/usr/local/bin:/usr/bin:/bin and FM_HOME=%s", got, w.secondmate)
	}
	for k := range got {
		if k != "PATH" && k != "FM_HOME" && k != "HOME" {
			t.Errorf("%s=%s reached the secondmate's fm", k, got[k])
		}
	}
}

// TestFakeSSHCarriesNoEnvironment runs a job through a stand-in ssh that,
// like an sshd accepting every variable (AcceptEnv *), gives the remote
// command the caller's whole environment: none of it reaches the
// secondmate's fm, whose environment is exactly PATH, FM_HOME and HOME
// ([XFER-5]); and an argument a shell would interpret reaches the
// secondmate's fm intact and unexecuted ([XFER-4]).
func TestFakeSSHCarriesNoEnvironment(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc")
	}
	w := newWorld(t)
	w.route(t, "me@secondmate.example")
	fake := filepath.Join(w.base, "fake-ssh")
	write(t, fake, []byte("#!/bin/sh\nfor cmd in \"$@\"; do :; done\nexec sh -c \"$cmd\"\n"), 0o755)
	env := append([]string{"FM_SSH_BIN=" + fake}, leakEnv...)
	w.checkJobEnv(t, w.jobEnv(t, env))

	pwned := filepath.Join(w.base, "PWNED")
	hostile := "$(touch " + pwned + ")`touch " + pwned + "`; touch " + pwned + " it's \"x\" \\ *"
	out, errOut, code := run(w.controller, env, nil, "on", "sm1", "extension", "inspect", hostile)
	if code != 1 || out != "" || !strings.Contains(errOut, strconv.Quote(hostile)) {
		t.Errorf("secondmate did not get the argument intact: exit %d, stderr %q", code, errOut)
	}
	if _, err := os.Lstat(pwned); err == nil {
		t.Error("an argument was executed by a shell")
	}
}

// TestRemoteBindLocalRoute binds into a secondmate home on this machine (a
// route without host) and retires it there, all through fm on ([XFER-5],
// [XFER-6]).
func TestRemoteBindLocalRoute(t *testing.T) {
	w := newWorld(t)
	w.route(t, "")
	out := w.remoteBind(t, nil)
	retired := fm(t, w.controller, nil, nil, "on", "sm1", "extension", "retire-transfer", exampleID,
		"--if-transfer-digest", field(t, out, "transfer-digest"), "--if-binding-digest", field(t, out, "binding-digest"))
	if !strings.HasPrefix(field(t, retired, "retained-at"), filepath.Join(w.secondmate, "data", "extensions", "retired-staging")+"/") {
		t.Errorf("retire-transfer:\n%s", retired)
	}
}

// TestOnUsage checks what fm on accepts as the secondmate's command
// ([XFER-4], [CLI-1]) and that the secondmate's own error comes back
// unchanged.
func TestOnUsage(t *testing.T) {
	w := newWorld(t)
	w.route(t, "")
	for _, args := range [][]string{
		{"on", "sm1"},
		{"on", "sm1", "on", "sm1", "extension", "list"},
		{"on", "sm1", "sh", "-c", "true"},
		{"on", "sm1", "on-receive", "e30"},
		{"on", "sm1", "--stdin"},
		{"on", "--timeout", "soon", "sm1", "extension", "list"},
		{"on", "--timeout", "-5s", "sm1", "extension", "list"},
		{"on", "--timeout"},
		{"on", "--stdin", "--stdin", "sm1", "extension", "list"},
		{"on", "--timeout", "1s", "--timeout", "2s", "sm1", "extension", "list"},
		{"on", "-x", "sm1", "extension", "list"},
	} {
		if _, errOut, code := run(w.controller, nil, nil, args...); code != 2 || !strings.HasPrefix(errOut, "error[usage]: ") {
			t.Errorf("fm %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
	}
	if out, _, code := run(w.controller, nil, nil, "on", "--help"); code != 0 || !strings.HasPrefix(out, "usage: fm on ") {
		t.Errorf("fm on --help: exit %d\n%s", code, out)
	}
	// on-receive, the remote end, is plumbing: not in the help or the
	// completion, and it runs no job it cannot decode.
	for _, args := range [][]string{{"help"}, {"completion", "bash"}} {
		if out, _, _ := run(w.controller, nil, nil, args...); strings.Contains(out, "on-receive") {
			t.Errorf("fm %s lists on-receive", strings.Join(args, " "))
		}
	}
	if _, errOut, code := run(w.controller, nil, nil, "on-receive", "e30"); code != 2 || !strings.HasPrefix(errOut, "error[usage]: ") {
		t.Errorf("fm on-receive with a bad job: exit %d, stderr %q", code, errOut)
	}
	// The secondmate's own failure comes back unchanged.
	out, errOut, code := run(w.controller, nil, nil, "on", "sm1", "extension", "inspect", "org.example.absent")
	if code != 1 || out != "" || !strings.HasPrefix(errOut, "error[binding-missing]: ") {
		t.Errorf("secondmate failure: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestRemoteBindRealSSH is the end-to-end test of [XFER-4] and [XFER-5]
// through a real OpenSSH server on 127.0.0.1 (a generated host key, one
// authorized key, StrictModes off for the temp directory): remote-bind,
// then register-extension, start, handled, retire and retire-transfer in
// the secondmate home, each through fm on.
func TestRemoteBindRealSSH(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the OpenSSH server test runs as root (sshd needs /run/sshd and its privilege separation)")
	}
	sshd := "/usr/sbin/sshd"
	if _, err := os.Stat(sshd); err != nil {
		t.Skip("sshd is not installed (apt-get install openssh-server openssh-client)")
	}
	for _, tool := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip(tool + " is not installed (apt-get install openssh-client)")
		}
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	keys := filepath.Join(w.base, "ssh")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"host_key", "user_key"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fm-test", "-f", filepath.Join(keys, k)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(keys, "user_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(keys, "authorized_keys"), pub, 0o600)
	port := freePort(t)
	config := filepath.Join(keys, "sshd_config")
	write(t, config, []byte(strings.Join([]string{
		"ListenAddress 127.0.0.1",
		"HostKey " + filepath.Join(keys, "host_key"),
		"AuthorizedKeysFile " + filepath.Join(keys, "authorized_keys"),
		"PidFile " + filepath.Join(keys, "sshd.pid"),
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password",
		"StrictModes no",
		"UsePAM no",
		"AcceptEnv LANG LC_* FMTEST_*",
		"LogLevel ERROR",
		"",
	}, "\n")), 0o600)
	var sshdLog bytes.Buffer
	server := exec.Command(sshd, "-D", "-e", "-f", config, "-p", port)
	server.Stdout, server.Stderr = &sshdLog, &sshdLog
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		server.Process.Kill()
		server.Wait()
	})
	waitListening(t, port, &sshdLog)

	wrapper := filepath.Join(w.base, "ssh-wrapper")
	write(t, wrapper, []byte("#!/bin/sh\nexec ssh -F /dev/null -i "+filepath.Join(keys, "user_key")+
		" -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"+
		" -o SendEnv=LANG -o SendEnv=LC_* -o SendEnv=FMTEST_* -p "+port+` "$@"`+"\n"), 0o755)
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	w.route(t, me.Username+"@127.0.0.1")
	env := []string{"FM_SSH_BIN=" + wrapper}
	on := func(args ...string) string {
		t.Helper()
		return fm(t, w.controller, env, nil, append([]string{"on", "sm1"}, args...)...)
	}

	bound := w.remoteBind(t, env)

	// [XFER-5] This sshd accepts, and this client sends, LANG, LC_* and
	// FMTEST_* (as Debian's ssh_config does for LANG and LC_*): none of it
	// reaches the secondmate's fm, whatever the remote login shell does.
	jobEnv := w.jobEnv(t, append(slices.Clone(env), leakEnv...))
	w.checkJobEnv(t, jobEnv)
	if jobEnv["HOME"] != me.HomeDir {
		t.Errorf("the job's HOME is %q, not the account's %q", jobEnv["HOME"], me.HomeDir)
	}
	// [XFER-4] An argument a shell would interpret arrives intact and
	// unexecuted through the real remote login shell.
	pwned := filepath.Join(w.base, "PWNED")
	hostile := "$(touch " + pwned + ")`touch " + pwned + "`; touch " + pwned + " it's \"x\" \\ *"
	if out, errOut, code := run(w.controller, env, nil, "on", "sm1", "extension", "inspect", hostile); code != 1 || out != "" || !strings.Contains(errOut, strconv.Quote(hostile)) {
		t.Errorf("secondmate did not get the argument intact: exit %d, stderr %q", code, errOut)
	}
	if _, err := os.Lstat(pwned); err == nil {
		t.Error("an argument was executed by the remote shell")
	}

	signal := filepath.Join(w.base, "signal")
	write(t, signal, []byte("hello from the secondmate\n"), 0o644)
	reg := on("procevent", "register-extension", "file-signal", "src1", "--config-ref", "file:"+signal)
	token := field(t, reg, "owner-token")
	started := on("procevent", "start", "src1")
	if captured := field(t, started, "captured"); !strings.HasPrefix(captured, filepath.Join(w.secondmate, "state", "procevent-inbox")+"/") {
		t.Errorf("start captured outside the secondmate's inbox:\n%s", started)
	}
	if got := on("procevent", "handled", "src1", "1"); got != "handled: src1 1\n" {
		t.Errorf("handled: %q", got)
	}
	if got := on("procevent", "retire", "src1", "--if-owner", token); got != "retired: src1\n" {
		t.Errorf("retire: %q", got)
	}
	retired := on("extension", "retire-transfer", exampleID,
		"--if-transfer-digest", field(t, bound, "transfer-digest"), "--if-binding-digest", field(t, bound, "binding-digest"))
	if !strings.HasPrefix(field(t, retired, "retained-at"), filepath.Join(w.secondmate, "data", "extensions", "retired-staging")+"/") {
		t.Errorf("retire-transfer:\n%s", retired)
	}
	if got := on("extension", "list"); got != "no extension bindings\n" {
		t.Errorf("secondmate after retire-transfer:\n%s", got)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func waitListening(t *testing.T, port string, log *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd is not listening on %s: %v\n%s", port, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
