package procevent

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
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
// small, by raising GOGC to what makes the goal heapFloor, and keeps the
// default once the live heap is heapFloor/2 or more (a serve of a thousand
// long polls), so that memory never grows more than heapFloor above what
// the default would use.
const heapFloor = 16 << 20

// runtimeHeapMinimum is the Go runtime's minimum heap goal at GOGC=100,
// which it scales with GOGC.
const runtimeHeapMinimum = 4 << 20

// gcTuneEvery is how often the live heap is looked at again.
const gcTuneEvery = time.Second

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
	// that keeps both within heapFloor, and never less than the default.
	live, scan := v[0], v[0]+v[1]+v[2]
	percent := 100
	if live < heapFloor/2 && scan > 0 {
		percent = max(100, min(100*heapFloor/runtimeHeapMinimum, int(100*(heapFloor-live)/scan)))
	}
	debug.SetGCPercent(percent)
	return percent
}

// tuneGCUntil keeps GOGC tuned until ctx is done, then restores the
// value it found; it does nothing when the environment sets GOGC.
func tuneGCUntil(ctx context.Context) {
	if os.Getenv("GOGC") != "" {
		return
	}
	t := time.NewTicker(gcTuneEvery)
	defer t.Stop()
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for {
		tuneGC()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
