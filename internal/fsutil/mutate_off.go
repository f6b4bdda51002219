//go:build !powercut_mutate

package fsutil

// dropped reports whether the fsync at call site site is left out: never,
// outside the power-loss sweep's mutation build (mutate_on.go).
func dropped(site string) bool { return false }
