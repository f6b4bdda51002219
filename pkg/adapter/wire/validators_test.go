package wire

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The hand-written request id and source id checks accept exactly what the
// contract's regular expressions accept.
func TestHandWrittenValidatorsMatchRegexps(t *testing.T) {
	requestIDRe := regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	sourceIDRe := regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`)
	hex64 := strings.Repeat("0123456789abcdef", 4)
	cases := []string{
		"", ".", "a", ".a", "a.", "-a", "_", "A-Z_a.z09", strings.Repeat("a", 64), strings.Repeat("a", 65),
		"." + strings.Repeat("a", 63), "a b", "a\n", "é", "a/b",
		"sha256:" + hex64, "sha256:" + strings.ToUpper(hex64), "sha256:" + hex64[:63], "sha256:" + hex64 + "0",
		"sha256:" + hex64 + "\n", "SHA256:" + hex64, "sha512:" + hex64, "sha256:" + hex64[:63] + "g",
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := "aZ09._-/: \n\x00é" + "sha256:" + "f"
	for range 20000 {
		b := make([]byte, r.IntN(80))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(4) == 0 {
			b = append([]byte("sha256:"), []byte(hex64[:r.IntN(65)])...)
			if len(b) > 7 && r.IntN(2) == 0 {
				b[7+r.IntN(len(b)-7)] = alphabet[r.IntN(len(alphabet))]
			}
		}
		cases = append(cases, string(b))
	}
	for _, c := range cases {
		if got, want := ValidRequestID(c), requestIDRe.MatchString(c); got != want {
			t.Errorf("ValidRequestID(%q) = %v, regexp says %v", c, got, want)
		}
		if got, want := ValidSourceID(c), sourceIDRe.MatchString(c); got != want {
			t.Errorf("ValidSourceID(%q) = %v, regexp says %v", c, got, want)
		}
	}
}
