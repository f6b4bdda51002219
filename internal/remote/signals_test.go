package remote

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/launch"
)

// [XFER-4] [GRP-2] fm on starts the secondmate's command in a process group
// of its own, which only fm's stop-signal handling stops: a TERM that ended
// fm before it caught its stop signals would leave that command running
// unsupervised (as it did 32 times in 150 under GOMAXPROCS=1, TERM 0-4 ms
// after exec). So Run, like a launch, starts nothing until the process
// catches them (launch.AfterSignals), and gives up as interrupted when its
// context ends first. Not parallel: the gate is the process's.
func TestRunWaitsForSignals(t *testing.T) {
	caught := make(chan struct{})
	launch.AfterSignals(caught)
	defer func() { close(caught) }()
	root := t.TempDir()
	marker := filepath.Join(root, "started")
	if err := os.Mkdir(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "fm"), []byte("#!/bin/sh\n: >"+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Route{Home: t.TempDir(), Root: root}

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := Run(ctx, r, []string{"version"}, nil, 0)
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the secondmate's command started before the stop signals were caught (%v)", err)
	}
	cancel()
	err := <-errc
	if errcode.Of(err) != errcode.ProcessFailed {
		t.Fatalf("Run cancelled while waiting for the signals: %v, want process-failed", err)
	}
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the secondmate's command started after Run was cancelled (%v)", err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), r, []string{"version"}, nil, 0)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before the signals were caught", err)
	default:
	}
	close(caught)
	caught = make(chan struct{})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(marker); err != nil {
		t.Fatalf("the secondmate's command never ran once the signals were caught: %v", err)
	}
}
