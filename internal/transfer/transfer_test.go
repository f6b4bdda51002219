package transfer

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/pkgtree"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/retire"
	"firstmate.dev/fm/internal/strictjson"
)

func TestMain(m *testing.M) {
	launch.MaybeBarrier()
	if os.Getenv(envKillAfterStaged) != "" {
		os.Exit(receiveKilledAfterStaging())
	}
	os.Exit(m.Run())
}

// envKillAfterStaged makes the test binary a receive-transfer-bind of the
// envelope on stdin into the home named by FM_HOME and FM_ROOT_OVERRIDE,
// with exampleOptions, that SIGKILLs itself between staging its unit and
// binding it (the crash point of TestReceiveKilledAfterStaging).
const envKillAfterStaged = "FM_TEST_KILL_AFTER_STAGED"

func receiveKilledAfterStaging() int {
	afterStaged = func() {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	}
	h, err := home.Resolve()
	if err == nil {
		_, err = Receive(context.Background(), h, os.Stdin, exampleOptions)
	}
	fmt.Fprintln(os.Stderr, "receive was not killed:", err)
	return 3
}

// The example package of the project: org.firstmate.example.file-signal,
// adapter file-signal, required consent artifact-references.
const (
	exampleID      = "org.firstmate.example.file-signal"
	exampleVersion = "1.0.0"
)

var exampleOptions = host.BindOptions{
	Adapters:  []string{"file-signal"},
	Trust:     true,
	Consents:  []string{"artifact-references"},
	TimeoutMS: binding.DefaultTimeoutMS,
}

// tempDir is a canonical temp directory whose tree stays removable (the
// store's 0555 directories included) when the test is not root.
func tempDir(t testing.TB) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
	return d
}

// newHome is a fresh home with an empty code root.
func newHome(t testing.TB) *home.Home {
	t.Helper()
	base := tempDir(t)
	h := &home.Home{Root: filepath.Join(base, "root"), Dir: filepath.Join(base, "home")}
	h.State = filepath.Join(h.Dir, "state")
	mustMkdir(t, filepath.Join(h.Root, "bin"), 0o755)
	mustMkdir(t, h.Dir, 0o700)
	return h
}

func mustMkdir(t testing.TB, p string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// mustWrite writes p with mode, creating missing parents (existing ones keep
// their modes).
func mustWrite(t testing.TB, p string, data []byte, mode fs.FileMode) {
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

// examplePackage copies the project's example package, plus extra files, to
// a fresh directory outside every home and work tree.
func examplePackage(t testing.TB, extra map[string]string) string {
	t.Helper()
	src := filepath.Join("..", "..", "examples", "process-event-extension")
	dir := filepath.Join(tempDir(t), "pkg")
	for _, f := range []struct {
		rel  string
		mode fs.FileMode
	}{{"firstmate-extension.json", 0o644}, {"bin/firstmate-extension", 0o755}} {
		data, err := os.ReadFile(filepath.Join(src, f.rel))
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, filepath.Join(dir, f.rel), data, f.mode)
	}
	for rel, content := range extra {
		mustWrite(t, filepath.Join(dir, rel), []byte(content), 0o644)
	}
	return dir
}

// brokenPackage is a valid package whose handshake always fails.
func brokenPackage(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(tempDir(t), "broken")
	mustWrite(t, filepath.Join(dir, "firstmate-extension.json"), []byte(`{"schema":"firstmate.extension-manifest.v1","id":"org.example.broken","version":"2.0.0","host_protocols":[1],"entrypoint":"run","capabilities":[{"name":"process-event-adapter","versions":[1],"adapter_names":["broken"]}],"required_consents":[]}`), 0o644)
	mustWrite(t, filepath.Join(dir, "run"), []byte("#!/bin/sh\necho 'no handshake here' >&2\nexit 1\n"), 0o755)
	return dir
}

func pack(t testing.TB, dir string) []byte {
	t.Helper()
	data, err := Pack(dir, newHome(t).Dir)
	if err != nil {
		t.Fatalf("pack %s: %v", dir, err)
	}
	return data
}

func wantCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got success, want error[%s]", code)
	}
	if got := errcode.Of(err); got != code {
		t.Fatalf("got error[%s]: %v; want error[%s]", got, err, code)
	}
}

// TestPackEnvelope checks the canonical envelope of [XFER-1]: canonical JSON
// without a trailing newline, entries in bytewise full-path order (which
// differs from the tree digest's depth-first order here: "lib/a-c" sorts
// before "lib/a/b"), modes 493/420, padded base64 payloads in entry order
// with null for directories, and manifest_sha256 over the canonical manifest.
func TestPackEnvelope(t *testing.T) {
	dir := examplePackage(t, map[string]string{"lib/a/b": "bee\n", "lib/a-c": "sea\n"})
	data := pack(t, dir)
	if bytes.HasSuffix(data, []byte("\n")) {
		t.Error("envelope ends in a newline")
	}
	var env Envelope
	if err := strictjson.Decode(data, MaxEnvelope, "envelope", &env); err != nil {
		t.Fatal(err)
	}
	if canon, _ := strictjson.Canonical(&env); !bytes.Equal(canon, data) {
		t.Error("envelope is not canonical JSON")
	}
	m := env.Manifest
	var paths []string
	for _, e := range m.Entries {
		paths = append(paths, e.Path)
	}
	want := []string{"bin", "bin/firstmate-extension", "firstmate-extension.json", "lib", "lib/a", "lib/a-c", "lib/a/b"}
	if !slices.Equal(paths, want) {
		t.Fatalf("entry order %q, want %q", paths, want)
	}
	tree, err := pkgtree.Scan(dir, pkgtree.Source)
	if err != nil {
		t.Fatal(err)
	}
	if m.Schema != ManifestSchema || env.Schema != Schema || m.ExtensionID != exampleID || m.ExtensionVersion != exampleVersion ||
		m.PackageDigest != tree.Digest || m.EntryCount != 7 || m.TotalBytes != tree.Bytes {
		t.Errorf("manifest header %+v", m)
	}
	canonManifest, _ := strictjson.Canonical(&m)
	if env.ManifestSHA256 != binding.Digest(canonManifest) {
		t.Errorf("manifest_sha256 %s is not the SHA-256 of the canonical manifest", env.ManifestSHA256)
	}
	for i, e := range m.Entries {
		p := env.Payloads[i]
		switch e.Type {
		case TypeDirectory:
			if e.Mode != 493 || e.Size != 0 || e.SHA256 != nil || p != nil {
				t.Errorf("directory entry %+v payload %v", e, p)
			}
		case TypeFile:
			content, err := os.ReadFile(filepath.Join(dir, e.Path))
			if err != nil {
				t.Fatal(err)
			}
			mode := int64(420)
			if e.Path == "bin/firstmate-extension" {
				mode = 493
			}
			if e.Mode != mode || e.Size != int64(len(content)) || *e.SHA256 != binding.Digest(content) ||
				p == nil || *p != base64.StdEncoding.EncodeToString(content) {
				t.Errorf("file entry %+v does not describe %s", e, e.Path)
			}
		default:
			t.Errorf("entry type %q", e.Type)
		}
	}
	p, err := Open(data)
	if err != nil {
		t.Fatal(err)
	}
	if p.Digest != env.ManifestSHA256 {
		t.Errorf("transfer digest %s", p.Digest)
	}
}

