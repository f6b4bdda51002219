package retire_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/cli"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/testpkg"
	"firstmate.dev/fm/internal/transfer"
)

// The tests run real packages (testpkg's fake, adapter "fake") bound or
// received into throwaway homes; the CLI is this test binary run as fm
// (envPlayFM).
func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	if os.Getenv(envPlayFM) != "" {
		os.Exit(cli.Run())
	}
	os.Exit(m.Run())
}

// envPlayFM makes the test binary run as fm with its arguments.
const envPlayFM = "FM_TEST_RETIRE_PLAY_FM"

const fakeID = "org.example.fake"

var fakeOptions = host.BindOptions{Adapters: []string{"fake"}, Trust: true}

// bound is a home with the fake package bound directly (retire-binding's).
func bound(t *testing.T) (*home.Home, *binding.Binding) {
	t.Helper()
	h, pkg := testpkg.Home(t)
	opts := fakeOptions
	opts.Dir = pkg
	b, err := host.Bind(context.Background(), h, opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, b
}

// received is a home with the fake package received by transfer
// (retire-transfer's).
func received(t *testing.T) (*home.Home, *transfer.Received) {
	t.Helper()
	h, pkg := testpkg.Home(t)
	data, err := transfer.Pack(pkg, h.Dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := transfer.Receive(context.Background(), h, bytes.NewReader(data), fakeOptions)
	if err != nil {
		t.Fatal(err)
	}
	return h, r
}

// fm runs the CLI in home h and returns its stdout, stderr and exit status.
func fm(t *testing.T, h *home.Home, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envPlayFM+"=1", "FM_HOME="+h.Dir, "FM_ROOT_OVERRIDE="+h.Root)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("fm %v: %v", args, err)
		}
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// refused requires err to carry code and the home's registry to still
// enable exactly b.
func refused(t *testing.T, what string, h *home.Home, b *binding.Binding, err error, code errcode.Code) {
	t.Helper()
	if !errcode.Is(err, code) {
		t.Fatalf("%s: %v, want error[%s]", what, err, code)
	}
	stillEnabled(t, what, h, b)
}

// cliRefused requires the CLI to fail with exactly one error line of code
// and the home's registry to still enable exactly b.
func cliRefused(t *testing.T, h *home.Home, b *binding.Binding, code errcode.Code, args ...string) {
	t.Helper()
	out, errs, status := fm(t, h, args...)
	if status != 1 || out != "" || !strings.HasPrefix(errs, "error["+string(code)+"]: ") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("fm %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), status, out, errs)
	}
	stillEnabled(t, "fm "+args[1], h, b)
}

func stillEnabled(t *testing.T, what string, h *home.Home, b *binding.Binding) {
	t.Helper()
	if bs, err := binding.Load(h); err != nil || len(bs) != 1 || bs[0].Digest != b.Digest {
		t.Fatalf("%s moved the binding: %v %v", what, bs, err)
	}
}

// register registers an extension source with the home's "fake" binding
// and returns its owner token.
func register(t *testing.T, h *home.Home, id string) string {
	t.Helper()
	r, err := procevent.RegisterExtension(context.Background(), h, "fake", id, "ref-"+id)
	if err != nil {
		t.Fatal(err)
	}
	return r.Token
}

// [LIFE-2] [XFER-6] The dependency preflight cannot be skipped: with a source
// registered with the binding, every entry point that retires a binding
// refuses with binding-in-use and moves nothing: retire.Binding and
// transfer.Retire (the library), fm extension retire-binding and fm extension
// retire-transfer (the CLI). retire-binding of a received binding is refused
// as well (transfer-exists). Once the source is retired, the same calls
// succeed: the refusal was the registration's.
func TestPreflightEveryEntryPoint(t *testing.T) {
	ctx := context.Background()

	h, b := bound(t)
	tok := register(t, h, "s1")
	_, err := retire.Binding(ctx, h, fakeID, b.Digest)
	refused(t, "retire.Binding", h, b, err, errcode.BindingInUse)
	if !strings.Contains(err.Error(), `registered source(s): s1;`) {
		t.Errorf("the refusal %q does not name the source", err)
	}
	cliRefused(t, h, b, errcode.BindingInUse, "extension", "retire-binding", fakeID, "--if-binding-digest", b.Digest)

	h2, r := received(t)
	tok2 := register(t, h2, "s2")
	_, err = transfer.Retire(ctx, h2, fakeID, r.TransferDigest, r.Binding.Digest)
	refused(t, "transfer.Retire", h2, r.Binding, err, errcode.BindingInUse)
	cliRefused(t, h2, r.Binding, errcode.BindingInUse, "extension", "retire-transfer", fakeID, "--if-transfer-digest", r.TransferDigest, "--if-binding-digest", r.Binding.Digest)
	_, err = retire.Binding(ctx, h2, fakeID, r.Binding.Digest)
	refused(t, "retire.Binding of a received binding", h2, r.Binding, err, errcode.TransferExists)
	cliRefused(t, h2, r.Binding, errcode.TransferExists, "extension", "retire-binding", fakeID, "--if-binding-digest", r.Binding.Digest)

	for _, c := range []struct {
		h    *home.Home
		src  string
		tok  string
		verb []string
	}{
		{h, "s1", tok, []string{"extension", "retire-binding", fakeID, "--if-binding-digest", b.Digest}},
		{h2, "s2", tok2, []string{"extension", "retire-transfer", fakeID, "--if-transfer-digest", r.TransferDigest, "--if-binding-digest", r.Binding.Digest}},
	} {
		if out, errs, status := fm(t, c.h, "procevent", "retire", c.src, "--if-owner", c.tok); status != 0 {
			t.Fatalf("retire %s: %s%s", c.src, out, errs)
		}
		if out, errs, status := fm(t, c.h, c.verb...); status != 0 || !strings.Contains(out, "retired-binding: "+fakeID+" ") {
			t.Fatalf("fm %s once nothing depends on the binding: exit %d\n%s%s", c.verb[1], status, out, errs)
		}
	}
}

// retained describes what a retirement left of the binding it moved: the
// retained file and the directory holding it.
type retained struct {
	sameFile bool // the very inode that was enabled: moved, never copied
	sameData bool
	mode     os.FileMode
	dirMode  os.FileMode
	enabled  bool // a file is still at the enabled path
}

func inspect(t *testing.T, before os.FileInfo, b *binding.Binding, data []byte, kept string) retained {
	t.Helper()
	fi, err := os.Lstat(kept)
	if err != nil {
		t.Fatalf("nothing retained at %s: %v", kept, err)
	}
	got, _ := os.ReadFile(kept)
	di, err := os.Lstat(filepath.Dir(kept))
	if err != nil {
		t.Fatal(err)
	}
	_, err = os.Lstat(b.Path)
	return retained{
		sameFile: os.SameFile(before, fi),
		sameData: bytes.Equal(got, data),
		mode:     fi.Mode(),
		dirMode:  di.Mode().Perm(),
		enabled:  err == nil,
	}
}

// [LIFE-2] [XFER-6] Both retirements move the binding through the one
// binding-move step. It runs exactly once per retirement; a binding replaced
// between the sequence's checks and the move (injected at the step) is
// refused by both with owner-mismatch and stays enabled, nothing retained;
// and both leave the same result: the enabled inode itself, same bytes, mode
// 0600, in a private directory, and nothing at the enabled path.
func TestOneBindingMoveStep(t *testing.T) {
	ctx := context.Background()
	type verb struct {
		name   string
		setup  func(t *testing.T) (*home.Home, *binding.Binding)
		retire func(h *home.Home, b *binding.Binding) (kept string, err error)
		none   func(h *home.Home, b *binding.Binding) string // where a refused move must leave nothing
	}
	var rcv *transfer.Received // retire-transfer's current receive
	verbs := []verb{
		{"retire-binding", bound,
			func(h *home.Home, b *binding.Binding) (string, error) {
				return retire.Binding(ctx, h, fakeID, b.Digest)
			},
			func(h *home.Home, b *binding.Binding) string {
				return filepath.Join(h.RetiredBindings(), fakeID, binding.Hex(b.Digest)+".json")
			}},
		{"retire-transfer",
			func(t *testing.T) (*home.Home, *binding.Binding) {
				h, r := received(t)
				rcv = r
				return h, r.Binding
			},
			func(h *home.Home, b *binding.Binding) (string, error) {
				res, err := transfer.Retire(ctx, h, fakeID, rcv.TransferDigest, b.Digest)
				if err != nil {
					return "", err
				}
				return filepath.Join(res.At, transfer.BindingFile), nil
			},
			func(h *home.Home, b *binding.Binding) string { return filepath.Join(rcv.Unit, transfer.BindingFile) }},
	}
	results := map[string]retained{}
	for _, v := range verbs {
		t.Run(v.name+"/replaced before the move", func(t *testing.T) {
			h, b := v.setup(t)
			replacement := []byte(`{"replaced":true}`)
			retire.SetBeforeMove(t, func(got *binding.Binding) {
				tmp := filepath.Join(filepath.Dir(filepath.Dir(got.Path)), "replacement.json")
				if err := os.WriteFile(tmp, replacement, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, got.Path); err != nil {
					t.Fatal(err)
				}
			})
			_, err := v.retire(h, b)
			if !errcode.Is(err, errcode.OwnerMismatch) {
				t.Fatalf("a binding replaced before the move: %v, want owner-mismatch", err)
			}
			if data, err := os.ReadFile(b.Path); err != nil || !bytes.Equal(data, replacement) {
				t.Fatalf("the replacement was moved: %q %v", data, err)
			}
			if _, err := os.Lstat(v.none(h, b)); !os.IsNotExist(err) {
				t.Fatalf("a refused move retained %s: %v", v.none(h, b), err)
			}
		})
		t.Run(v.name, func(t *testing.T) {
			h, b := v.setup(t)
			before, err := os.Lstat(b.Path)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(b.Path)
			if err != nil {
				t.Fatal(err)
			}
			calls := 0
			retire.SetBeforeMove(t, func(got *binding.Binding) {
				if calls++; got.Digest != b.Digest {
					t.Errorf("the move step got binding %s, want %s", got.Digest, b.Digest)
				}
			})
			kept, err := v.retire(h, b)
			if err != nil {
				t.Fatal(err)
			}
			if calls != 1 {
				t.Fatalf("the binding-move step ran %d times, want once", calls)
			}
			results[v.name] = inspect(t, before, b, data, kept)
		})
	}
	want := retained{sameFile: true, sameData: true, mode: 0o600, dirMode: 0o700}
	for name, got := range results {
		if got != want {
			t.Errorf("%s left %+v, want %+v", name, got, want)
		}
	}
	if len(results) != len(verbs) {
		t.Errorf("%d of %d retirements succeeded", len(results), len(verbs))
	}
}

// [LIFE-2] retire-binding moves exactly that file into
// retired-bindings/<id>/<digest-hex>.json, the installed package stays, and
// moving the file back restores the binding; a retained file restored by
// copy (the same bytes at both places) is retired again to the same path.
func TestRetireBindingRestorable(t *testing.T) {
	ctx := context.Background()
	h, b := bound(t)
	kept, err := retire.Binding(ctx, h, fakeID, b.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(h.RetiredBindings(), fakeID, binding.Hex(b.Digest)+".json"); kept != want {
		t.Fatalf("kept at %s, want %s", kept, want)
	}
	if bs, _ := binding.Load(h); len(bs) != 0 {
		t.Fatal("binding still enabled")
	}
	if _, err := os.Lstat(b.PackageRoot); err != nil {
		t.Fatalf("installed package removed: %v", err)
	}
	data, _ := os.ReadFile(kept)
	if err := os.WriteFile(b.Path, data, 0o600); err != nil { // restored by copy
		t.Fatal(err)
	}
	if _, err := host.Verify(ctx, h, fakeID); err != nil {
		t.Fatalf("restored binding: %v", err)
	}
	if again, err := retire.Binding(ctx, h, fakeID, b.Digest); err != nil || again != kept {
		t.Fatalf("retire of a binding restored by copy: %s %v", again, err)
	}
	if _, err := os.Lstat(b.Path); !os.IsNotExist(err) {
		t.Fatalf("the copy is still enabled: %v", err)
	}
	if err := os.Rename(kept, b.Path); err != nil {
		t.Fatal(err)
	}
	if _, err := host.Verify(ctx, h, fakeID); err != nil {
		t.Fatalf("restored binding: %v", err)
	}
}
