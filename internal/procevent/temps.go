package procevent

import (
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
)

// StateTempDirs are the state directories in which runners write temps
// (fsutil.ReplaceAt: registrations, sequence counters, metas): the registry and the
// inbox.
func StateTempDirs(h *home.Home) []string { return []string{h.Registrations(), h.Inbox()} }

// sweepTemps removes the temps of killed writers from StateTempDirs. Writers
// of these directories hold different locks (the lifecycle lock, a source's
// claim), so no one lock proves a temp dead: each is removed only when its
// name proves its writer has exited (fsutil.TempDead), and a live runner's
// temp is kept. It returns how many it removed.
func sweepTemps(h *home.Home) (int, error) {
	n := 0
	for _, d := range StateTempDirs(h) {
		k, err := fsutil.SweepTemps(d, false)
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