// TestPackRefuses checks that packing applies the rules of bind and refuses
// what a receiver would refuse ([XFER-1], [XFER-2] limits).
func TestPackRefuses(t *testing.T) {
	big := examplePackage(t, map[string]string{"big": strings.Repeat("x", MaxFileBytes+1)})
	many := map[string]string{}
	for i := range MaxEntries - 2 { // 3 example entries + 126 = 129
		many[fmt.Sprintf("f%03d", i)] = "x"
	}
	manyPkg := examplePackage(t, many)
	linked := examplePackage(t, nil)
	if err := os.Symlink("firstmate-extension.json", filepath.Join(linked, "link")); err != nil {
		t.Fatal(err)
	}
	noManifest := examplePackage(t, nil)
	os.Remove(filepath.Join(noManifest, "firstmate-extension.json"))
	h := newHome(t)
	inHome := filepath.Join(h.Dir, "pkg")
	mustMkdir(t, inHome, 0o755)

	for _, c := range []struct {
		name, dir string
		code      errcode.Code
	}{
		{"file over 262,144 bytes", big, errcode.PackageOversized},
		{"129 entries", manyPkg, errcode.PackageOversized},
		{"symlink", linked, errcode.LinkUnsafe},
		{"no manifest", noManifest, errcode.ManifestMissing},
		{"inside the home", inHome, errcode.PathUnsafe},
		{"relative path", "pkg", errcode.PathUnsafe},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Pack(c.dir, h.Dir)
			wantCode(t, err, c.code)
		})
	}
	// Exactly at the bounds is accepted.
	exact := map[string]string{"big": strings.Repeat("y", MaxFileBytes)}
	for i := range MaxEntries - 4 { // 3 example entries + big + 124 = 128
		exact[fmt.Sprintf("f%03d", i)] = "x"
	}
	if _, err := Pack(examplePackage(t, exact), h.Dir); err != nil {
		t.Fatalf("a package exactly at the entry and file bounds: %v", err)
	}
}

// readBytes is this process's count of bytes read by read(2) and the like
// (rchar of /proc/self/io).
func readBytes(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no rchar in /proc/self/io")
	return 0
}

// TestPackBoundsBeforeReading checks that pack-transfer refuses a package
// over the receiver's limits ([XFER-2], [XFER-1]) from stat data, before
// reading its files: a 32 MiB file (within bind's own bound, so a scan would
// hash it all), or three files of 256 KiB, is refused having read less than
// 128 KiB.
func TestPackBoundsBeforeReading(t *testing.T) {
	h := newHome(t)
	for name, size := range map[string]int64{"one huge file": 32 << 20, "many files over the total": 0} {
		t.Run(name, func(t *testing.T) {
			dir := examplePackage(t, nil)
			if size > 0 {
				mustWrite(t, filepath.Join(dir, "huge"), nil, 0o644)
				if err := os.Truncate(filepath.Join(dir, "huge"), size); err != nil {
					t.Fatal(err)
				}
			} else {
				for i := range 3 { // 3 * 256 KiB > 512 KiB, each file within its bound
					mustWrite(t, filepath.Join(dir, fmt.Sprintf("part%d", i)), nil, 0o644)
					if err := os.Truncate(filepath.Join(dir, fmt.Sprintf("part%d", i)), MaxFileBytes); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := readBytes(t)
			_, err := Pack(dir, h.Dir)
			read := readBytes(t) - before
			wantCode(t, err, errcode.PackageOversized)
			if read > 128<<10 {
				t.Errorf("pack read %d bytes before refusing an oversized package", read)
			}
		})
	}
}

// mutation helpers: decode a valid envelope, change it, and reseal it
// (counts and manifest_sha256 recomputed) so that exactly the intended rule
// is what refuses it.

func decode(t *testing.T, data []byte) *Envelope {
	t.Helper()
	var env Envelope
	if err := strictjson.Decode(data, MaxEnvelope, "envelope", &env); err != nil {
		t.Fatal(err)
	}
	return &env
}

func seal(t *testing.T, env *Envelope) []byte {
	t.Helper()
	m := &env.Manifest
	m.EntryCount = int64(len(m.Entries))
	m.TotalBytes = 0
	for _, e := range m.Entries {
		m.TotalBytes += e.Size
	}
	d, err := Digest(m)
	if err != nil {
		t.Fatal(err)
	}
	env.ManifestSHA256 = d
	return encode(t, env)
}

func encode(t *testing.T, env *Envelope) []byte {
	t.Helper()
	data, err := strictjson.Canonical(env)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// add inserts an entry and its payload at its sorted position (after an
// equal path).
func add(env *Envelope, e Entry, payload *string) {
	m := &env.Manifest
	i := 0
	for i < len(m.Entries) && m.Entries[i].Path <= e.Path {
		i++
	}
	m.Entries = slices.Insert(m.Entries, i, e)
	env.Payloads = slices.Insert(env.Payloads, i, payload)
}

func addFile(env *Envelope, path string, content []byte) {
	sum := binding.Digest(content)
	b64 := base64.StdEncoding.EncodeToString(content)
	add(env, Entry{Path: path, Type: TypeFile, Mode: ModeFile, Size: int64(len(content)), SHA256: &sum}, &b64)
}

func index(env *Envelope, path string) int {
	return slices.IndexFunc(env.Manifest.Entries, func(e Entry) bool { return e.Path == path })
}

// assertNothingLeft checks that a refused receive left no binding, no store
// copy, no temp directory and no unit behind.
func assertNothingLeft(t *testing.T, h *home.Home) {
	t.Helper()
	bs, err := binding.Load(h)
	if err != nil || len(bs) != 0 {
		t.Errorf("registry after a refusal: %v %v", bs, err)
	}
	ents, err := os.ReadDir(h.Staging())
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind in staging: %s", e.Name())
	}
	for _, p := range []string{h.RetiredStaging(), h.Packages(), h.Bindings()} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a refusal", p)
		}
	}
}

