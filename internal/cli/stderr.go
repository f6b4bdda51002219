package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// showStderr is the --show-stderr of a direct call ([OP-2]): it prints the
// package's stderr of each invocation (handshake, invoke) on fm's stderr,
// once that invocation's group is gone. Each line of it is shown as
// `stderr[<verb>]: <line>`, escaped by escapeLine, so the package cannot
// write a line that looks like fm's own or drive the terminal; at most
// wire.MaxStderrBytes bytes are shown, followed, when the package wrote more,
// by `stderr[<verb>] cut: <n> bytes written, the first <m> shown`. Nothing
// of it is stored, logged or put into evidence: it goes only to the
// operator who asked for it, on this one call [INV-4].
func showStderr(w io.Writer) host.StderrFunc {
	var mu sync.Mutex
	return func(verb string, kept []byte, total int64) {
		mu.Lock()
		defer mu.Unlock()
		text := string(kept)
		if text == "" {
			return
		}
		for _, line := range strings.SplitAfter(text, "\n") {
			if line == "" {
				continue
			}
			fmt.Fprintf(w, "stderr[%s]: %s\n", verb, escapeLine(strings.TrimSuffix(line, "\n")))
		}
		if total > int64(len(kept)) {
			fmt.Fprintf(w, "stderr[%s] cut: %d bytes written, the first %d shown\n", verb, total, len(kept))
		}
	}
}

// showDiagnostic is the other half of a direct call's --show-stderr: the
// diagnostic of an ok=false answer, which the host otherwise drops, shown
// once as `diagnostic[<code>]: <text>` (` (retryable)` after the code when
// the package said so), escaped as stderr is. Like stderr it goes only to
// the operator who asked, on this one call.
func showDiagnostic(w io.Writer) host.DiagnosticFunc {
	return func(code wire.Code, retryable bool, diagnostic string) {
		retry := ""
		if retryable {
			retry = " (retryable)"
		}
		fmt.Fprintf(w, "diagnostic[%s]%s: %s\n", code, retry, escapeLine(diagnostic))
	}
}

// escapeLine makes one line of package text safe to print: a tab is \t, a
// carriage return \r, a byte that is not UTF-8 \xNN, and every other rune
// that is not printable (C0 and C1 controls, DEL, format characters such as
// bidirectional overrides) \u{NNNN}; a backslash is doubled, so an escape
// in the output always means the package wrote that byte or rune.
func escapeLine(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			fmt.Fprintf(&b, `\u{%04x}`, r)
		}
		i += size
	}
	return b.String()
}
