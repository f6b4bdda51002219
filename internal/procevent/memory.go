package procevent

import (
	"os"
	"runtime"
	"runtime/debug"
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

// maxPercent is the largest GOGC serve sets: the one whose minimum heap
// goal is heapFloor.
const maxPercent = 100 * heapFloor / runtimeHeapMinimum

// tuneGC sets GOGC, which is now percent, from the heap goal the runtime
// set at the last collection (see heapFloor), and returns the value it set.
//
// The live heap is not read from runtime/metrics: linking that package
// costs every fm process, the launch barrier included, its initialisation
// (a table of every metric, 0.1-0.3 ms of each start, measured in
// docs/performance.md). It follows from the goal instead,
// which runtime.MemStats gives: above its minimum (runtimeHeapMinimum
// scaled by GOGC) the goal is live + scan*percent/100, where scan is the
// live heap plus the stacks and globals the collection scanned. With the
// stacks in use standing in for what was scanned besides the heap (as a
// rule more: a goroutine's stack is in use whole, scanned only as deep as
// it is used, so a step falls short of its mark rather than past it),
// scan = (goal + stacks) / (1 + percent/100), and the GOGC that makes the
// goal heapFloor is percent + 100*(heapFloor - goal)/scan. At the goal heapFloor that is percent itself, whatever the
// estimate: the estimate sets only how fast the tuning gets there. A goal
// at the minimum means a live heap small enough for maxPercent. A memory
// limit (GOMEMLIMIT) can only lower the goal, and the runtime keeps to it
// whatever GOGC is. ReadMemStats stops the world for a moment, once per
// collection.
func tuneGC(percent int) int {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	goal, p := float64(ms.NextGC), float64(percent)
	next := maxPercent
	if goal > runtimeHeapMinimum*p/100 {
		scan := (goal + float64(ms.StackInuse)) / (1 + p/100)
		next = int(max(largeHeapPercent, min(maxPercent, p+100*(heapFloor-goal)/scan)))
	}
	debug.SetGCPercent(next)
	return next
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
		gcTuning.percent = tuneGC(100)
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
	// percent is the GOGC the tuning set last.
	percent int
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
			gcTuning.percent = tuneGC(gcTuning.percent)
			armGCTune(chain)
		}
	})
}

// gcCycle is the object whose finalizer marks the end of a collection.
type gcCycle struct{ _ *byte }