// TestReceiveRefusals feeds every mutated envelope of [XFER-2] to the
// receiver: each is refused with its code and leaves no binding and no temp
// directory behind.
func TestReceiveRefusals(t *testing.T) {
	valid := pack(t, examplePackage(t, nil))
	entrypoint := "bin/firstmate-extension"
	cases := []struct {
		name   string
		mutate func(t *testing.T, env *Envelope) []byte
		code   errcode.Code
	}{
		{"../escape path", func(t *testing.T, env *Envelope) []byte {
			addFile(env, "../escape", []byte("x"))
			return seal(t, env)
		}, errcode.PathUnsafe},
		{"path longer than 1,024 bytes", func(t *testing.T, env *Envelope) []byte {
			addFile(env, strings.Repeat(strings.Repeat("d", 250)+"/", 5)+"f", []byte("x"))
			return seal(t, env)
		}, errcode.PathUnsafe},
		{"absolute path", func(t *testing.T, env *Envelope) []byte {
			addFile(env, "/etc/escape", []byte("x"))
			return seal(t, env)
		}, errcode.PathUnsafe},
		{"non-normalized path", func(t *testing.T, env *Envelope) []byte {
			addFile(env, "bin/./x", []byte("x"))
			return seal(t, env)
		}, errcode.PathUnsafe},
		{"control character in a path", func(t *testing.T, env *Envelope) []byte {
			addFile(env, "bin/x\ny", []byte("x"))
			return seal(t, env)
		}, errcode.PathUnsafe},
		// [PKG-2] a work tree in the envelope: bind and pack-transfer refuse
		// it, so the receiver does too, before it writes anything.
		{".git directory at the root", func(t *testing.T, env *Envelope) []byte {
			add(env, Entry{Path: ".git", Type: TypeDirectory, Mode: ModeDirectory}, nil)
			addFile(env, ".git/config", []byte("[core]\n\tfsmonitor = /bin/sh -c id\n"))
			return seal(t, env)
		}, errcode.PathUnsafe},
		{".git file in a subdirectory", func(t *testing.T, env *Envelope) []byte {
			addFile(env, "bin/.git", []byte("gitdir: /elsewhere\n"))
			return seal(t, env)
		}, errcode.PathUnsafe},
		{"group-writable file", func(t *testing.T, env *Envelope) []byte {
			env.Manifest.Entries[index(env, entrypoint)].Mode = 0o775
			return seal(t, env)
		}, errcode.ModeUnsafe},
		{"symlink type", func(t *testing.T, env *Envelope) []byte {
			add(env, Entry{Path: "link", Type: "symlink", Mode: ModeFile}, nil)
			return seal(t, env)
		}, errcode.LinkUnsafe},
		{"special type", func(t *testing.T, env *Envelope) []byte {
			add(env, Entry{Path: "fifo", Type: "fifo", Mode: ModeFile}, nil)
			return seal(t, env)
		}, errcode.PackageInvalid},
		{"stale payload hash", func(t *testing.T, env *Envelope) []byte {
			i := index(env, entrypoint)
			content, _ := base64.StdEncoding.DecodeString(*env.Payloads[i])
			content[len(content)-2] ^= 1
			b64 := base64.StdEncoding.EncodeToString(content)
			env.Payloads[i] = &b64
			return seal(t, env)
		}, errcode.IntegrityMismatch},
		{"payload size differs", func(t *testing.T, env *Envelope) []byte {
			env.Manifest.Entries[index(env, entrypoint)].Size++
			return seal(t, env)
		}, errcode.IntegrityMismatch},
		{"262,145-byte file", func(t *testing.T, env *Envelope) []byte {
			addFile(env, "big", bytes.Repeat([]byte("z"), MaxFileBytes+1))
			return seal(t, env)
		}, errcode.PackageOversized},
		{"duplicate path", func(t *testing.T, env *Envelope) []byte {
			addFile(env, "firstmate-extension.json", []byte("{}"))
			return seal(t, env)
		}, errcode.PackageInvalid},
		{"missing directory entry", func(t *testing.T, env *Envelope) []byte {
			i := index(env, "bin")
			env.Manifest.Entries = slices.Delete(env.Manifest.Entries, i, i+1)
			env.Payloads = slices.Delete(env.Payloads, i, i+1)
			return seal(t, env)
		}, errcode.PackageInvalid},
		{"file/dir collision", func(t *testing.T, env *Envelope) []byte {
			addFile(env, entrypoint+"/inner", []byte("x"))
			return seal(t, env)
		}, errcode.PackageInvalid},
		{"{broken", func(t *testing.T, env *Envelope) []byte { return []byte("{broken") }, errcode.JSONInvalid},
		{"truncated", func(t *testing.T, env *Envelope) []byte { return valid[:len(valid)/2] }, errcode.JSONInvalid},
		{"empty", func(t *testing.T, env *Envelope) []byte { return nil }, errcode.JSONInvalid},
		{"duplicate key", func(t *testing.T, env *Envelope) []byte {
			return append([]byte(`{"schema":"x",`), valid[1:]...)
		}, errcode.JSONInvalid},
		{"unknown field", func(t *testing.T, env *Envelope) []byte {
			return append([]byte(`{"destination":"/tmp",`), valid[1:]...)
		}, errcode.SchemaInvalid},
		{"129 entries", func(t *testing.T, env *Envelope) []byte {
			for i := range MaxEntries - 2 {
				addFile(env, fmt.Sprintf("f%03d", i), []byte("x"))
			}
			return seal(t, env)
		}, errcode.PackageOversized},
		{"513 KiB", func(t *testing.T, env *Envelope) []byte {
			rest := 513*1024 - env.Manifest.TotalBytes - MaxFileBytes
			addFile(env, "big1", bytes.Repeat([]byte("a"), MaxFileBytes))
			addFile(env, "big2", bytes.Repeat([]byte("b"), int(rest)))
			return seal(t, env)
		}, errcode.PackageOversized},
		{"over 900,000 serialized bytes", func(t *testing.T, env *Envelope) []byte {
			return append(slices.Clone(valid), bytes.Repeat([]byte(" "), MaxEnvelope+1-len(valid))...)
		}, errcode.JSONOversized},
		{"non-canonical base64 (embedded newline)", func(t *testing.T, env *Envelope) []byte {
			i := index(env, "firstmate-extension.json")
			p := *env.Payloads[i]
			p = p[:8] + "\n" + p[8:]
			env.Payloads[i] = &p
			return seal(t, env)
		}, errcode.SchemaInvalid},
		{"non-canonical base64 (padding bits)", func(t *testing.T, env *Envelope) []byte {
			sum := binding.Digest([]byte("a"))
			p := "YR==" // canonical is "YQ=="
			add(env, Entry{Path: "one", Type: TypeFile, Mode: ModeFile, Size: 1, SHA256: &sum}, &p)
			return seal(t, env)
		}, errcode.SchemaInvalid},
		{"unpadded base64", func(t *testing.T, env *Envelope) []byte {
			sum := binding.Digest([]byte("a"))
			p := "YQ"
			add(env, Entry{Path: "one", Type: TypeFile, Mode: ModeFile, Size: 1, SHA256: &sum}, &p)
			return seal(t, env)
		}, errcode.SchemaInvalid},
		{"directory with a payload", func(t *testing.T, env *Envelope) []byte {
			p := ""
			env.Payloads[index(env, "bin")] = &p
			return seal(t, env)
		}, errcode.SchemaInvalid},
		{"wrong manifest_sha256", func(t *testing.T, env *Envelope) []byte {
			env.ManifestSHA256 = binding.Digest([]byte("another manifest"))
			return encode(t, env)
		}, errcode.IntegrityMismatch},
		{"wrong entry_count", func(t *testing.T, env *Envelope) []byte {
			seal(t, env)
			env.Manifest.EntryCount++
			d, _ := Digest(&env.Manifest)
			env.ManifestSHA256 = d
			return encode(t, env)
		}, errcode.IntegrityMismatch},
		{"wrong total_bytes", func(t *testing.T, env *Envelope) []byte {
			seal(t, env)
			env.Manifest.TotalBytes--
			d, _ := Digest(&env.Manifest)
			env.ManifestSHA256 = d
			return encode(t, env)
		}, errcode.IntegrityMismatch},
		{"payload count differs", func(t *testing.T, env *Envelope) []byte {
			env.Payloads = env.Payloads[:len(env.Payloads)-1]
			return seal(t, env)
		}, errcode.IntegrityMismatch},
		{"unsorted entries", func(t *testing.T, env *Envelope) []byte {
			m := env.Manifest.Entries
			i, j := index(env, entrypoint), index(env, "firstmate-extension.json")
			m[i], m[j] = m[j], m[i]
			env.Payloads[i], env.Payloads[j] = env.Payloads[j], env.Payloads[i]
			return seal(t, env)
		}, errcode.SchemaInvalid},
		{"directory mode 0777", func(t *testing.T, env *Envelope) []byte {
			env.Manifest.Entries[index(env, "bin")].Mode = 0o777
			return seal(t, env)
		}, errcode.ModeUnsafe},
		{"file mode 0666", func(t *testing.T, env *Envelope) []byte {
			env.Manifest.Entries[index(env, "firstmate-extension.json")].Mode = 0o666
			return seal(t, env)
		}, errcode.ModeUnsafe},
		{"entrypoint not executable", func(t *testing.T, env *Envelope) []byte {
			env.Manifest.Entries[index(env, entrypoint)].Mode = ModeFile
			return seal(t, env)
		}, errcode.EntrypointInvalid},
		{"identity differs from the package manifest", func(t *testing.T, env *Envelope) []byte {
			env.Manifest.ExtensionVersion = "9.9.9"
			return seal(t, env)
		}, errcode.IntegrityMismatch},
		{"not canonical (trailing newline)", func(t *testing.T, env *Envelope) []byte {
			return append(slices.Clone(valid), '\n')
		}, errcode.JSONInvalid},
		{"package_digest of another tree (refused after the rebuild)", func(t *testing.T, env *Envelope) []byte {
			env.Manifest.PackageDigest = binding.Digest([]byte("another tree"))
			return seal(t, env)
		}, errcode.IntegrityMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := c.mutate(t, decode(t, valid))
			h := newHome(t)
			_, err := Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
			wantCode(t, err, c.code)
			assertNothingLeft(t, h)
		})
	}
}

