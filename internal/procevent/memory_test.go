package procevent

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// [RUN-2] serve's collection goal: while the live heap is small, GOGC is
// raised so the heap may grow to heapFloor before a collection (a serve of
// a few MiB otherwise collects many times a second); once the live heap is
// heapFloor/2 or more, GOGC is the default, so memory grows by at most
// heapFloor over the default. Not parallel: it measures this process's heap.
func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	// Give the memory back: a child this process starts inherits its
	// resident size into the child's peak (ru_maxrss counts the parent's
	// pages shared until exec), which other tests measure.
	defer debug.FreeOSMemory()
	big := make([]byte, heapFloor)
	for i := range big {
		big[i] = 1
	}
	runtime.GC()
	if got := tuneGC(); got != 100 {
		t.Errorf("GOGC with a live heap of %d MiB = %d, want 100", len(big)>>20, got)
	}
	runtime.KeepAlive(big)
	big = nil
	runtime.GC()
	got := tuneGC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if got <= 100 {
		t.Fatalf("GOGC with a live heap of %d KiB = %d, want more than 100", ms.HeapAlloc>>10, got)
	}
	if goal := ms.NextGC; goal > heapFloor*11/10 {
		t.Errorf("heap goal %d KiB after tuning, want at most about %d KiB", goal>>10, heapFloor>>10)
	}
}
