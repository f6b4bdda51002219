package procevent

import (
	"fmt"
	"os"
	"time"

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

// WakeKind is the wake kind of an announcement.
const WakeKind = "check"

// DefaultReannounce is the default re-announce interval.
const DefaultReannounce = 10 * time.Minute

func wakeKey(id string, seq int64) string { return fmt.Sprintf("procevent:%s:%d", id, seq) }

func announce(state *os.File, m *Meta) error {
	_, err := wake.Append(state, WakeKind, wakeKey(m.SourceID, m.Sequence),
		fmt.Sprintf("check: procevent %s %s %d", m.Adapter, m.SourceID, m.Sequence))
	return err
}

// reannounce applies the re-announce rule to every unhandled result and
// returns how many it announced.
func (d *dirs) reannounce(interval time.Duration) (int, error) {
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
	wakes, err := wake.List(d.state.Name(), 0)
	if err != nil {
		return 0, err
	}
	latest := map[string]int64{}
	for _, w := range wakes {
		if w.Kind == WakeKind {
			latest[w.Key] = max(latest[w.Key], w.Time)
		}
	}
	cutoff := time.Now().Add(-interval).Unix()
	n := 0
	for _, r := range results {
		if r.Handled || max(r.CapturedAt, latest[wakeKey(r.SourceID, r.Sequence)]) > cutoff {
			continue
		}
		if err := announce(d.state, &r.Meta); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