// TestReceiveIntegrityNamesTheTransfer checks the message of a rebuilt
// package that does not match its manifest ([XFER-2], [XFER-3], [CLI-3]):
// the temp directory it was built in is already removed, so the error names
// the transfer digest and the unit path the transfer would have had, never
// staging/.receiving-*.
func TestReceiveIntegrityNamesTheTransfer(t *testing.T) {
	env := decode(t, pack(t, examplePackage(t, nil)))
	env.Manifest.PackageDigest = binding.Digest([]byte("another tree"))
	data := seal(t, env)
	p, err := Open(data)
	if err != nil {
		t.Fatal(err)
	}
	h := newHome(t)
	_, err = Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
	wantCode(t, err, errcode.IntegrityMismatch)
	msg := err.Error()
	if strings.Contains(msg, tmpPrefix) {
		t.Errorf("the error names the removed temp directory: %s", msg)
	}
	unit := filepath.Join(h.Staging(), exampleID, exampleVersion, binding.Hex(p.Digest))
	if !strings.Contains(msg, p.Digest) || !strings.Contains(msg, unit) {
		t.Errorf("the error %q does not name transfer %s and unit %s", msg, p.Digest, unit)
	}
	assertNothingLeft(t, h)
}

// TestReceiveRefusesBadOptionsBeforeStaging checks that a receive whose bind
// options could never bind stages nothing, so the transfer identity is not
// consumed and a corrected call succeeds ([XFER-3], [BIND-1], [BIND-2]).
func TestReceiveRefusesBadOptionsBeforeStaging(t *testing.T) {
	data := pack(t, examplePackage(t, nil))
	h := newHome(t)
	noConsent := exampleOptions
	noConsent.Consents = nil
	noTrust := exampleOptions
	noTrust.Trust = false
	undeclared := exampleOptions
	undeclared.Adapters = []string{"other"}
	for _, c := range []struct {
		opts host.BindOptions
		code errcode.Code
	}{
		{noConsent, errcode.ConsentMissing},
		{noTrust, errcode.ConsentMissing},
		{undeclared, errcode.CapabilityMismatch},
	} {
		_, err := Receive(context.Background(), h, bytes.NewReader(data), c.opts)
		wantCode(t, err, c.code)
		assertNothingLeft(t, h)
	}
	if _, err := Receive(context.Background(), h, bytes.NewReader(data), exampleOptions); err != nil {
		t.Fatalf("the corrected receive: %v", err)
	}
}

