package pkgtree

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkScan digests a package at the [PKG-4] bounds and compares it with
// the physical floor: sha256sum over the same files (one process fed by
// xargs, page cache warm for both). It reports fm-MB/s, sha256sum-MB/s and
// their ratio fm/sha256sum (above 1: Scan is faster).
//
//	go test -run '^$' -bench Scan ./internal/pkgtree/
func BenchmarkScan(b *testing.B) {
	for _, c := range []struct {
		files int
		size  int
	}{
		{MaxEntries, MaxBytes / MaxEntries}, // 4,096 files of 16 KiB
		{64, MaxBytes / 64},                 // 64 files of 1 MiB
	} {
		b.Run(fmt.Sprintf("%dx%dKiB", c.files, c.size>>10), func(b *testing.B) {
			root, names := benchTree(b, c.files, c.size)
			total := int64(c.files * c.size)
			sha := timeSha256sum(b, root, names, 1) // warm the page cache
			b.SetBytes(total)
			for b.Loop() {
				tr, err := Scan(root, Source)
				if err != nil || tr.Bytes != total {
					b.Fatal(err)
				}
			}
			fm := b.Elapsed() / time.Duration(b.N)
			sha = timeSha256sum(b, root, names, 10)
			fmRate, shaRate := mbps(total, fm), mbps(total, sha)
			b.ReportMetric(fmRate, "fm-MB/s")
			b.ReportMetric(shaRate, "sha256sum-MB/s")
			b.ReportMetric(fmRate/shaRate, "fm/sha256sum")
		})
	}
}

func mbps(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

// benchTree writes files of random bytes into a fresh package root and
// returns it with the file names.
func benchTree(b *testing.B, files, size int) (string, []string) {
	root := newPkg(b)
	r := rand.NewChaCha8([32]byte{1})
	data := make([]byte, size)
	names := make([]string, files)
	for i := range names {
		r.Read(data)
		names[i] = fmt.Sprintf("f%04d", i)
		if err := os.WriteFile(filepath.Join(root, names[i]), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return root, names
}

// timeSha256sum runs `xargs -0 sha256sum` over names in root runs times and
// returns the mean wall time of one run.
func timeSha256sum(b *testing.B, root string, names []string, runs int) time.Duration {
	var list bytes.Buffer
	for _, n := range names {
		list.WriteString(n)
		list.WriteByte(0)
	}
	start := time.Now()
	for range runs {
		cmd := exec.Command("xargs", "-0", "sha256sum")
		cmd.Dir = root
		cmd.Stdin = bytes.NewReader(list.Bytes())
		cmd.Stdout = io.Discard
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			b.Skipf("xargs sha256sum: %v %s", err, stderr.Bytes())
		}
	}
	return time.Since(start) / time.Duration(runs)
}
