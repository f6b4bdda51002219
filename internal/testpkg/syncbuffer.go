package testpkg

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that a running process may write (as its
// stdout or stderr) while the test polls what it has written so far.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
