package cli

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/pkgtree"
)

// isTerminal reports whether w is a terminal: an *os.File on which the
// terminal attributes can be read.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// A package with fewer files and fewer bytes than these is scanned in a
// blink and shows no progress; progressEvery is how often the line is
// redrawn at most.
const (
	progressMinFiles = 512
	progressMinBytes = 4 << 20
	progressEvery    = 100 * time.Millisecond
)

// withProgress points *hook at a progress line drawn on stderr when stderr
// is a terminal, and returns the function that erases the line; call it
// before anything else is printed. Otherwise it changes nothing: progress is
// for people watching a terminal, never part of a command's output.
func (e *Env) withProgress(hook *pkgtree.Progress) (erase func()) {
	if !e.ttyErr {
		return func() {}
	}
	l := &progressLine{w: e.Stderr}
	*hook = l.update
	return l.erase
}

// progressLine is one line rewritten in place with a carriage return, such
// as "hashing 1,234/4,096 files, 40/64 MiB".
type progressLine struct {
	w     io.Writer
	last  time.Time
	width int
}

// update is a pkgtree.Progress. The start and the end of every stage are
// always drawn; the steps between at most every progressEvery.
func (l *progressLine) update(stage string, files, totalFiles int, bytes, totalBytes int64) {
	if totalFiles < progressMinFiles && totalBytes < progressMinBytes {
		return
	}
	if files != 0 && files != totalFiles && time.Since(l.last) < progressEvery {
		return
	}
	l.last = time.Now()
	l.draw(fmt.Sprintf("%s %s/%s files, %s", stage, thousands(int64(files)), thousands(int64(totalFiles)), ofSize(bytes, totalBytes)))
}

// draw replaces the line with s, blanking what is left of a longer one.
func (l *progressLine) draw(s string) {
	fmt.Fprintf(l.w, "\r%s%s", s, strings.Repeat(" ", max(l.width-len(s), 0)))
	l.width = len(s)
}

// erase blanks the line and returns the cursor to its start.
func (l *progressLine) erase() {
	if l.width > 0 {
		fmt.Fprintf(l.w, "\r%s\r", strings.Repeat(" ", l.width))
		l.width = 0
	}
}

// thousands formats n with commas between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ofSize formats "done/total unit" in whole MiB, or KiB for a total under
// one MiB.
func ofSize(done, total int64) string {
	unit, shift := "MiB", 20
	if total < 1<<20 {
		unit, shift = "KiB", 10
	}
	return fmt.Sprintf("%s/%s %s", thousands(done>>shift), thousands(total>>shift), unit)
}

// stampNow is the time a daemon line begins with: RFC 3339, UTC.
func stampNow() string { return time.Now().UTC().Format(time.RFC3339) }

// elapsedAfter is how long a command runs before elapsed shows its clock.
const elapsedAfter = 2 * time.Second

// elapsed shows "<what>: <n>s" on stderr, redrawn every second, while a
// long command runs, when stderr is a terminal; it returns the function
// that stops and erases it. Otherwise it shows nothing.
func (e *Env) elapsed(what string) (stop func()) {
	if !e.ttyErr {
		return func() {}
	}
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		l := &progressLine{w: e.Stderr}
		defer l.erase()
		began := time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if d := time.Since(began); d >= elapsedAfter {
					l.draw(fmt.Sprintf("%s: %ds", what, int(d.Seconds())))
				}
			}
		}
	}()
	return func() { close(done); <-ended }
}
