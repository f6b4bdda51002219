package procevent

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// [RUN-2] serve's collection goal: while the live heap is small, GOGC is
// raised so the heap may grow to heapFloor before a collection (a serve of
// a few MiB otherwise collects many times a second); once the live heap is
// large (a serve of a thousand long polls), GOGC is largeHeapPercent, so its
// heap holds half its live size in garbage, not as much again. Not
// parallel: it measures this process's heap.
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
	if got := tuneGC(100); got != largeHeapPercent {
		t.Errorf("GOGC with a live heap of %d MiB = %d, want %d", len(big)>>20, got, largeHeapPercent)
	}
	runtime.KeepAlive(big)
	big = nil
	runtime.GC()
	got := tuneGC(largeHeapPercent)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if got <= 100 {
		t.Fatalf("GOGC with a live heap of %d KiB = %d, want more than 100", ms.HeapAlloc>>10, got)
	}
	if goal := ms.NextGC; goal > heapFloor*11/10 {
		t.Errorf("heap goal %d KiB after tuning, want at most about %d KiB", goal>>10, heapFloor>>10)
	}
}

// gogc reads the runtime's current GOGC without changing it.
func gogc(t *testing.T) int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Skip("no /gc/gogc:percent metric")
	}
	return int(s[0].Value.Uint64())
}

// waitGOGC collects every few milliseconds until GOGC satisfies want or
// half a second has passed, well short of the second a timer took.
// Collecting again, not once: a finalizer that runs during the next
// collection's mark re-arms with an object that survives that collection,
// and fires only at the one after.
func waitGOGC(t *testing.T, want func(int) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(500 * time.Millisecond)
	for !want(gogc(t)) {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d, want %s", gogc(t), what)
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// [RUN-2] serve tunes GOGC after each collection, not on a timer: a live
// heap that grows between two collections gets its GOGC at the next one
// (well within the second a timer took), and the value found is restored
// when serve stops. Not parallel: it sets this process's GOGC.
func TestTuneGCFollowsCollections(t *testing.T) {
	t.Setenv("GOGC", "") // tuneGCWhileServing leaves an operator's GOGC alone
	defer debug.SetGCPercent(debug.SetGCPercent(77))
	defer debug.FreeOSMemory()
	stop := tuneGCWhileServing()
	defer stop()
	waitGOGC(t, func(p int) bool { return p > 100 }, "more than 100 with a small live heap")
	big := make([]byte, heapFloor)
	for i := range big {
		big[i] = 1
	}
	waitGOGC(t, func(p int) bool { return p == largeHeapPercent }, "largeHeapPercent right after the collection that found a large live heap")
	runtime.KeepAlive(big)
	big = nil
	waitGOGC(t, func(p int) bool { return p > 100 }, "more than 100 again once the live heap is small")
	stop()
	if p := gogc(t); p != 77 {
		t.Fatalf("GOGC %d after serve, want the 77 it found", p)
	}
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if p := gogc(t); p != 77 {
		t.Fatalf("GOGC %d two collections after serve stopped, want the 77 it found", p)
	}
}

// [RUN-2] GOGC is the process's: serves that overlap in one process (tests
// run Serve in-process) leave it as the first found once the last stops,
// whatever order they stop in, and a serve started again right after
// another stopped is tuned by one finalizer chain, which stops with it.
// Not parallel: it sets this process's GOGC.
func TestTuneGCOverlappingServes(t *testing.T) {
	t.Setenv("GOGC", "")
	defer debug.SetGCPercent(debug.SetGCPercent(77))
	stopA := tuneGCWhileServing()
	stopB := tuneGCWhileServing()
	stopA()
	if p := gogc(t); p == 77 {
		t.Fatalf("GOGC restored to %d while a serve still runs", p)
	}
	stopB()
	stopB() // a second call is harmless
	if p := gogc(t); p != 77 {
		t.Fatalf("GOGC %d after both serves stopped, want the 77 the first found", p)
	}
	stopC := tuneGCWhileServing()
	stopC()
	debug.SetGCPercent(88)
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	if p := gogc(t); p != 88 {
		t.Fatalf("GOGC %d after serves stopped and it was set to 88: a finalizer chain outlived its serve", p)
	}
}
