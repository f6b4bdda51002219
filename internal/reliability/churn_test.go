package reliability

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestChurn is the churn test of issue 15 in small, for every test run
// (FM_CHURN_DURATION, default 4s, extended on a loaded machine until every
// listing verb ran twice; set it to minutes for the long run). Real fm processes
// share one home for the whole duration:
//
//   - churners bind and retire unrelated packages without pause (each
//     retire-binding moves, or unlinks, a record of config/extensions.d
//     while others list it; six more bindings that stay widen each
//     reader's window between its listing and its read of a churned record);
//   - a poller runs `procevent start` of a source of the fake binding A,
//     whose package answers no-result at once;
//   - a lister runs every listing verb in turn: extension list, extension
//     verify, procevent list, procevent inbox, doctor and register-extension
//     of a fresh source id.
//
// A record that vanishes between a reader's listing and its read is not
// there, never corruption ([BND-4]) and never the package's failure
// ([OP-3]): so no poll captures anything (a no-result poll captures only
// evidence, and every piece of it here would be blamed on a package that did
// nothing wrong) and every listing verb exits 0 throughout ([RUN-3]).
func TestChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	// Not parallel: its four fm processes at a time would slow the timed
	// polls of the parallel tests (the hostile corpus binds with a 300 ms
	// timeout), so it runs alone, before them.
	d := 4 * time.Second
	if s := os.Getenv("FM_CHURN_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("FM_CHURN_DURATION=%q: %v", s, err)
		}
	}
	w := newWorld(t)
	dir := w.makePackage("pkg-a", fakeID, `["fake"]`)
	w.ok(nil, "extension", "bind", dir, "--adapter", fakeAdapter, "--trust-same-user-code")
	w.mode(fakeID, "invoke", "", "no-result")
	w.mode(fakeID, "handshake", "", "good")
	w.ok(nil, "procevent", "register-extension", fakeAdapter, "a1", "--config-ref", "ref-a1")

	// Bound records that sort between A and the churned ones widen the
	// window between a reader's listing and its read of a churned record.
	for i := range 6 {
		id := fmt.Sprintf("org.example.m%d", i)
		w.ok(nil, "extension", "bind", w.makePackage("pkg-m"+strconv.Itoa(i), id, fmt.Sprintf(`["m%d"]`, i)), "--adapter", fmt.Sprintf("m%d", i), "--trust-same-user-code")
	}
	const churners = 2
	var zdirs []string
	for i := range churners {
		id := fmt.Sprintf("org.example.z%d", i)
		zdirs = append(zdirs, w.makePackage(fmt.Sprintf("pkg-z%d", i), id, fmt.Sprintf(`["z%d"]`, i)))
	}

	var (
		stop                     atomic.Bool
		commands, rebinds, polls atomic.Int64
		mu                       sync.Mutex
		failures                 []string
		captures, blamed         int
	)
	fail := func(what string, r *run) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, what+": "+r.String())
		} else {
			failures = append(failures, what)
		}
	}
	var wg sync.WaitGroup
	began := time.Now()
	for i, zdir := range zdirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, adapter := fmt.Sprintf("org.example.z%d", i), fmt.Sprintf("z%d", i)
			for !stop.Load() {
				r := w.fm(nil, "extension", "bind", zdir, "--adapter", adapter, "--trust-same-user-code")
				commands.Add(1)
				if r.code != 0 {
					fail("bind "+id, r)
					return
				}
				digest := field(r.stdout, "binding-digest")
				r = w.fm(nil, "extension", "retire-binding", id, "--if-binding-digest", digest)
				commands.Add(1)
				// A verify's handshake of this binding pins it for its
				// duration: binding-in-use is the contract's answer, retried.
				for r.code == 1 && r.errCode() == "binding-in-use" && !stop.Load() {
					r = w.fm(nil, "extension", "retire-binding", id, "--if-binding-digest", digest)
					commands.Add(1)
				}
				if r.code != 0 && !stop.Load() {
					fail("retire-binding "+id, r)
					return
				}
				rebinds.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			r := w.fm(nil, "procevent", "start", "a1")
			commands.Add(1)
			polls.Add(1)
			if n := strings.Count(r.stdout, "captured: "); n > 0 || r.code != 0 {
				mu.Lock()
				captures += n
				blamed += n // the package answered no-result every time
				mu.Unlock()
				fail("poll of a1", r)
			}
		}
	}()
	listings := [][]string{
		{"extension", "list"},
		{"extension", "verify"},
		{"procevent", "list"},
		{"procevent", "inbox"},
		{"doctor"},
		nil, // register-extension of a fresh id
	}
	var listed atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; !stop.Load(); n++ {
			args := listings[n%len(listings)]
			if args == nil {
				args = []string{"procevent", "register-extension", fakeAdapter, fmt.Sprintf("r%d", n), "--config-ref", "ref"}
			}
			r := w.fm(nil, args...)
			commands.Add(1)
			listed.Add(1)
			if r.code != 0 {
				fail("listing", r)
			}
		}
	}()
	// The run lasts d, and on a loaded machine longer, until every listing
	// verb ran at least twice during rebinding and polling (at most 5
	// minutes more).
	enough := func() bool {
		return polls.Load() > 1 && rebinds.Load() > 1 && listed.Load() >= 2*int64(len(listings))
	}
	time.Sleep(d - time.Since(began))
	for end := time.Now().Add(5 * time.Minute); !enough() && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()

	if rs := w.inbox(); len(rs) != 0 {
		t.Errorf("[OP-3] the inbox holds %d results after polls that all answered no-result: %+v", len(rs), rs[0])
	}
	report := fmt.Sprintf("churn: %s, %d commands run (%d rebinds of unrelated bindings, %d polls, %d listings), %d captures, %d evidence captured without a package fault, %d listing or poll failures",
		time.Since(began).Round(time.Second), commands.Load(), rebinds.Load(), polls.Load(), listed.Load(), captures, blamed, len(failures))
	t.Log(report)
	if testing.Verbose() {
		fmt.Println(report)
	}
	for _, f := range failures {
		t.Error(f)
	}
	if !enough() {
		t.Errorf("too little churn to prove anything: %s", report)
	}
}
