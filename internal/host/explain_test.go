package host

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"firstmate.dev/fm/internal/binding"
)

// [INV-2] [BIND-6] the explanation of an entrypoint that could not be run
// reads its first line only from a regular file: a handshake can replace
// its entrypoint with a FIFO and exit 127 (root, or the owner after a
// chmod), and a process outside its group can hold that FIFO open without
// writing. Reading it would block fm for as long as that process likes, past
// every timeout; it must not be read at all.
func TestFirstLineSkipsAFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "firstmate-extension")
	if err := syscall.Mkfifo(p, 0o755); err != nil {
		t.Fatal(err)
	}
	// A writer that never writes (O_RDWR opens a FIFO without blocking).
	w, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan bool, 1)
	go func() {
		_, _, ok := firstLine(p)
		done <- ok
	}()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("firstLine read a FIFO")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("firstLine blocked on a FIFO held open by another process")
	}
}

// [INV-2] the first line is shown whole up to maxShebang bytes and marked
// "..." only when it is longer: a line of exactly maxShebang bytes is not
// cut. An empty entrypoint has an empty first line (so it has no #! line).
func TestFirstLineBound(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct {
		data, shown string
	}{
		"exactly the bound":       {"#!" + strings.Repeat("a", maxShebang-2) + "\nexit 0\n", `"#!` + strings.Repeat("a", maxShebang-2) + `"`},
		"bound without a newline": {"#!" + strings.Repeat("a", maxShebang-2), `"#!` + strings.Repeat("a", maxShebang-2) + `"`},
		"one byte over":           {"#!" + strings.Repeat("a", maxShebang-1) + "\n", `"#!` + strings.Repeat("a", maxShebang-2) + `"...`},
		"empty":                   {"", `""`},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(p, []byte(c.data), 0o755); err != nil {
				t.Fatal(err)
			}
			_, shown, ok := firstLine(p)
			if !ok || shown != c.shown {
				t.Fatalf("got %q (ok %v), want %q", shown, ok, c.shown)
			}
		})
	}
}

// [HINT-4] the static check names the shell idioms that find a script's
// files through $0, and only those: a script that uses $0 otherwise (its
// own path in a message, a chmod of itself) or a binary is not named.
func TestDollarZero(t *testing.T) {
	for text, want := range map[string]bool{
		"#!/bin/sh\n. \"$(dirname \"$0\")/lib.sh\"\n":          true,
		"#!/bin/sh\ncd `dirname $0`\n":                         true,
		"#!/bin/bash\nhere=$(dirname -- \"${0}\")\n":           true,
		"#!/bin/sh\nhere=${0%/*}\n":                            true,
		"#!/bin/sh\nhere=$(readlink -f \"$0\")\n":              true,
		"#!/bin/bash\nsource \"${BASH_SOURCE%/*}/lib.sh\"\n":   true,
		"#!/bin/sh\necho \"usage: $0 handshake|invoke\" >&2\n": false,
		"#!/bin/sh\nchmod u+w \"$0\"\n":                        false,
		"#!/bin/sh\n. lib/common.sh\n":                         false,
		"\x7fELF dirname \"$0\"":                               false, // not a script
	} {
		root := t.TempDir()
		if err := os.WriteFile(filepath.Join(root, "entry"), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
		rec := &binding.Record{PackageRoot: root, Entrypoint: "entry", ExtensionID: "org.example.x"}
		if got := dollarZero(rec); got != want {
			t.Errorf("dollarZero(%q) = %v, want %v", text, got, want)
		}
		if w := DollarZeroWarning(rec); (w != "") != want || want && !strings.Contains(w, "entrypoint entry of org.example.x: ") {
			t.Errorf("DollarZeroWarning(%q) = %q", text, w)
		}
	}
}
