package procevent

import (
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
// such a serve allocates little, and at the default GOGC it held ~10 MB of
// garbage waiting for the next collection (54-58 MB against 46-48 MB at
// GOGC 50, idle with 1,000 sources; with all of them answering at once, its
// CPU over its children's was the same within the noise:
// docs/performance.md, "Sixth pass"). So GOGC never goes below
// largeHeapPercent, and is that once heapFloor is not reached with it.
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

// tuneGCWhileServing tunes GOGC now and after every collection until the
// returned stop is called, which restores the value found before; it does
// nothing when the environment sets GOGC. After every collection rather
// than on a timer: the live heap is then just measured, an idle serve is
// never woken for it, and a heap that grows fast (a thousand polls
// starting at once) is tuned again at each collection instead of growing
// for up to a second at the GOGC a small heap had (that left an idle
// 1,000-source serve ~6 MB larger).
//
// GOGC is the process's, so the tuning is too: serves running at once in
// one process (tests run Serve in-process) share it, the first saves the
// GOGC found and the last to stop restores it; stop returns only once
// GOGC is restored, so nothing changes it after Serve returns.
func tuneGCWhileServing() (stop func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	gcTuning.Lock()
	defer gcTuning.Unlock()
	gcTuning.serves++
	if gcTuning.serves == 1 {
		gcTuning.found = debug.SetGCPercent(100)
		gcTuning.chain++
		tuneGC()
		armGCTune(gcTuning.chain)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			gcTuning.Lock()
			defer gcTuning.Unlock()
			gcTuning.serves--
			if gcTuning.serves == 0 {
				debug.SetGCPercent(gcTuning.found)
			}
		})
	}
}

// gcTuning is the state of the process's GOGC tuning.
var gcTuning struct {
	sync.Mutex
	serves int // serves tuning now
	found  int // the GOGC the first of them found
	// chain numbers the finalizer chains: a chain whose serves all
	// stopped ends at its next collection even when a new serve has
	// started its own chain since.
	chain int
}

// armGCTune tunes GOGC at the end of the next collection and arms itself
// again, while serves run and chain is the current one. The finalizer of
// an object nothing refers to runs after the collection that finds it
// unreachable; it has a pointer, so the runtime's tiny allocator (which
// may keep such objects alive) does not take it. debug.SetGCPercent under
// the lock does not wait for a collection to end (only for a mark phase,
// and only when GC is turned off), so it cannot wait for this finalizer.
func armGCTune(chain int) {
	runtime.SetFinalizer(&gcCycle{}, func(*gcCycle) {
		gcTuning.Lock()
		defer gcTuning.Unlock()
		if gcTuning.serves > 0 && gcTuning.chain == chain {
			tuneGC()
			armGCTune(chain)
		}
	})
}

// gcCycle is the object whose finalizer marks the end of a collection.
type gcCycle struct{ _ *byte }
