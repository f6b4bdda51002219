package procevent

import (
	"context"
	"fmt"
	"os"
	"time"

	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/wake"
)

// Announcement [CAP-2].
//
// A captured result is announced by one "check" wake with key
// procevent:<source-id>:<seq> and payload
// "check: procevent <adapter> <source-id> <seq>"; the output text never
// enters the queue. The runner announces right after the capture (and after
// the silent verdict). Results that stay unhandled are announced again by
// reconcile and serve under one rule, so re-announcement is a reminder and
// never a flood:
//
//	an unhandled result is re-announced when neither its capture nor the
//	latest check wake with its key is younger than the re-announce interval
//	(DefaultReannounce unless the operator chooses another).
//
// So two cycles in quick succession announce nothing twice, a result whose
// announcement was lost (a runner killed between capture and wake) gets its
// wake within one interval, and a result nobody handles is repeated once per
// interval. The rule reads only the queue, so it holds across restarts of
// serve.
//
// A result whose announcement its runner is still deciding is not a
// candidate [CAP-4]: the runner publishes <source-id>.<seq>.pending before
// the .result and removes it only once the decision is durable (the handled
// marker of a silent result, or the check wake), all while it holds the
// source's claim, and it may spend a verdict's whole timeout asking. So a
// result is skipped while its pending marker exists and the source's claim is
// held. A marker whose claim is free was left by a runner that died (or
// failed) before deciding: its result is a candidate like any other, so a
// crashed runner's result is still announced. (The next runner of the source
// removes such markers under its claim, so they cannot shelter a result
// behind a later runner's claim.) The runner makes its decision durable
// before it removes the marker, and removes the marker before it releases the
// claim; here the handled marker is looked at again after the pending marker
// and the claim, and the queue is read last. So a decision completed while
// this runs is seen: the result is handled, or its wake is in the queue.

// WakeKind is the wake kind of an announcement.
const WakeKind = "check"

// DefaultReannounce is the default re-announce interval.
const DefaultReannounce = 10 * time.Minute

func wakeKey(id string, seq int64) string { return fmt.Sprintf("procevent:%s:%d", id, seq) }

func announce(ctx context.Context, state *os.File, m *Meta) error {
	_, err := wake.Append(ctx, state, WakeKind, wakeKey(m.SourceID, m.Sequence),
		fmt.Sprintf("check: procevent %s %s %d", m.Adapter, m.SourceID, m.Sequence))
	return err
}

// reannounce applies the re-announce rule to every unhandled result and
// returns how many it announced. A result whose pending marker outlived its
// runner (killed, or failed to append its wake: a full disk) may never have
// been announced: it is announced now unless the queue holds a wake of it
// (its capture is younger than the interval, so any wake of it is too, and
// the backward read sees it), not one interval later, so the "reconcile
// announces it" that the failed runner printed holds as soon as the cause is
// fixed.
func (d *dirs) reannounce(ctx context.Context, interval time.Duration) (int, error) {
	if err := d.openInbox(false); err == errAbsent {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	if err := d.recheck(); err != nil {
		return 0, err
	}
	results, err := d.results()
	if err != nil {
		return 0, err
	}
	var due []*Meta
	undecided := map[*Meta]bool{}
	for i := range results {
		r := &results[i]
		if r.Handled {
			continue
		}
		deciding, err := d.deciding(r.SourceID, r.Sequence)
		if err != nil {
			return 0, err
		}
		if deciding || fsutil.ExistsAt(d.inbox, name(r.SourceID, r.Sequence, handledSuffix)) {
			continue
		}
		due = append(due, &r.Meta)
		undecided[&r.Meta] = fsutil.ExistsAt(d.inbox, name(r.SourceID, r.Sequence, pendingSuffix))
	}
	if len(due) == 0 {
		return 0, nil
	}
	// Only the wakes younger than the interval can spare a result: read the
	// queue backwards and stop at the first older one, so a pass reads the
	// queue's recent tail, never its whole history. Wakes are appended in
	// time order; should the clock have stepped back, a result is at worst
	// reminded of early.
	cutoff := time.Now().Add(-interval).Unix()
	young := map[string]bool{}
	want := map[string]bool{}
	for _, m := range due {
		if m.CapturedAt <= cutoff || undecided[m] {
			want[wakeKey(m.SourceID, m.Sequence)] = true
		}
	}
	if len(want) > 0 {
		err := wake.Recent(d.state.Name(), func(w wake.Wake) bool {
			if w.Time <= cutoff {
				return false
			}
			if w.Kind == WakeKind && want[w.Key] {
				young[w.Key] = true
			}
			return len(young) < len(want)
		})
		if err != nil {
			return 0, err
		}
	}
	n := 0
	for _, m := range due {
		if (m.CapturedAt > cutoff && !undecided[m]) || young[wakeKey(m.SourceID, m.Sequence)] {
			continue
		}
		if err := announce(ctx, d.state, m); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// deciding reports whether the runner that captured result seq of source id
// is still deciding its announcement: the pending marker exists and a live
// runner holds the source's claim. The claim is probed as fm doctor probes it
// (held): shared, without waiting, released at once.
func (d *dirs) deciding(id string, seq int64) (bool, error) {
	if d.reg == nil || !fsutil.ExistsAt(d.inbox, name(id, seq, pendingSuffix)) {
		return false, nil
	}
	busy, err := held(d.reg, id+claimSuffix)
	if err != nil || !busy {
		return false, err
	}
	// Held: still deciding, unless the decision completed meanwhile.
	return fsutil.ExistsAt(d.inbox, name(id, seq, pendingSuffix)), nil
}

// DefaultCompactWindow is how many of the latest wakes `fm wake compact`
// keeps by default, and serve's automatic compaction keeps.
const DefaultCompactWindow = 10000

// AutoCompactBytes is the queue size past which serve compacts it: about
// 200,000 wakes, twenty times what a compaction keeps, so serve compacts
// rarely and a pass over the queue stays a few tens of milliseconds.
const AutoCompactBytes = 16 << 20

// CompactWakes compacts h's wake queue (wake.Compact): it keeps the latest
// window wakes and, for every captured result that is still unhandled, the
// latest wake with its key, which the re-announce rule reads. An absent state
// root or queue is left as it is.
func CompactWakes(ctx context.Context, h *home.Home, window int) (wake.CompactResult, error) {
	d, err := openDirs(h, false, false)
	if err == errAbsent {
		return wake.CompactResult{}, nil
	}
	if err != nil {
		return wake.CompactResult{}, err
	}
	defer d.close()
	unhandled := map[string]bool{}
	switch err := d.openInbox(false); err {
	case errAbsent:
	case nil:
		results, err := d.results()
		if err != nil {
			return wake.CompactResult{}, err
		}
		for _, r := range results {
			if !r.Handled {
				unhandled[wakeKey(r.SourceID, r.Sequence)] = true
			}
		}
	default:
		return wake.CompactResult{}, err
	}
	return wake.Compact(ctx, d.state, window, func(key string) bool { return unhandled[key] })
}
