// Package freshlook shares one look at changing state (a /proc file, a
// listing) among concurrent callers without ever handing a caller an
// answer older than its question.
//
// Rule: a caller gets the answer of a look that started after it asked,
// which is as fresh as a look of its own would be; if the latest look
// started before it asked, the caller waits for that look to end and then
// joins or starts a fresh one. So a thousand concurrent callers make a
// couple of looks, not a thousand, and each answer is still one a caller
// could have made itself. A look in progress is not held under the mutex:
// its callers wait on its done channel, which wakes them all at once.
package freshlook

import (
	"sync"
	"sync/atomic"
)

// Look shares the looks of one kind; its zero value is ready.
type Look[T any] struct {
	mu   sync.Mutex
	asks atomic.Uint64
	last *look[T]
	// After, when set (by tests), runs between a look and the
	// publication of its answer, to hold a look in progress.
	After func()
}

type look[T any] struct {
	started uint64 // the ask count when it started
	done    chan struct{}
	answer  T // set before done is closed
}

func (l *look[T]) finished() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// Get returns the answer of a look by do that started after this call
// began (see the package rule).
func (s *Look[T]) Get(do func() T) T {
	asked := s.asks.Add(1)
	for {
		s.mu.Lock()
		l := s.last
		if l != nil && l.started > asked {
			s.mu.Unlock()
			<-l.done
			return l.answer
		}
		if l != nil && !l.finished() {
			// Started before this caller asked: too old to answer it;
			// wait for it to end, then join or start a fresh one.
			s.mu.Unlock()
			<-l.done
			continue
		}
		l = &look[T]{started: s.asks.Add(1), done: make(chan struct{})}
		s.last = l
		s.mu.Unlock()
		l.answer = do()
		if s.After != nil {
			s.After()
		}
		close(l.done)
		return l.answer
	}
}
