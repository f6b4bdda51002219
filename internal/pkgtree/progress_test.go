package pkgtree

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// report is one call of a Progress hook.
type report struct {
	stage             string
	files, totalFiles int
	bytes, totalBytes int64
}

// recorder is a Progress that keeps every call and notices overlapping ones:
// a call that finds another one in progress sets overlap.
type recorder struct {
	mu      sync.Mutex
	overlap bool
	reports []report
}

func (r *recorder) progress(stage string, files, totalFiles int, bytes, totalBytes int64) {
	if !r.mu.TryLock() {
		r.overlap = true
		return
	}
	defer r.mu.Unlock()
	r.reports = append(r.reports, report{stage, files, totalFiles, bytes, totalBytes})
}

// stages checks that the reports form the given stages in order, each
// starting at zero, advancing one file at a time to the tree's totals (or,
// for a stage that reads no file, in one step), and never overlapping.
func (r *recorder) stages(t *testing.T, tr *Tree, want ...string) {
	t.Helper()
	files := 0
	for _, e := range tr.Entries {
		if !e.Dir {
			files++
		}
	}
	if r.overlap {
		t.Fatal("two reports overlapped")
	}
	var got []string
	for i, rep := range r.reports {
		if rep.totalFiles != files || rep.totalBytes != tr.Bytes {
			t.Fatalf("report %d: totals %d files %d bytes, want %d and %d", i, rep.totalFiles, rep.totalBytes, files, tr.Bytes)
		}
		if rep.files == 0 {
			if rep.bytes != 0 {
				t.Fatalf("report %d starts %s with %d bytes", i, rep.stage, rep.bytes)
			}
			got = append(got, rep.stage)
			continue
		}
		prev := r.reports[i-1]
		proved := prev.files == 0 && rep.files == files && rep.bytes == tr.Bytes
		if rep.stage != prev.stage || rep.files != prev.files+1 && !proved || rep.bytes < prev.bytes {
			t.Fatalf("report %d (%+v) does not follow %+v", i, rep, prev)
		}
	}
	if last := r.reports[len(r.reports)-1]; last.files != files || last.bytes != tr.Bytes {
		t.Fatalf("the last report is %+v, not the whole tree", last)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("stages %v, want %v", got, want)
	}
}

// steps is how many reports stage got: two (start and end) for a stage
// that read no file.
func (r *recorder) steps(stage string) int {
	n := 0
	for _, rep := range r.reports {
		if rep.stage == stage {
			n++
		}
	}
	return n
}

// ScanWith reports hashing from nothing to the whole tree, for a small tree
// (hashed inline) and a large one (hashed by parallel workers), and gives
// the digest Scan gives.
func TestScanWithProgress(t *testing.T) {
	big := []node{{path: "data/"}}
	for i := range 24 {
		big = append(big, node{path: fmt.Sprintf("data/f%02d", i), data: strings.Repeat("x", 100<<10)})
	}
	for name, nodes := range map[string][]node{"small": fixtureNested, "large": big} {
		t.Run(name, func(t *testing.T) {
			src := newPkg(t, nodes...)
			r := &recorder{}
			tr, err := ScanWith(src, Source, Options{Progress: r.progress})
			must(t, err)
			if tr.Digest != mustScan(t, src, Source).Digest {
				t.Fatal("ScanWith and Scan disagree")
			}
			r.stages(t, tr, StageHashing)
		})
	}
}

// InstallWith reports the copy (which is also the source's rescan), then
// the rescan of the copy, which reads no byte when the copy is unchanged
// since it was written (TestInstallProvesCopyByStamps): its start and end
// only. Reusing an existing copy reports its verification (hashing) only.
func TestInstallWithProgress(t *testing.T) {
	src := newPkg(t, fixtureInstall...)
	tr := mustScan(t, src, Source)
	dst := storePath(storeHome(t), tr)
	r := &recorder{}
	wantCode(t, errOf(InstallWith(src, tr, dst, Options{Progress: r.progress})), "")
	r.stages(t, tr, StageCopying, StageVerifying)
	if n := r.steps(StageVerifying); n != 2 {
		t.Errorf("the rescan of the new copy reported %d steps, want 2 (it reads no file)", n)
	}

	r = &recorder{}
	wantCode(t, errOf(InstallWith(src, tr, dst, Options{Progress: r.progress})), "")
	r.stages(t, tr, StageVerifying)
	if n := r.steps(StageVerifying); n != 6 {
		t.Errorf("the verification of a reused copy reported %d steps, want 6 (5 files hashed)", n)
	}
}
