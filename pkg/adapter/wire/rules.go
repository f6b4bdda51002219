package wire

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"
)

// The token, id and adapter-name forms, each compiled on first use rather
// than at start-up, where they cost every fm process (launch barriers
// included) about 0.07 ms before main. The request id and source id are
// checked by hand (ValidRequestID, ValidSourceID): their bounded repetitions
// make regular expressions that cost fm about 0.2 ms to compile.
var (
	tokenRe   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*$`) })
	idRe      = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]+([.-][a-z0-9]+)*$`) })
	adapterRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`) })
	semverRe  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(semver) })
)

// semver is SemVer 2.0.0 as published at semver.org.
const semver = `^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`

// ValidRequestID reports whether s is a request id or digest:
// sha256:<64 lowercase hex> ([PROTO-5]).
func ValidRequestID(s string) bool {
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexPart) != 64 {
		return false
	}
	for i := 0; i < len(hexPart); i++ {
		if c := hexPart[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ValidSourceID reports whether s is a source id ([OP-1]):
// [A-Za-z0-9._-]{1,64}, not starting with '.'.
func ValidSourceID(s string) bool {
	if len(s) == 0 || len(s) > MaxSourceIDBytes || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ValidConfigRef reports whether s is a config reference ([OP-1]): one line
// of 1..MaxConfigRefBytes bytes of UTF-8 with no control character.
func ValidConfigRef(s string) bool { return validLine(s, MaxConfigRefBytes) }

// ValidDiagnostic reports whether s is an error diagnostic ([PROTO-4]):
// 1..MaxDiagnosticBytes bytes of UTF-8 with no control character.
func ValidDiagnostic(s string) bool { return validLine(s, MaxDiagnosticBytes) }

func validLine(s string, max int) bool {
	return len(s) >= 1 && len(s) <= max && utf8.ValidString(s) && !strings.ContainsFunc(s, IsControl)
}

// ValidClassification reports whether s is a classification token: 1..64
// bytes matching ^[a-z0-9]+([._-][a-z0-9]+)*$ (lower-case ASCII letters and
// digits in runs separated by single '.', '_' or '-').
func ValidClassification(s string) bool {
	return len(s) <= MaxClassificationBytes && tokenRe().MatchString(s)
}

// ValidExtensionID reports whether s is a valid manifest id (CheckID).
func ValidExtensionID(s string) bool { return CheckID(s) == nil }

// ValidVersion reports whether s is a SemVer 2.0 version of at most 128 bytes
// (no "v" prefix, no leading zeros).
func ValidVersion(s string) bool { return CheckVersion(s) == nil }

// ValidAdapterName reports whether s is a valid adapter name (CheckAdapter).
func ValidAdapterName(s string) bool { return CheckAdapter(s) == nil }

// IsControl reports whether r is a control character in the protocol's sense:
// C0 (U+0000..U+001F), DEL (U+007F) or C1 (U+0080..U+009F).
func IsControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

// EscapedLen is the length of s inside a string of the canonical JSON that
// carries it in a request (Canonical, RFC 8785): '"' and '\\' take 2 bytes,
// the C0 controls with a short escape (\b \t \n \f \r) 2, every other C0
// control 6 (\u00XX), every other byte 1 (s is valid UTF-8).
//
// A captured result is carried as the content of every later
// result.classify, result.terminal and result.silent request, which must fit
// in MaxEnvelopeBytes ([INV-4]). So a source.poll output is bounded twice
// ([OP-1], [CAP-4]): at most MaxOutputBytes, and at most
// MaxEscapedOutputBytes once escaped, which is MaxEnvelopeBytes less the
// longest such request with an empty content (adapter of 32 bytes, extension
// id and version of 128, source id of 64, every number of 19 digits: 840
// bytes). Any output within both bounds can then be carried, whoever owns it
// and whatever its sequence; the host refuses one beyond at capture as
// response-oversized evidence, never capturing a result that no verdict
// could ever be asked about.
func EscapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\' || c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r':
			n++
		case c < 0x20:
			n += 5
		}
	}
	return n
}

// Sanitize makes msg one line of valid UTF-8 without control characters:
// invalid UTF-8 becomes U+FFFD, tabs and line breaks become spaces, every
// other control character (IsControl) is removed.
func Sanitize(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	var b strings.Builder
	b.Grow(len(msg))
	for _, r := range msg {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case IsControl(r):
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Truncate cuts valid UTF-8 s to at most n bytes at a rune boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Clip makes foreign text fit for a message: Sanitize, then at most n bytes,
// with "..." appended when it was cut.
func Clip(s string, n int) string {
	s = Sanitize(s)
	if len(s) <= n {
		return s
	}
	return Truncate(s, n) + "..."
}

// CheckID applies the extension id rule ([MAN-2]): at most 128 bytes of
// lower-case words joined by '.' or '-'.
func CheckID(id string) error {
	if len(id) > MaxExtensionIDBytes || !idRe().MatchString(id) {
		return fmt.Errorf("id %q must be lower-case words joined by '.' or '-' (^[a-z0-9]+([.-][a-z0-9]+)*$), at most 128 bytes", trunc(id))
	}
	return nil
}

// CheckVersion applies the SemVer 2.0 rule ([MAN-2]), at most 128 bytes.
func CheckVersion(v string) error {
	if len(v) > MaxVersionBytes || !semverRe().MatchString(v) {
		return fmt.Errorf("version %q must be a semantic version like 1.2.3 (no v prefix), at most 128 bytes", trunc(v))
	}
	return nil
}

// CheckAdapterNames applies the adapter-name list rule ([MAN-3]): a
// non-empty, duplicate-free list of adapter names.
func CheckAdapterNames(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("adapter_names must not be empty")
	}
	seen := map[string]bool{}
	for _, n := range names {
		if err := CheckAdapter(n); err != nil {
			return fmt.Errorf("adapter_names: %v", err)
		}
		if seen[n] {
			return fmt.Errorf("adapter_names: duplicate %q", n)
		}
		seen[n] = true
	}
	return nil
}

// CheckAdapter applies the adapter-name rule ([MAN-3]): at most 32 bytes of
// lower-case words joined by '-'.
func CheckAdapter(n string) error {
	if len(n) > MaxAdapterNameBytes || !adapterRe().MatchString(n) {
		return fmt.Errorf("adapter name %q must be lower-case words joined by '-' (^[a-z0-9]+(-[a-z0-9]+)*$), at most 32 bytes", trunc(n))
	}
	return nil
}

// CheckEntrypoint applies the entrypoint path rule ([MAN-2]): 1..256 bytes,
// relative, '/'-separated, no empty, "." or ".." component, no backslash, no
// control character, valid UTF-8.
func CheckEntrypoint(p string) error {
	if len(p) == 0 || len(p) > MaxEntrypointBytes || !utf8.ValidString(p) {
		return fmt.Errorf("entrypoint %q must be 1..256 bytes of UTF-8", trunc(p))
	}
	if strings.ContainsAny(p, "\\") || strings.ContainsFunc(p, IsControl) {
		return fmt.Errorf("entrypoint %q must not hold a backslash or control character", trunc(p))
	}
	for _, comp := range strings.Split(p, "/") {
		if comp == "" || comp == "." || comp == ".." {
			return fmt.Errorf("entrypoint %q must be a relative '/'-separated path with no empty, '.' or '..' component", trunc(p))
		}
	}
	return nil
}

// CheckVersionList applies the rule of host_protocols and capability versions
// ([MAN-2]): a non-empty, duplicate-free list of integers 1..2^31-1. field
// names the list in errors.
func CheckVersionList(xs []int64, field string) error {
	if len(xs) == 0 {
		return fmt.Errorf("%s must not be empty", field)
	}
	seen := map[int64]bool{}
	for _, x := range xs {
		if x < 1 || x > 1<<31-1 {
			return fmt.Errorf("%s: %d is out of range 1..2147483647", field, x)
		}
		if seen[x] {
			return fmt.Errorf("%s: duplicate %d", field, x)
		}
		seen[x] = true
	}
	return nil
}

// trunc bounds a value quoted in a manifest rule's message.
func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