// receive binds the example package, plus a directory and an empty file,
// into a fresh home by transfer.
func receive(t *testing.T) (*home.Home, *Received) {
	t.Helper()
	h := newHome(t)
	r, err := Receive(context.Background(), h, bytes.NewReader(pack(t, examplePackage(t, map[string]string{"share/empty": ""}))), exampleOptions)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return h, r
}

func perm(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// TestReceiveStagesAndBinds checks a successful receive ([XFER-3],
// [HOME-4]): the unit at staging/<id>/<version>/<transfer-hex> (0700) holds
// the rebuilt package/ and the pretty receipt.json (0600); the binding's
// source is the staged package/ and its package_root the home's store.
func TestReceiveStagesAndBinds(t *testing.T) {
	h, r := receive(t)
	unit := filepath.Join(h.Staging(), exampleID, exampleVersion, binding.Hex(r.TransferDigest))
	if r.Unit != unit {
		t.Fatalf("unit %s, want %s", r.Unit, unit)
	}
	if m := perm(t, unit); m != fs.ModeDir|0o700 {
		t.Errorf("unit mode %v", m)
	}
	if m := perm(t, filepath.Join(unit, ReceiptFile)); m != 0o600 {
		t.Errorf("receipt mode %v", m)
	}
	if m := perm(t, filepath.Join(unit, PackageDir, "bin", "firstmate-extension")); m != 0o755 {
		t.Errorf("staged entrypoint mode %v", m)
	}
	if m := perm(t, filepath.Join(unit, PackageDir, "firstmate-extension.json")); m != 0o644 {
		t.Errorf("staged manifest mode %v", m)
	}
	if m := perm(t, filepath.Join(unit, PackageDir, "share")); m != fs.ModeDir|0o755 {
		t.Errorf("staged directory mode %v", m)
	}
	if data, err := os.ReadFile(filepath.Join(unit, PackageDir, "share", "empty")); err != nil || len(data) != 0 {
		t.Errorf("staged empty file: %q %v", data, err)
	}
	receipt, err := os.ReadFile(filepath.Join(unit, ReceiptFile))
	if err != nil {
		t.Fatal(err)
	}
	var rc Receipt
	if err := strictjson.Decode(receipt, maxReceipt, "receipt", &rc); err != nil {
		t.Fatal(err)
	}
	if pretty, _ := strictjson.Pretty(&rc); !bytes.Equal(pretty, receipt) {
		t.Error("receipt is not pretty JSON")
	}
	if rc.Schema != ReceiptSchema || rc.TransferDigest != r.TransferDigest || rc.ExtensionID != exampleID ||
		rc.ExtensionVersion != exampleVersion || rc.PackageDigest != r.Binding.PackageDigest {
		t.Errorf("receipt %+v", rc)
	}
	b := r.Binding
	if b.Source.Path != filepath.Join(unit, PackageDir) {
		t.Errorf("binding source %s", b.Source.Path)
	}
	if b.PackageRoot != h.PackageRoot(exampleID, exampleVersion, binding.Hex(b.PackageDigest)) {
		t.Errorf("package_root %s", b.PackageRoot)
	}
	bs, err := binding.Load(h)
	if err != nil || len(bs) != 1 || bs[0].Digest != b.Digest {
		t.Fatalf("registry %v %v", bs, err)
	}
	ents, _ := os.ReadDir(h.Staging())
	if len(ents) != 1 || ents[0].Name() != exampleID {
		t.Errorf("staging holds %v", ents)
	}
}

// TestStagedLocation checks the one exception to [PKG-2]: a bind with
// Staged accepts a canonical directory inside the home's staging area and
// nothing else ([XFER-3]).
func TestStagedLocation(t *testing.T) {
	h := newHome(t)
	outside := examplePackage(t, nil)
	inHome := filepath.Join(h.Dir, "pkg")
	mustMkdir(t, inHome, 0o755)
	mustMkdir(t, h.Staging(), 0o700)
	link := filepath.Join(h.Staging(), "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{outside, inHome, h.Staging(), link} {
		opts := exampleOptions
		opts.Dir, opts.Staged = dir, true
		_, err := host.Bind(context.Background(), h, opts)
		wantCode(t, err, errcode.PathUnsafe)
	}
}

// TestReceiveDuplicate checks that a transfer identity is received once
// ([XFER-2]): again while staged, and again once retired, is transfer-exists.
// While its binding is still enabled the duplicate identity is what is
// reported (transfer-exists, not the registry's binding-exists): the
// identity check comes first.
func TestReceiveDuplicate(t *testing.T) {
	data := pack(t, examplePackage(t, nil))
	h := newHome(t)
	r, err := Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
	wantCode(t, err, errcode.TransferExists)
	if !strings.Contains(err.Error(), r.TransferDigest) || !strings.Contains(err.Error(), r.Unit) {
		t.Errorf("duplicate refusal %q does not name the transfer and its unit", err)
	}
	if _, err := Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest); err != nil {
		t.Fatal(err)
	}
	_, err = Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
	wantCode(t, err, errcode.TransferExists)
	if bs, _ := binding.Load(h); len(bs) != 0 {
		t.Errorf("a refused duplicate bound %v", bs)
	}

	// Staged but not bound (its binding moved away by hand): the state of a
	// receive killed before its bind, so a resend completes the bind with
	// the staged unit; once bound, a resend is transfer-exists again.
	h2 := newHome(t)
	r2, err := Receive(context.Background(), h2, bytes.NewReader(data), exampleOptions)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(r2.Binding.Path, filepath.Join(tempDir(t), "moved.json")); err != nil {
		t.Fatal(err)
	}
	r3, err := Receive(context.Background(), h2, bytes.NewReader(data), exampleOptions)
	if err != nil {
		t.Fatalf("resend of a staged, unbound transfer: %v", err)
	}
	if r3.Unit != r2.Unit || r3.Binding.Source.Path != filepath.Join(r2.Unit, PackageDir) || r3.TransferDigest != r2.TransferDigest {
		t.Errorf("resumed receive: unit %s, source %s; want %s", r3.Unit, r3.Binding.Source.Path, r2.Unit)
	}
	_, err = Receive(context.Background(), h2, bytes.NewReader(data), exampleOptions)
	wantCode(t, err, errcode.TransferExists)
}

