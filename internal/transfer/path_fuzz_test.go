package transfer

import (
	"path"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"firstmate.dev/fm/internal/errcode"
)

// FuzzEntryPath compares the receiver's entry-path rule ([XFER-2]: no
// absolute, traversing or non-normalized name) with its statement: valid
// UTF-8 without control characters, relative, '/'-separated components that
// are neither empty, "." nor "..", each at most 255 bytes. An accepted path
// joined to a staging directory names something strictly inside it.
func FuzzEntryPath(f *testing.F) {
	for _, s := range []string{"a", "a/b", "/a", "a/", "./a", "a/./b", "a/../b", "..", "a//b", "a\x00b", "a\u0085b", "\xff", "a\\..\\b",
		strings.Repeat("n", 255), strings.Repeat("n", 256), "é/ü/ß"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := checkPath(p)
		want := utf8.ValidString(p) && !strings.HasPrefix(p, "/")
		for _, r := range p {
			want = want && !(r < 0x20 || r >= 0x7f && r <= 0x9f)
		}
		for _, c := range strings.Split(p, "/") {
			want = want && c != "" && c != "." && c != ".." && len(c) <= 255
		}
		if got := err == nil; got != want {
			t.Fatalf("checkPath(%q) accepts=%v, [XFER-2] says %v", p, got, want)
		}
		if err != nil {
			if errcode.Of(err) != errcode.PathUnsafe {
				t.Fatalf("refused as %s: %v", errcode.Of(err), err)
			}
			return
		}
		if j := filepath.Join("/staging/unit/package", p); path.Clean(p) != p || !strings.HasPrefix(j, "/staging/unit/package/") {
			t.Fatalf("accepted %q names %s", p, j)
		}
	})
}
