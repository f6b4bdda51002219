package procevent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// [STAT-6] the debug log is bounded: past maxDebugLog it is rotated to
// .stderr.1, and neither file ever holds more; every line is escaped.
func TestDebugLogRotates(t *testing.T) {
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	kept := []byte(strings.Repeat("x\x1b[2J\xff", 1000) + "\n")
	for range 40 {
		l := &stderrLog{}
		l.collect()("invoke", kept, 9000)
		if err := l.save(dir, "s"); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"s.stderr", "s.stderr.1"} {
		data, err := os.ReadFile(filepath.Join(dir.Name(), n))
		if err != nil {
			t.Fatal(err)
		}
		if len(data) == 0 || len(data) > maxDebugLog {
			t.Fatalf("%s holds %d bytes; want 1..%d", n, len(data), maxDebugLog)
		}
		if strings.ContainsAny(string(data), "\x1b\xff") {
			t.Fatalf("%s holds a raw control or invalid byte", n)
		}
		if !strings.Contains(string(data), "stderr[invoke] cut: 9000 bytes written") {
			t.Fatalf("%s does not say the stderr was cut", n)
		}
	}
}