// TestReceiveSweepsAbandonedTempDirs checks that the temp directory of a
// receive that died is removed by the next receive.
func TestReceiveSweepsAbandonedTempDirs(t *testing.T) {
	h := newHome(t)
	dead := filepath.Join(h.Staging(), tmpPrefix+"123")
	mustWrite(t, filepath.Join(dead, PackageDir, "x"), []byte("x"), 0o644)
	if _, err := Receive(context.Background(), h, bytes.NewReader(pack(t, examplePackage(t, nil))), exampleOptions); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dead); !os.IsNotExist(err) {
		t.Errorf("abandoned %s is still there", dead)
	}
}

// TestReceiveFailedBindRetires checks that a transfer whose bind fails (here
// its handshake) is moved to retired-staging without being enabled, and that
// its identity stays consumed ([XFER-3], [XFER-2]).
func TestReceiveFailedBindRetires(t *testing.T) {
	data := pack(t, brokenPackage(t))
	p, err := Open(data)
	if err != nil {
		t.Fatal(err)
	}
	h := newHome(t)
	opts := host.BindOptions{Adapters: []string{"broken"}, Trust: true}
	_, err = Receive(context.Background(), h, bytes.NewReader(data), opts)
	if err == nil || !strings.Contains(err.Error(), "retired to "+h.RetiredStaging()) {
		t.Fatalf("failed bind: %v", err)
	}
	if bs, _ := binding.Load(h); len(bs) != 0 {
		t.Errorf("a failed bind enabled %v", bs)
	}
	retired := filepath.Join(h.RetiredStaging(), "org.example.broken", "2.0.0", binding.Hex(p.Digest))
	for _, name := range []string{ReceiptFile, PackageDir} {
		if _, err := os.Lstat(filepath.Join(retired, name)); err != nil {
			t.Errorf("retired unit: %v", err)
		}
	}
	if _, err := os.Lstat(filepath.Join(h.Staging(), "org.example.broken", "2.0.0", binding.Hex(p.Digest))); !os.IsNotExist(err) {
		t.Errorf("failed unit still staged")
	}
	_, err = Receive(context.Background(), h, bytes.NewReader(data), opts)
	wantCode(t, err, errcode.TransferExists)
}

// TestRetireTransfer checks the two-move retirement of [XFER-6]: the binding
// is moved into the unit, the unit into retired-staging, both restorable;
// and a transferred binding is not retire-binding's to retire ([LIFE-2]).
func TestRetireTransfer(t *testing.T) {
	h, r := receive(t)
	_, err := retire.Binding(context.Background(), h, exampleID, r.Binding.Digest)
	if err == nil || !strings.Contains(err.Error(), "retire-transfer") {
		t.Fatalf("retire-binding of a transferred binding: %v", err)
	}
	res, err := Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(h.RetiredStaging(), exampleID, exampleVersion, binding.Hex(r.TransferDigest))
	if res.At != want || res.Version != exampleVersion {
		t.Fatalf("retired %+v, want at %s", res, want)
	}
	if bs, _ := binding.Load(h); len(bs) != 0 {
		t.Errorf("still enabled: %v", bs)
	}
	if _, err := os.Lstat(r.Unit); !os.IsNotExist(err) {
		t.Error("unit still staged")
	}
	kept, err := os.ReadFile(filepath.Join(want, BindingFile))
	if err != nil || binding.Digest(kept) != r.Binding.Digest {
		t.Fatalf("retained binding: %v", err)
	}
	if _, err := os.Lstat(r.Binding.PackageRoot); err != nil {
		t.Errorf("installed package removed: %v", err)
	}
	_, err = Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest)
	wantCode(t, err, errcode.TransferMissing)

	// Moving both back restores the binding.
	if err := os.Rename(want, r.Unit); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(r.Unit, BindingFile), r.Binding.Path); err != nil {
		t.Fatal(err)
	}
	if _, err := host.Verify(context.Background(), h, exampleID); err != nil {
		t.Fatalf("restored binding: %v", err)
	}
}

