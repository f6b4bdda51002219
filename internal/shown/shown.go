// Package shown decides how fm's own text shows text it did not write: a
// name a package chose (a JSON member name, an adapter or source id read
// from a file), a number or a path read from a home fm did not write.
//
// Rules (docs/spec.md [OP-3]):
//   - a name is shown as it is only when it is token-shaped: 1 to 64 bytes
//     of [A-Za-z0-9_.-] (Token). Anything else is not shown at all: the
//     caller names the thing by its position or its kind instead, so no
//     instruction, control byte, line break, look-alike character or
//     unbounded length of a stranger's name reaches a line an operator or
//     an agent reads;
//   - a value, a diagnostic or a process's stderr is never shown;
//   - where fm must still say something about such text, Describe gives
//     only its length and whether it was printable.
package shown

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxToken is the longest name Token shows.
const MaxToken = 64

// IsToken reports whether s is token-shaped: 1 to MaxToken bytes, each an
// ASCII letter or digit, '_', '.' or '-'.
func IsToken(s string) bool {
	if s == "" || len(s) > MaxToken {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Token is s when it is token-shaped, else Describe(s).
func Token(s string) string {
	if IsToken(s) {
		return s
	}
	return Describe(s)
}

// Describe says what s is without showing it: "(a name of N bytes)".
func Describe(s string) string {
	return fmt.Sprintf("(a name of %d bytes, not shown)", len(s))
}

// Printable reports whether every byte of s is printable ASCII (0x20 to
// 0x7e).
func Printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Plain reports whether s is text fm may print as it is: valid UTF-8
// without a control character (C0, DEL, C1), a formatting character (such
// as a bidirectional override or a zero-width joiner) or a line or
// paragraph separator, so it can neither end a line fm prints nor make it
// read other than it is.
func Plain(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, unplain) < 0
}

// Path is how fm prints a path (or a name below a directory) it did not
// choose: as it is when it is Plain, else quoted as printable ASCII
// (strconv.QuoteToASCII), so no name can end a line fm prints or forge the
// next one.
func Path(p string) string {
	if Plain(p) {
		return p
	}
	return strconv.QuoteToASCII(p)
}

// Flatten makes s Plain for a line of its own: bytes that are not UTF-8
// become U+FFFD, and every control character (tab, line break, carriage
// return, escape, ...), formatting character and line or paragraph
// separator becomes a space.
func Flatten(s string) string {
	return strings.Map(func(r rune) rune {
		if unplain(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// unplain reports whether r may not appear in Plain text.
func unplain(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}
