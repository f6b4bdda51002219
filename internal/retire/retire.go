// Package retire takes enabled bindings out of a home's registry (CONTRACT
// [LIFE-2], [XFER-6]).
//
// Every retirement of an enabled binding runs one sequence, Enabled, under
// the lifecycle lock: the binding's digest is the one the operator named
// (else owner-mismatch), it belongs to the verb that retires it (a received
// binding to retire-transfer, any other to retire-binding), its installed
// package revalidates, nothing depends on it (the process-event preflight:
// registrations and unhandled results; then the invocation records), and
// only then is the binding file moved, by the one binding-move step, which
// re-reads the file and moves exactly those bytes. The preflight is called
// here directly, not handed in by a caller, so no caller can skip it: this
// package is the only code that moves an enabled binding out of
// config/extensions.d.
//
// Callers: the CLI's retire-binding verb calls Binding; transfer.Retire
// (retire-transfer) validates its staged unit and calls Enabled with the
// unit as the binding's destination. Nothing else retires a binding.
package retire

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/lifecycle"
	"firstmate.dev/fm/internal/procevent"
)

// Binding is retire-binding ([LIFE-2]): it retires exactly the binding of id
// whose digest is digest into
// data/extensions/retired-bindings/<id>/<digest-hex>.json under the
// lifecycle lock, and returns that path. Its wait for the lock ends when ctx
// does ([LIFE-1]). A binding that does not exist is binding-missing before
// any lock (or lock file) is taken, so a failed retire on a fresh home
// creates nothing ([HOME-5]). The registry is read with
// binding.LoadForRetire: an adapter conflict involving id does not refuse
// its retirement, which is how the operator undoes it. A binding received by
// transfer is refused (transfer-exists): retire-transfer retires it with its
// staged unit.
func Binding(ctx context.Context, h *home.Home, id, digest string) (string, error) {
	if !binding.CheckDigest(digest) {
		return "", errcode.New(errcode.Usage, "--if-binding-digest %q must be sha256:<64 lowercase hex>", digest)
	}
	if bs, err := binding.LoadForRetire(h, id); err != nil {
		return "", err
	} else if _, err := binding.Find(bs, id); err != nil {
		return "", err
	}
	lock, err := lifecycle.Acquire(ctx, h)
	if err != nil {
		return "", err
	}
	defer lock.Release()
	return Held(h, id, digest)
}

// Held is Binding for a caller that holds the lifecycle lock (fm extension
// upgrade, [UPG-1]).
func Held(h *home.Home, id, digest string) (string, error) {
	host.SweepTemps(h)
	bs, err := binding.LoadForRetire(h, id)
	if err != nil {
		return "", err
	}
	b, err := binding.Find(bs, id)
	if err != nil {
		return "", err
	}
	notTransferred := func(b *binding.Binding) error {
		if strings.HasPrefix(b.Source.Path, h.Staging()+string(filepath.Separator)) {
			return errcode.New(errcode.TransferExists, "binding %s was received by transfer; retire it with fm extension retire-transfer", id)
		}
		return nil
	}
	dst := filepath.Join(h.RetiredBindings(), b.ExtensionID, binding.Hex(b.Digest)+".json")
	if err := Enabled(h, b, digest, notTransferred, dst, true); err != nil {
		return "", err
	}
	return dst, nil
}

// Enabled is the one retirement sequence of an enabled binding b, read from
// the registry by a caller that holds the lifecycle lock ([LIFE-1]). In
// order: b's digest must be digest (owner-mismatch); owns (never nil) checks
// that b is the caller's to retire; b's installed package must revalidate;
// nothing may depend on b (procevent.Preflight: a registration or an
// unhandled result; host.ReleaseInvocations: an invocation record), else
// binding-in-use; then b moves to dst (moveBinding; with mkdir, dst's
// directory is created when missing, else it must exist). Anything refused
// before the move changes nothing in the registry.
func Enabled(h *home.Home, b *binding.Binding, digest string, owns func(*binding.Binding) error, dst string, mkdir bool) error {
	if b.Digest != digest {
		return errcode.New(errcode.OwnerMismatch, "binding %s has digest %s, not %s; inspect it and retry with the current digest", b.ExtensionID, b.Digest, digest)
	}
	if err := owns(b); err != nil {
		return err
	}
	if err := host.Revalidate(&b.Record); err != nil {
		return err
	}
	if err := procevent.Preflight(h, b); err != nil {
		return err
	}
	if err := host.ReleaseInvocations(h, b.Digest); err != nil {
		return err
	}
	return moveBinding(b, dst, mkdir)
}

// beforeMove, when set by a test, runs at the start of moveBinding, to
// replace the binding file deterministically between the sequence's checks
// and the move.
var beforeMove func(b *binding.Binding)

// moveBinding is the one binding-move step: it moves exactly the enabled
// binding b to dst. The file is re-read through the private-file rules right
// before the move and must still have b's digest, so a concurrent
// replacement is never moved by a stale caller (owner-mismatch). dst's
// directory must be private; with mkdir it is created (0700) when missing
// (retire-binding's retired-bindings/<id>), without it it must already exist
// (retire-transfer's unit, validated by the caller: a unit moved away since
// is refused, path-unsafe, never made up empty and retired). The rename replaces
// nothing; a dst that already holds the very same bytes (the binding was
// retired before and restored by copy) is kept and the enabled file removed.
// Both directories are fsynced, dst's first (fsutil.MoveNoReplace), so the
// move is durable when it returns, a crash never leaves the binding under
// neither name, and
// moving dst back restores the binding.
func moveBinding(b *binding.Binding, dst string, mkdir bool) error {
	if beforeMove != nil {
		beforeMove(b)
	}
	data, err := fsutil.ReadPrivateFile(b.Path, binding.MaxBytes)
	if err != nil {
		return err
	}
	if binding.Digest(data) != b.Digest {
		return errcode.New(errcode.OwnerMismatch, "binding %q changed since it was validated; re-run with its current digest", b.Path)
	}
	dir := filepath.Dir(dst)
	ensure := home.CheckPrivate
	if mkdir {
		ensure = home.EnsurePrivate
	}
	if err := ensure(dir, false); err != nil {
		return err
	}
	if err := fsutil.MoveNoReplace(b.Path, dst); err != nil {
		if _, raw := err.(unix.Errno); !raw {
			return err
		}
		if err == unix.EEXIST {
			old, rerr := os.ReadFile(dst)
			if rerr == nil && bytes.Equal(old, data) {
				if err := os.Remove(b.Path); err != nil {
					return errcode.Wrap(errcode.Internal, err, "remove binding %q", b.Path)
				}
				return fsutil.SyncDir(filepath.Dir(b.Path))
			}
		}
		return errcode.Wrap(errcode.Internal, err, "retire binding %q", b.Path)
	}
	return nil
}