// TestRetireTransferPreflight checks that a dependency (here a source
// registered with the binding) refuses before anything moves ([LIFE-2]).
func TestRetireTransferPreflight(t *testing.T) {
	h, r := receive(t)
	if _, err := procevent.RegisterExtension(context.Background(), h, "file-signal", "s1", "ref"); err != nil {
		t.Fatal(err)
	}
	_, err := Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest)
	wantCode(t, err, errcode.BindingInUse)
	if bs, _ := binding.Load(h); len(bs) != 1 {
		t.Error("binding moved despite the preflight")
	}
}

// TestRetireTransferTampered checks that each drifted, mismatched or partial
// state is refused and moves nothing, and that the exact interrupted state
// (binding moved into the unit, unit not yet moved) resumes ([XFER-6]).
func TestRetireTransferTampered(t *testing.T) {
	moveBinding := func(t *testing.T, r *Received) string {
		kept := filepath.Join(r.Unit, BindingFile)
		if err := os.Rename(r.Binding.Path, kept); err != nil {
			t.Fatal(err)
		}
		return kept
	}
	cases := []struct {
		name   string
		tamper func(t *testing.T, h *home.Home, r *Received) (tdigest, bdigest string)
		code   errcode.Code
	}{
		{"edited receipt", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			p := filepath.Join(r.Unit, ReceiptFile)
			data, _ := os.ReadFile(p)
			mustWrite(t, p, bytes.Replace(data, []byte(`"extension_version": "1.0.0"`), []byte(`"extension_version": "1.0.1"`), 1), 0o600)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.IntegrityMismatch},
		{"reformatted receipt", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			p := filepath.Join(r.Unit, ReceiptFile)
			data, _ := os.ReadFile(p)
			mustWrite(t, p, append(data, '\n'), 0o600)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.IntegrityMismatch},
		{"drifted staged bytes", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			p := filepath.Join(r.Unit, PackageDir, "bin", "firstmate-extension")
			data, _ := os.ReadFile(p)
			data[len(data)-2] ^= 1
			mustWrite(t, p, data, 0o755)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.IntegrityMismatch},
		{"extra staged file", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			mustWrite(t, filepath.Join(r.Unit, PackageDir, "extra"), []byte("x"), 0o644)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.IntegrityMismatch},
		{"renamed version dir", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			v := filepath.Dir(r.Unit)
			if err := os.Rename(v, filepath.Join(filepath.Dir(v), "1.0.1")); err != nil {
				t.Fatal(err)
			}
			return r.TransferDigest, r.Binding.Digest
		}, errcode.IntegrityMismatch},
		{"binding both enabled and moved", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			data, _ := os.ReadFile(r.Binding.Path)
			mustWrite(t, filepath.Join(r.Unit, BindingFile), data, 0o600)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.RetirementPartial},
		{"moved binding with one byte changed", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			kept := moveBinding(t, r)
			data, _ := os.ReadFile(kept)
			mustWrite(t, kept, bytes.Replace(data, []byte(": 300000"), []byte(": 300009"), 1), 0o600)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.RetirementPartial},
		{"unit both staged and retired", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			mustMkdir(t, filepath.Join(h.RetiredStaging(), exampleID, exampleVersion, binding.Hex(r.TransferDigest)), 0o700)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.RetirementPartial},
		{"unit staged twice", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			mustMkdir(t, filepath.Join(h.Staging(), exampleID, "0.9.0", binding.Hex(r.TransferDigest)), 0o700)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.IntegrityMismatch},
		{"stale binding digest", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			return r.TransferDigest, binding.Digest([]byte("older binding"))
		}, errcode.OwnerMismatch},
		{"unknown transfer digest", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			return binding.Digest([]byte("another transfer")), r.Binding.Digest
		}, errcode.TransferMissing},
		{"binding of another source", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			data, _ := os.ReadFile(r.Binding.Path)
			data = bytes.Replace(data, []byte(r.Unit), []byte(filepath.Join(h.Staging(), "elsewhere")), 1)
			mustWrite(t, r.Binding.Path, data, 0o600)
			return r.TransferDigest, binding.Digest(data)
		}, errcode.IntegrityMismatch},
		{"installed package drifted", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			p := filepath.Join(r.Binding.PackageRoot, "firstmate-extension.json")
			os.Chmod(r.Binding.PackageRoot, 0o755)
			os.Chmod(p, 0o644)
			data, _ := os.ReadFile(p)
			mustWrite(t, p, append(data, ' '), 0o444)
			os.Chmod(r.Binding.PackageRoot, 0o555)
			return r.TransferDigest, r.Binding.Digest
		}, errcode.IntegrityMismatch},
		{"nothing enabled or retained", func(t *testing.T, h *home.Home, r *Received) (string, string) {
			if err := os.Rename(r.Binding.Path, filepath.Join(tempDir(t), "gone.json")); err != nil {
				t.Fatal(err)
			}
			return r.TransferDigest, r.Binding.Digest
		}, errcode.BindingMissing},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, r := receive(t)
			td, bd := c.tamper(t, h, r)
			before := snapshot(t, h)
			_, err := Retire(context.Background(), h, exampleID, td, bd)
			wantCode(t, err, c.code)
			if after := snapshot(t, h); !slices.Equal(before, after) {
				t.Errorf("a refused retire changed the home:\nbefore %q\nafter  %q", before, after)
			}
		})
	}

	t.Run("interrupted between the two moves resumes", func(t *testing.T) {
		h, r := receive(t)
		moveBinding(t, r)
		res, err := Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest)
		if err != nil {
			t.Fatalf("resume: %v", err)
		}
		kept, err := os.ReadFile(filepath.Join(res.At, BindingFile))
		if err != nil || binding.Digest(kept) != r.Binding.Digest {
			t.Fatalf("retained binding after resume: %v", err)
		}
		if _, err := os.Lstat(r.Unit); !os.IsNotExist(err) {
			t.Error("unit still staged after resume")
		}
	})
}

