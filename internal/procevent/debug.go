package procevent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/host"
	"firstmate.dev/fm/internal/protocol"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// The operator's debug log of a source [STAT-6].
//
// Only where the operator turned it on (fm procevent debug <id> on, which
// creates the marker <state>/procevent-status/<id>.debug), a runner pass of
// an extension source keeps the package's stderr of its invocations (at most
// wire.MaxStderrBytes each, as the host bounds it) and, when the pass
// failed, appends it to <id>.stderr in the same 0700 directory (0600): one
// line per stderr line, `<time> stderr[<verb>]: <line as a Go quoted ASCII
// string>`, so no control byte, escape sequence or invalid UTF-8 reaches a
// terminal that shows it, then `<time> stderr[<verb>] cut: <n> bytes
// written` when the package wrote more than was kept; and the diagnostic of
// an ok=false answer as `<time> diagnostic[<code>]: <quoted>` (with
// ` (retryable)` after the code when the package said so). When the log would pass
// maxDebugLog it is rotated: the old one becomes <id>.stderr.1 (replacing
// the one before). Nothing of it enters evidence, a wake, the history or any
// output of fm: it is the operator's own file, turned on per source.

const (
	debugSuffix  = ".debug"
	stderrSuffix = ".stderr"
	maxDebugLog  = 64 << 10
)

// SetDebug turns the debug log of source id on or off; on needs the source
// registered. It reports the path of the log.
func SetDebug(h *home.Home, id string, on bool) (string, error) {
	if err := protocol.CheckSourceID(id); err != nil {
		return "", err
	}
	d, err := openDirs(h, false, on)
	if err == errAbsent {
		return "", missing(id)
	}
	if err != nil {
		return "", err
	}
	defer d.close()
	if on {
		if d.reg == nil {
			return "", missing(id)
		}
		if _, err := readRegistration(d.reg, id); err != nil {
			return "", err
		}
	}
	dir, err := d.child(healthDir(h), on)
	if err == errAbsent {
		return "", nil // off, and never on
	}
	if err != nil {
		return "", err
	}
	defer dir.Close()
	log := dir.Name() + "/" + id + stderrSuffix
	if !on {
		return log, fsutil.RemoveAt(dir, id+debugSuffix)
	}
	if err := fsutil.ReplaceAt(dir, id+debugSuffix, []byte("on\n")); err != nil {
		return "", err
	}
	return log, nil
}

// Debugging reports whether the debug log of source id is on in the status
// directory dir.
func debugging(dir *os.File, id string) bool {
	return dir != nil && fsutil.ExistsAt(dir, id+debugSuffix)
}

// stderrLog collects the stderr of one pass's invocations.
type stderrLog struct {
	mu    sync.Mutex
	lines []string
}

// collect is the host.StderrFunc of a pass with debugging on.
func (l *stderrLog) collect() host.StderrFunc {
	return func(verb string, kept []byte, total int64) {
		l.mu.Lock()
		defer l.mu.Unlock()
		now := stamp(time.Now())
		for _, line := range strings.SplitAfter(string(kept), "\n") {
			if line != "" {
				l.lines = append(l.lines, fmt.Sprintf("%s stderr[%s]: %s\n", now, verb, strconv.QuoteToASCII(strings.TrimSuffix(line, "\n"))))
			}
		}
		if total > int64(len(kept)) {
			l.lines = append(l.lines, fmt.Sprintf("%s stderr[%s] cut: %d bytes written, the first %d kept\n", now, verb, total, len(kept)))
		}
	}
}

// diagnostic is the host.DiagnosticFunc of a pass with debugging on.
func (l *stderrLog) diagnostic() host.DiagnosticFunc {
	return func(code wire.Code, retryable bool, diagnostic string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		retry := ""
		if retryable {
			retry = " (retryable)"
		}
		l.lines = append(l.lines, fmt.Sprintf("%s diagnostic[%s]%s: %s\n", stamp(time.Now()), code, retry, strconv.QuoteToASCII(diagnostic)))
	}
}

// call is the host.Call of a poll of a pass: its request id, and with
// debugging on (l not nil) the collectors of its stderr and diagnostic.
func (l *stderrLog) call(requestID string) host.Call {
	c := host.Call{RequestID: requestID}
	if l != nil {
		c.Stderr, c.Diagnostic = l.collect(), l.diagnostic()
	}
	return c
}

// save appends what was collected to the log of id in dir, rotating it.
func (l *stderrLog) save(dir *os.File, id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 0 {
		return nil
	}
	add := strings.Join(l.lines, "")
	if len(add) > maxDebugLog {
		add = add[len(add)-maxDebugLog:]
	}
	old, err := fsutil.ReadPrivateAt(dir, id+stderrSuffix, maxDebugLog)
	switch {
	case os.IsNotExist(err):
		old = nil
	case err != nil:
		return errcode.Wrap(errcode.Of(err), err, "debug log of %q", id)
	}
	if len(old)+len(add) > maxDebugLog {
		if err := fsutil.ReplaceAt(dir, id+stderrSuffix+".1", old); err != nil {
			return err
		}
		old = nil
	}
	return fsutil.ReplaceAt(dir, id+stderrSuffix, append(old, add...))
}
