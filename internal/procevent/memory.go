package procevent

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// serve's garbage collection.
//
// A serve's live heap is small (2-3 MiB with 200 sources answering at
// once) while it allocates steadily (requests, responses, records of
// hundreds of invocations a second). With the default GOGC of 100 the
// runtime then collects whenever the heap reaches its 4 MiB minimum goal:
// about fifteen collections a second, each scanning the stack of every
// goroutine (several per source), a tenth of serve's CPU. So serve lets
// its heap grow to heapFloor before a collection while its live heap is
// small, by setting GOGC to what makes the goal heapFloor.
//
// A large live heap (a serve of a thousand long polls: 12-14 MiB of
// objects and the stacks of two goroutines per poll) is another matter:
// such a serve allocates little, and at the default GOGC its resident size
// was mostly garbage waiting for the next collection (54-58 MB, against
// 46-48 MB at GOGC 50, idle with 1,000 sources; answering at once, its CPU
// over its children's was the same within the noise: docs/performance.md,
// "Sixth pass"). So GOGC never goes below largeHeapPercent, and is that
// once heapFloor is not reached with it.
const heapFloor = 16 << 20

// largeHeapPercent is serve's GOGC once its live heap is large.
const largeHeapPercent = 50

// runtimeHeapMinimum is the Go runtime's minimum heap goal at GOGC=100,
// which it scales with GOGC.
const runtimeHeapMinimum = 4 << 20

// tuneGC sets GOGC from the live heap now (see heapFloor) and returns the
// value it set.
func tuneGC() int {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	metrics.Read(s)
	var v [3]uint64
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return debug.SetGCPercent(100)
		}
		v[i] = s[i].Value.Uint64()
	}
	// The runtime's goal is the larger of live + (live+stacks+globals) *
	// GOGC/100 and its minimum heap, 4 MiB * GOGC/100: the largest GOGC
	// that keeps both within heapFloor, and never less than
	// largeHeapPercent.
	live, scan := v[0], v[0]+v[1]+v[2]
	percent := largeHeapPercent
	if live < heapFloor && scan > 0 {
		percent = max(largeHeapPercent, min(100*heapFloor/runtimeHeapMinimum, int(100*(heapFloor-live)/scan)))
	}
	debug.SetGCPercent(percent)
	return percent
}

// tuneGCUntil tunes GOGC now and after every collection until ctx is done,
// then restores the value it found; it does nothing when the environment
// sets GOGC. After every collection rather than on a timer: the live heap
// is then just measured, an idle serve is never woken for it, and a heap
// that grows fast (a thousand polls starting at once) is tuned again at
// each collection instead of growing for up to a second at the GOGC a small
// heap had (that left an idle 1,000-source serve ~6 MB larger).
func tuneGCUntil(ctx context.Context) {
	if os.Getenv("GOGC") != "" {
		return
	}
	var mu sync.Mutex
	done := false
	orig := debug.SetGCPercent(100)
	tuneGC()
	var arm func()
	arm = func() {
		// The finalizer of an object nothing refers to runs after the
		// collection that finds it unreachable; it has a pointer, so the
		// runtime's tiny allocator (which may keep such objects alive)
		// does not take it.
		runtime.SetFinalizer(&gcCycle{}, func(*gcCycle) {
			mu.Lock()
			defer mu.Unlock()
			if !done {
				tuneGC()
				arm()
			}
		})
	}
	arm()
	<-ctx.Done()
	mu.Lock()
	done = true
	debug.SetGCPercent(orig)
	mu.Unlock()
}

// gcCycle is the object whose finalizer marks the end of a collection.
type gcCycle struct{ _ *byte }
