package launch

import (
	"errors"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
)

// PIDAlive reports whether a process with this pid runs now (a zombie does
// not: it never runs again). A pid alone names no exact process: it may have
// been reused since it was recorded. Use it only to refuse conservatively
// (fm home import refuses while a pid recorded by the earlier implementation
// is alive), never to prove ownership; records fm writes carry the full
// identity (alive).
func PIDAlive(pid int) (bool, error) {
	if pid <= 0 {
		return false, nil
	}
	st, err := procstat.Read(pid)
	if errors.Is(err, procstat.ErrNoProcess) {
		return false, nil
	}
	if err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "read process %d", pid)
	}
	return !st.Dead(), nil
}

// IsRecordName reports whether name is one fm writes in an invocation
// records directory: an owner record <hex>.owner.json (80 hex digits, or 64
// as versions before the source index named them) or the temporary file
// .<hex>.<pid>-<start>.tmp of one. Anything else there was written
// by someone else (the earlier Firstmate implementation's records, for
// instance), and the listing refuses it.
func IsRecordName(name string) bool {
	_, _, temp := parseTempName(name)
	return recordHex(name) != "" || temp
}
