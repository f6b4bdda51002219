package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/pkgtree"
)

// hazard is one refusable thing the parity generator plants in a tree: the
// code bind refuses it with, and the code a receiver refuses its hand-built
// envelope with ("" when an envelope cannot express it: a hard link is two
// files there, which a receiver rebuilds as two single-link files).
type hazard struct {
	what       string
	bind, recv errcode.Code
}

// parityTree plants, below dir (the example package), up to 10 random
// entries, each a normal one or a hazard, and returns the hazards planted.
func parityTree(t *testing.T, r *rand.Rand, dir string) []hazard {
	t.Helper()
	names := []string{"a", "b", "a.x", "lib", "x-y", "é", "data"}
	type badName struct {
		name string
		recv errcode.Code
	}
	badNames := []badName{
		{".git", errcode.PathUnsafe},
		{"bad\x01name", errcode.PathUnsafe},
		{"c1\u0085x", errcode.PathUnsafe},
		{"tab\tname", errcode.PathUnsafe},
		{"del\x7f", errcode.PathUnsafe},
		{"inv\xff\xfe", errcode.JSONInvalid}, // JSON cannot carry invalid UTF-8
	}
	dirs := []string{dir}
	var planted []hazard
	n := r.IntN(11)
	for range n {
		parent := dirs[r.IntN(len(dirs))]
		name := names[r.IntN(len(names))]
		var h *hazard
		if r.IntN(4) == 0 {
			b := badNames[r.IntN(len(badNames))]
			name = b.name
			h = &hazard{"name " + fmt.Sprintf("%q", b.name), errcode.PathUnsafe, b.recv}
		}
		p := filepath.Join(parent, name)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		kind := r.IntN(10)
		switch {
		case kind == 5:
			must(t, os.Symlink("/etc/passwd", p))
			h = pick(h, hazard{"symlink", errcode.LinkUnsafe, errcode.LinkUnsafe})
		case kind == 6:
			must(t, syscall.Mkfifo(p, 0o644))
			h = pick(h, hazard{"fifo", errcode.PackageInvalid, errcode.PackageInvalid})
		case kind == 7:
			mustWrite(t, p, []byte("group writable\n"), 0o664)
			h = pick(h, hazard{"group-writable file", errcode.ModeUnsafe, errcode.ModeUnsafe})
		case kind == 8:
			mustMkdir(t, p, 0o777)
			dirs = append(dirs, p)
			h = pick(h, hazard{"world-writable directory", errcode.ModeUnsafe, errcode.ModeUnsafe})
		case kind == 9:
			must(t, os.Link(filepath.Join(dir, "firstmate-extension.json"), p))
			h = pick(h, hazard{"hard link", errcode.LinkUnsafe, ""})
		case kind < 2:
			mustMkdir(t, p, 0o755)
			dirs = append(dirs, p)
		default:
			mode := fs.FileMode(0o644)
			if kind == 4 {
				mode = 0o755
			}
			mustWrite(t, p, []byte(name+"\n"), mode)
		}
		if h != nil {
			planted = append(planted, *h)
		}
	}
	return planted
}

// pick keeps the name hazard when there is one: it is the entry's first
// refusal for both readers (names are checked before types and modes).
func pick(name *hazard, entry hazard) *hazard {
	if name != nil {
		return name
	}
	return &entry
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// handEnvelope builds the envelope of the tree at dir by hand, as an
// attacker would, without any of Pack's checks: every entry under its real
// name, type and permission bits, payloads of every regular file, sorted
// and sealed so that only the receiver's rules can refuse it. Names that
// JSON cannot carry (invalid UTF-8) are written raw.
func handEnvelope(t *testing.T, dir string) []byte {
	t.Helper()
	env := &Envelope{Schema: Schema, Manifest: Manifest{Schema: ManifestSchema, ExtensionID: exampleID, ExtensionVersion: exampleVersion}}
	raw := map[string]string{} // placeholder -> raw name
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		must(t, err)
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		must(t, err)
		e := Entry{Path: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm())}
		var payload *string
		switch {
		case fi.IsDir():
			e.Type = TypeDirectory
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			must(t, err)
			sum := "sha256:" + hex.EncodeToString(func() []byte { s := sha256.Sum256(data); return s[:] }())
			b64 := base64.StdEncoding.EncodeToString(data)
			e.Type, e.Size, e.SHA256, payload = TypeFile, int64(len(data)), &sum, &b64
		case fi.Mode()&fs.ModeSymlink != 0:
			e.Type = "symlink"
		default:
			e.Type = "fifo"
		}
		env.Manifest.Entries = append(env.Manifest.Entries, e)
		env.Payloads = append(env.Payloads, payload)
		return nil
	}))
	order := make([]int, len(env.Manifest.Entries))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(env.Manifest.Entries[a].Path, env.Manifest.Entries[b].Path) })
	var entries []Entry
	var payloads []*string
	for _, i := range order {
		e := env.Manifest.Entries[i]
		if strings.ToValidUTF8(e.Path, "\x00") != e.Path {
			ph := fmt.Sprintf("placeholder-%d", len(raw))
			raw[ph] = e.Path
			e.Path = ph
		}
		entries = append(entries, e)
		payloads = append(payloads, env.Payloads[i])
	}
	env.Manifest.Entries, env.Payloads = entries, payloads
	env.Manifest.PackageDigest = plainDigest(t, dir)
	data := seal(t, env)
	for ph, name := range raw {
		data = bytes.ReplaceAll(data, []byte(`"`+ph+`"`), append(append([]byte(`"`), name...), '"'))
	}
	return data
}

