package launch

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/confine"
	"firstmate.dev/fm/internal/launch/barrier"
)

// [CONF-4]: a confined barrier whose ruleset the kernel refuses (here a
// descriptor that is no ruleset) exits barrier.ConfineFailed and executes
// nothing: it never runs the entrypoint unrestricted.
func TestConfinedBarrierNeverRunsUnrestricted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := filepath.Join(dir, "ep")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n: > "+marker+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	notRuleset, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer notRuleset.Close()
	cmd := exec.Command(os.Args[0], BarrierArg+barrier.Confined, script, "verb")
	cmd.Env = barrier.Env(nil)
	cmd.ExtraFiles = []*os.File{releasedPipe(t), nil, notRuleset}
	err = cmd.Run()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != barrier.ConfineFailed {
		t.Fatalf("%v, want exit %d", err, barrier.ConfineFailed)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the entrypoint ran")
	}
}

// [CONF-4]: Spec.Ruleset confines the entrypoint from its first
// instruction: a script (executed through its descriptor) may write in the
// state the ruleset grants and nowhere else, and does not inherit the
// ruleset's descriptor.
func TestRulesetConfinesTheEntrypoint(t *testing.T) {
	t.Parallel()
	if confine.Probe() < 1 {
		t.Skip("this kernel has no Landlock")
	}
	f := newFixture(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(state, 0o777)
	s := f.spec("good")
	rs, _, err := confine.Build(confine.Enforce, confine.Probe(), confine.Grant{PackageRoot: dir, State: state})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	script := filepath.Join(dir, "ep")
	body := "#!/bin/sh\n(: >" + filepath.Join(dir, "outside") + ") 2>/dev/null && echo outside-written\n: >" + filepath.Join(state, "in") + " && echo state-written\nls /proc/self/fd | tr '\\n' ' '\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	ep, err := os.Open(script)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	s.Path, s.Exec, s.Ruleset = script, ep, rs
	res, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Stdout)
	if strings.Contains(out, "outside-written") || !strings.Contains(out, "state-written") {
		t.Fatalf("stdout %q: want a write in the state only", out)
	}
	// 0, 1, 2, the script's own 3, and the one ls opens to list them.
	if fds := strings.Fields(out[strings.LastIndex(out, "\n")+1:]); len(fds) > 5 {
		t.Fatalf("the entrypoint holds descriptors %v, want 0-3 (and ls's own)", fds)
	}
}

// [CONF-1]: a confined entrypoint has no capability whatever its uid, and
// so cannot read /proc/<pid>/environ of a process outside its domain (here
// the test, its parent): run by root, CAP_SYS_ADMIN or CAP_PERFMON alone
// lets it past Landlock's ptrace rule.
func TestConfinedEntrypointHasNoCapabilities(t *testing.T) {
	t.Parallel()
	if confine.Probe() < 1 {
		t.Skip("this kernel has no Landlock")
	}
	f := newFixture(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	rs, _, err := confine.Build(confine.Enforce, confine.Probe(), confine.Grant{PackageRoot: dir, State: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	script := filepath.Join(dir, "ep")
	body := "#!/bin/sh\nhead -c 1 /proc/$PPID/environ >/dev/null 2>&1 && echo environ-read\ngrep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	ep, err := os.Open(script)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	s := f.spec("good")
	s.Path, s.Exec, s.Ruleset = script, ep, rs
	res, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Stdout)
	if strings.Contains(out, "environ-read") {
		t.Fatalf("the confined entrypoint read its parent's environ: %q", out)
	}
	// A user other than root keeps its bounding set, which no-new-privileges
	// leaves unusable; root's must be empty.
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, "\t")
		if strings.Trim(v, "0") != "" && (k != "CapBnd:" || os.Geteuid() == 0) {
			t.Fatalf("the confined entrypoint holds capabilities: %q", out)
		}
	}
	if strings.Count(out, "Cap") != 4 {
		t.Fatalf("stdout %q: want its four capability sets", out)
	}
}
