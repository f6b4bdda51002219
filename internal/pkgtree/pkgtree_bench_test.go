package pkgtree

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkScan digests a package at the [PKG-4] bounds (4,096 files of
// 16 KiB: 64 MiB) and compares it with the physical floor: sha256sum over the
// same files, page cache warm. Every iteration runs Scan, then one sha256sum
// process fed by xargs (as an operator would run it), then two such
// processes (xargs -P2, both cores as Scan uses them), so load on the
// machine hits all three alike. It reports the medians as fm-MB/s,
// sha256sum-MB/s and sha256sum-P2-MB/s, and the median time ratio
// fm/sha256sum-time (below 1: Scan is faster), the figure bench/run.sh
// prints as digest-vs-sha256sum.
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
			timeSha256sum(b, root, names, 1) // warm the page cache
			b.SetBytes(total)
			var fm, sha, sha2 []time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				tr, err := Scan(root, Source)
				if err != nil || tr.Bytes != total {
					b.Fatal(err)
				}
				fm = append(fm, time.Since(start))
				b.StopTimer()
				sha = append(sha, timeSha256sum(b, root, names, 1))
				sha2 = append(sha2, timeSha256sum(b, root, names, 2))
				b.StartTimer()
			}
			mf, ms, ms2 := median(fm), median(sha), median(sha2)
			b.ReportMetric(mbps(total, mf), "fm-MB/s")
			b.ReportMetric(mbps(total, ms), "sha256sum-MB/s")
			b.ReportMetric(mbps(total, ms2), "sha256sum-P2-MB/s")
			b.ReportMetric(float64(mf)/float64(ms), "fm/sha256sum-time")
		})
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
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

// timeSha256sum runs `xargs -0 -P procs sha256sum` over names in root once
// and returns its wall time. With procs > 1 each process gets an equal share
// of the names.
func timeSha256sum(b *testing.B, root string, names []string, procs int) time.Duration {
	var list bytes.Buffer
	for _, n := range names {
		list.WriteString(n)
		list.WriteByte(0)
	}
	args := []string{"-0", "-P", fmt.Sprint(procs)}
	if procs > 1 {
		args = append(args, "-n", fmt.Sprint((len(names)+procs-1)/procs))
	}
	args = append(args, "sha256sum")
	cmd := exec.Command("xargs", args...)
	cmd.Dir = root
	cmd.Stdin = &list
	cmd.Stdout = io.Discard
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		b.Skipf("xargs sha256sum: %v %s", err, stderr.Bytes())
	}
	return time.Since(start)
}
