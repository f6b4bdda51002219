package doctor_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/doctor"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/internal/transfer"
)

// receive receives the fake package by transfer and returns its binding and
// its staged unit.
func (f *fixture) receive() (*binding.Binding, string) {
	f.t.Helper()
	env, err := transfer.Pack(f.pkg, f.h.Dir)
	if err != nil {
		f.t.Fatal(err)
	}
	r, err := transfer.Receive(context.Background(), f.h, bytes.NewReader(env), host.BindOptions{Adapters: []string{"fake"}, Trust: true, TimeoutMS: 30000})
	if err != nil {
		f.t.Fatal(err)
	}
	return r.Binding, r.Unit
}

// transfers returns the findings of check "transfer".
func (f *fixture) transfers() []doctor.Finding {
	var out []doctor.Finding
	for _, x := range doctor.Check(f.h) {
		if x.Check == "transfer" {
			out = append(out, x)
		}
	}
	return out
}

// runFix runs the fm command a finding's fix names, in the fixture's home.
func (f *fixture) runFix(fix string) {
	f.t.Helper()
	args := strings.Fields(strings.TrimPrefix(fix, "fm "))
	c := exec.Command(testpkg.FM(f.t), args...)
	c.Env = append(os.Environ(), "FM_HOME="+f.h.Dir, "FM_ROOT_OVERRIDE="+f.h.Root)
	if out, err := c.CombinedOutput(); err != nil {
		f.t.Fatalf("the fix %q: %v\n%s", fix, err, out)
	}
}

// [XFER-6] [XFER-3] doctor reports every transfer unit an interrupted
// operation left half-way, each with what finishes it; the on-disk states
// are exactly those the interrupted runs leave (a retire-transfer's first
// move is one rename of the binding file into the unit; a receive killed
// before its bind published the binding leaves the unit and nothing naming
// it). A healthy received transfer adds no finding.
func TestHalfFinishedTransfers(t *testing.T) {
	t.Run("between-moves", func(t *testing.T) {
		f := newFixture(t)
		b, unit := f.receive()
		if got := f.transfers(); len(got) != 0 {
			t.Fatalf("findings for a healthy transfer: %+v", got)
		}
		if err := os.Rename(b.Path, filepath.Join(unit, transfer.BindingFile)); err != nil {
			t.Fatal(err)
		}
		got := f.transfers()
		if len(got) != 1 {
			t.Fatalf("findings %+v", got)
		}
		want(t, got[0], doctor.Fail, errcode.RetirementPartial, "stopped between its two moves", "fm extension retire-transfer org.example.fake --if-transfer-digest sha256:"+filepath.Base(unit)+" --if-binding-digest "+b.Digest)
		f.runFix(got[0].Fix)
		if got := f.transfers(); len(got) != 0 {
			t.Fatalf("findings after the fix: %+v", got)
		}
	})
	t.Run("enabled-and-retained", func(t *testing.T) {
		f := newFixture(t)
		b, unit := f.receive()
		data, err := os.ReadFile(b.Path)
		if err != nil {
			t.Fatal(err)
		}
		f.write(filepath.Join(unit, transfer.BindingFile), string(data), 0o600)
		got := f.transfers()
		if len(got) != 1 {
			t.Fatalf("findings %+v", got)
		}
		want(t, got[0], doctor.Fail, errcode.RetirementPartial, "enabled at "+b.Path+" and also retained", "cmp ")
	})
	t.Run("staged-and-retired", func(t *testing.T) {
		f := newFixture(t)
		_, unit := f.receive()
		rel, _ := filepath.Rel(f.h.Staging(), unit)
		retired := filepath.Join(f.h.RetiredStaging(), rel)
		if err := os.MkdirAll(retired, 0o700); err != nil {
			t.Fatal(err)
		}
		got := f.transfers()
		if len(got) != 1 {
			t.Fatalf("findings %+v", got)
		}
		// The staged unit is the bound one: the fix keeps it.
		want(t, got[0], doctor.Fail, errcode.RetirementPartial, "both staged at "+unit+" and retired at "+retired, "rm -r "+retired)
	})
	t.Run("staged-unbound", func(t *testing.T) {
		f := newFixture(t)
		b, _ := f.receive()
		if err := os.Remove(b.Path); err != nil {
			t.Fatal(err)
		}
		got := f.transfers()
		if len(got) != 1 {
			t.Fatalf("findings %+v", got)
		}
		want(t, got[0], doctor.Warn, "", "no binding names it", "receive-transfer-bind")
	})
}