// snapshot lists every path under the home's data/ and config/ trees.
func snapshot(t *testing.T, h *home.Home) []string {
	t.Helper()
	var out []string
	for _, top := range []string{"data", "config"} {
		filepath.WalkDir(filepath.Join(h.Dir, top), func(p string, e fs.DirEntry, err error) error {
			if err == nil && !strings.HasSuffix(p, "lifecycle.lock") {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// FuzzOpen feeds arbitrary bytes to the receiver's validation ([XFER-2]): it
// never panics, and whatever it accepts is within the limits, hashes to its
// transfer digest and is the one canonical encoding of itself.
func FuzzOpen(f *testing.F) {
	valid := pack(f, brokenPackage(f)) // small, so the fuzzer can minimize
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add([]byte("{broken"))
	f.Add(bytes.Replace(valid, []byte(`"mode":420`), []byte(`"mode":511`), 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Open(data)
		if err != nil {
			return
		}
		m := &p.Manifest
		if len(m.Entries) > MaxEntries || m.TotalBytes > MaxPackageBytes {
			t.Fatalf("accepted beyond the limits: %d entries, %d bytes", len(m.Entries), m.TotalBytes)
		}
		if d, err := Digest(m); err != nil || d != p.Digest {
			t.Fatalf("accepted manifest hashes to %s, not %s", d, p.Digest)
		}
		for i, e := range m.Entries {
			if err := checkPath(e.Path); err != nil || (e.Type == TypeFile) != (p.Data[i] != nil) {
				t.Fatalf("accepted entry %+v", e)
			}
		}
	})
}

// [XFER-3] [XFER-2] a receive SIGKILLed after publishing its staged unit and
// before publishing its binding leaves a unit that nothing binds. A resend of
// the same envelope revalidates that unit and completes the bind with it
// (the binding's source.path is the unit's package/); a unit that no longer
// is exactly what the envelope builds (a receipt edited, a staged file
// changed, an entry added) is refused with the reason and left alone, and
// nothing is bound.
func TestReceiveKilledAfterStaging(t *testing.T) {
	data := pack(t, examplePackage(t, nil))
	p, err := Open(data)
	if err != nil {
		t.Fatal(err)
	}
	killed := func(t *testing.T) *home.Home {
		h := newHome(t)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), envKillAfterStaged+"=1", "FM_HOME="+h.Dir, "FM_ROOT_OVERRIDE="+h.Root)
		cmd.Stdin = bytes.NewReader(data)
		out, err := cmd.CombinedOutput()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("the receive was not killed at the crash point: %v\n%s", err, out)
		}
		if bs, err := binding.Load(h); err != nil || len(bs) != 0 {
			t.Fatalf("after the kill: bindings %v, %v", bs, err)
		}
		if _, err := os.Lstat(filepath.Join(unitPath(h.Staging(), &p.Manifest, p.Digest), ReceiptFile)); err != nil {
			t.Fatalf("after the kill the unit is not staged: %v", err)
		}
		return h
	}
	h := killed(t)
	unit := unitPath(h.Staging(), &p.Manifest, p.Digest)
	r, err := Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
	if err != nil {
		t.Fatalf("the resend did not complete the killed receive: %v", err)
	}
	if r.Unit != unit || r.Binding.Source.Path != filepath.Join(unit, PackageDir) {
		t.Fatalf("resumed into %s (source %s), want %s", r.Unit, r.Binding.Source.Path, unit)
	}
	_, err = Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
	wantCode(t, err, errcode.TransferExists)
	if _, err := Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest); err != nil {
		t.Fatalf("retire-transfer of the resumed transfer: %v", err)
	}

	for _, c := range []struct {
		name   string
		tamper func(unit string)
		code   errcode.Code
	}{
		{"receipt edited", func(unit string) {
			f := filepath.Join(unit, ReceiptFile)
			b, _ := os.ReadFile(f)
			os.WriteFile(f, bytes.Replace(b, []byte(exampleVersion), []byte(exampleVersion+" "), 1), 0o600)
		}, errcode.IntegrityMismatch},
		{"staged file changed", func(unit string) {
			f := filepath.Join(unit, PackageDir, "firstmate-extension.json")
			os.Chmod(f, 0o644)
			b, _ := os.ReadFile(f)
			os.WriteFile(f, append(b, ' '), 0o644)
		}, errcode.IntegrityMismatch},
		{"entry added", func(unit string) {
			os.WriteFile(filepath.Join(unit, PackageDir, "extra"), []byte("x"), 0o644)
		}, errcode.IntegrityMismatch},
		{".git added", func(unit string) {
			os.Mkdir(filepath.Join(unit, PackageDir, ".git"), 0o755)
		}, errcode.PathUnsafe},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := killed(t)
			unit := unitPath(h.Staging(), &p.Manifest, p.Digest)
			c.tamper(unit)
			_, err := Receive(context.Background(), h, bytes.NewReader(data), exampleOptions)
			wantCode(t, err, c.code)
			if !strings.Contains(err.Error(), unit) {
				t.Errorf("refusal %q does not name the unit", err)
			}
			if bs, _ := binding.Load(h); len(bs) != 0 {
				t.Errorf("a tampered unit was bound: %v", bs)
			}
			if _, err := os.Lstat(unit); err != nil {
				t.Errorf("the refused unit was not left in place: %v", err)
			}
		})
	}
}
