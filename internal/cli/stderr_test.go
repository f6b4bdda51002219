package cli

import (
	"bytes"
	"testing"
)

// [INV-4] [OP-2]: what --show-stderr prints of a package's stderr cannot
// drive the terminal or pass for fm's own lines: every line is prefixed,
// and control bytes, C1 controls, format characters (bidirectional
// overrides), invalid UTF-8 and backslashes are escaped.
func TestShowStderrEscapes(t *testing.T) {
	var out bytes.Buffer
	show := showStderr(&out)
	show("handshake", []byte("ok é\n\x1b]0;title\x07\r\n\xff\u0085\u202e\\x41\nerror[usage]: fake"), 80)
	show("invoke", nil, 0)
	want := "stderr[handshake]: ok é\n" +
		"stderr[handshake]: \\u{001b}]0;title\\u{0007}\\r\n" +
		"stderr[handshake]: \\xff\\u{0085}\\u{202e}\\\\x41\n" +
		"stderr[handshake]: error[usage]: fake\n" +
		"stderr[handshake] cut: 80 bytes written, the first 47 shown\n"
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}
