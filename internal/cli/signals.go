package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/launch"
)

// Signals and a closed stdout ([GRP-2], [RUN-2]).
//
// fm stops the same way on SIGTERM, SIGINT, SIGHUP (a closed terminal or
// ssh session) and SIGQUIT (Ctrl-\): the verb's context is cancelled, every
// running invocation's exact process group is stopped and proved gone by the
// launch supervision, and only then does fm exit. A hangup that killed fm outright would leave
// its long polls running unsupervised and their owner records behind. A
// SIGHUP that was ignored when fm started (nohup) stays ignored: that
// operator asked fm to outlive the terminal. A SIGQUIT ignored at start
// cannot be told apart: the Go runtime installs its own handler for QUIT
// whatever disposition it inherits (it keeps an inherited SIG_IGN only for
// HUP and INT), so signal.Ignored reports false and fm stops cleanly on it,
// as it does on a QUIT that is not ignored, never with Go's stack dump.
//
// A write to a closed pipe on fd 1 or 2 raises SIGPIPE, which kills a Go
// program outright. fm asks for SIGPIPE instead (signal.Notify, not
// signal.Ignore: an ignored disposition would be inherited by every package
// it starts), so such a write fails with EPIPE. For a streaming verb (serve,
// wake watch, fm on) a stdout that is closed is the reader saying stop: the
// verb's context is cancelled with errStdoutClosed when a write fails with
// EPIPE, or as soon as the pipe or socket reports that its reader is gone
// (poll: POLLERR/POLLHUP), even while nothing is written (`fm procevent serve
// | head -1` during a long poll). The verb then stops like on TERM and fm
// exits 0 with nothing more to say. A verb that buffers its output writes it
// after its groups are gone; a failed final write changes nothing.

// errStdoutClosed is the cancellation cause of a streaming verb whose reader
// went away.
var errStdoutClosed = errors.New("stdout was closed")

// stopSignals are the signals that stop fm cleanly: TERM, INT, and HUP and
// QUIT unless they are ignored (signal.Notify would stop ignoring them; an
// inherited SIG_IGN is seen for HUP only, see above).
// QUIT (Ctrl-\ on a terminal) would otherwise make the Go runtime exit at
// once with a stack dump, leaving the running groups unsupervised.
func stopSignals() []os.Signal {
	sigs := []os.Signal{syscall.SIGTERM, syscall.SIGINT}
	for _, sig := range []os.Signal{syscall.SIGHUP, syscall.SIGQUIT} {
		if !signal.Ignored(sig) {
			sigs = append(sigs, sig)
		}
	}
	return sigs
}

// signalContext returns the context of one fm run: cancelled on a stop
// signal, or by its cancel function (with a cause). SIGPIPE is taken for the
// run's duration, so writes to a closed stdout or stderr return EPIPE.
//
// The signals are caught by a goroutine, alongside the rest of fm's
// start-up: catching them takes ~0.3 ms (the runtime hands each to a
// dedicated thread and waits for it; docs/performance.md, "Seventh
// pass"). Until then a stop signal ends fm outright, as a crash would,
// which is harmless while no package code runs; launch holds every
// launch until they are caught (launch.AfterSignals), and fm writes
// nothing to its stdout or stderr before (afterSignals): a write to a
// closed pipe must fail with EPIPE, never end fm. The returned channel is
// closed once they are caught. With restore, the returned stop gives the
// signals their dispositions back before it returns; without, they stay
// caught (for a process about to exit).
func signalContext(restore bool) (context.Context, context.CancelCauseFunc, <-chan struct{}, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	caught := make(chan struct{})
	launch.AfterSignals(caught)
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		stops, pipe := make(chan os.Signal, 1), make(chan os.Signal, 1)
		signal.Notify(stops, stopSignals()...)
		signal.Notify(pipe, syscall.SIGPIPE)
		close(caught)
		select {
		case sig := <-stops:
			// Caught until stop: a second signal does not end fm
			// while it stops its groups.
			cancel(fmt.Errorf("%v signal received", sig))
			<-done
		case <-done:
		}
		if restore {
			signal.Stop(pipe)
			signal.Stop(stops)
		}
	}()
	return ctx, cancel, caught, func() {
		cancel(nil)
		close(done)
		if restore {
			<-ended
		}
	}
}

// afterSignals returns w, writing only once caught is closed (see
// signalContext).
func afterSignals(w io.Writer, caught <-chan struct{}) io.Writer {
	return &signalsFirst{w: w, caught: caught}
}

// signalsFirst is a writer that waits until the stop signals are caught.
type signalsFirst struct {
	w      io.Writer
	caught <-chan struct{}
}

func (s *signalsFirst) Write(p []byte) (int, error) {
	<-s.caught
	return s.w.Write(p)
}

// stdoutGuard is a streaming verb's stdout: a write that fails with EPIPE
// cancels the verb.
type stdoutGuard struct {
	w      io.Writer
	cancel context.CancelCauseFunc
}

func (g *stdoutGuard) Write(p []byte) (int, error) {
	n, err := g.w.Write(p)
	if errors.Is(err, syscall.EPIPE) {
		g.cancel(errStdoutClosed)
	}
	return n, err
}

// watchReader cancels with errStdoutClosed when w is a pipe or a socket
// whose reading end is closed, without writing to it. It returns the
// function that ends the watch (and waits for it). Anything else (a file, a
// terminal, a buffer) is not watched: a terminal's hangup comes as SIGHUP.
func watchReader(w io.Writer, cancel context.CancelCauseFunc) func() {
	if s, ok := w.(*signalsFirst); ok {
		w = s.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return func() {}
	}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO && st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return func() {}
	}
	var wake [2]int
	if unix.Pipe2(wake[:], unix.O_CLOEXEC) != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer unix.Close(wake[0])
		fds := []unix.PollFd{{Fd: int32(f.Fd())}, {Fd: int32(wake[0]), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err == nil && fds[1].Revents == 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
				cancel(errStdoutClosed)
			}
			return
		}
	}()
	return func() {
		unix.Close(wake[1])
		<-done
	}
}