// plainDigest is the [PKG-5] digest of the tree an envelope of dir
// describes: that of a fresh copy of its directories and regular files (a
// hard link becomes two files). A tree holding anything else has no such
// digest; a zero digest stands in, for an envelope a receiver refuses anyway.
func plainDigest(t *testing.T, dir string) string {
	t.Helper()
	cp := filepath.Join(tempDir(t), "copy")
	plain := true
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		must(t, err)
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		must(t, err)
		switch {
		case fi.IsDir():
			mustMkdir(t, filepath.Join(cp, rel), 0o755)
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			must(t, err)
			mustWrite(t, filepath.Join(cp, rel), data, fi.Mode().Perm()&^0o022)
		default:
			plain = false
		}
		return nil
	}))
	if tree, err := pkgtree.Scan(cp, pkgtree.Source); plain && err == nil {
		return tree.Digest
	}
	return "sha256:" + strings.Repeat("0", 64)
}

// TestReceiverRefusesWhatBindRefuses is the parity property of [PKG-2]
// [PKG-3] [XFER-2] [XFER-3]: for random trees built from the example
// package with hazards planted (bad names, .git at any depth, symlinks,
// FIFOs, group- or world-writable entries, hard links), bind of the tree
// and receive-transfer-bind of its hand-built envelope agree: each refuses
// with the code of one planted hazard (the same code when exactly one was
// planted), a receiver refuses whenever a hazard its envelope can express
// was planted and leaves nothing staged or bound then, and both accept a
// tree without hazards. Seeded: a failure names its seed.
func TestReceiverRefusesWhatBindRefuses(t *testing.T) {
	iterations := 160
	if testing.Short() {
		iterations = 40
	}
	seen := map[string]int{}
	for seed := range uint64(iterations) {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		dir := examplePackage(t, nil)
		planted := parityTree(t, r, dir)
		env := handEnvelope(t, dir)

		bindHome, recvHome := newHome(t), newHome(t)
		opts := exampleOptions
		opts.Dir = dir
		_, bindErr := host.Bind(context.Background(), bindHome, opts)
		_, recvErr := Receive(context.Background(), recvHome, bytes.NewReader(env), exampleOptions)

		var bindCodes, recvCodes []errcode.Code
		for _, h := range planted {
			seen[h.what]++
			bindCodes = append(bindCodes, h.bind)
			if h.recv != "" {
				recvCodes = append(recvCodes, h.recv)
			}
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d, planted %+v: %s", seed, planted, fmt.Sprintf(format, args...))
		}
		switch {
		case len(bindCodes) == 0 && bindErr != nil:
			fail("bind refused a tree without hazards: %v", bindErr)
		case len(bindCodes) > 0 && bindErr == nil:
			fail("bind accepted the tree")
		case bindErr != nil && !slices.Contains(bindCodes, errcode.Of(bindErr)):
			fail("bind refused with %v", bindErr)
		case len(recvCodes) == 0 && recvErr != nil:
			fail("the receiver refused an envelope without expressible hazards: %v", recvErr)
		case len(recvCodes) > 0 && recvErr == nil:
			fail("the receiver accepted what bind refuses (bind: %v)", bindErr)
		case recvErr != nil && !slices.Contains(recvCodes, errcode.Of(recvErr)):
			fail("the receiver refused with %v", recvErr)
		case len(planted) == 1 && recvErr != nil && errcode.Of(recvErr) != errcode.Of(bindErr) && planted[0].recv == planted[0].bind:
			fail("bind refused with %v but the receiver with %v", bindErr, recvErr)
		}
		if recvErr != nil {
			assertNothingLeft(t, recvHome)
		}
		if len(planted) == 0 {
			seen["no hazard"]++
		}
	}
	for _, what := range []string{"no hazard", `name ".git"`, `name "bad\x01name"`, `name "c1\u0085x"`, `name "inv\xff\xfe"`, "symlink", "fifo", "group-writable file", "world-writable directory", "hard link"} {
		if seen[what] == 0 {
			t.Errorf("the generator never planted %s", what)
		}
	}
	t.Logf("%d trees; planted: %v", iterations, seen)
}
