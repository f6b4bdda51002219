//go:build powercut_mutate

package fsutil

import "os"

// dropped reports whether the fsync at call site site is left out: in the
// powercut_mutate build, the one site FM_POWERCUT_DROP names. The
// power-loss sweep's mutation proof (internal/reliability,
// TestPowerCutMutations) builds fm this way and requires that leaving out
// any one site makes the sweep fail. The sites are SyncSites.
func dropped(site string) bool { return os.Getenv("FM_POWERCUT_DROP") == site }
