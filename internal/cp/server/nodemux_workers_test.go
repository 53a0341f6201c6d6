package server

import (
	"testing"
	"time"
)

// blocking is a request that runs until released, reporting who ran it.
type blocking struct {
	started chan struct{}
	release chan struct{}
}

func (b blocking) serve() {
	close(b.started)
	<-b.release
}

func newBlocking() blocking {
	return blocking{started: make(chan struct{}), release: make(chan struct{})}
}

// TestStreamWorkersNeverQueue: a request that finds every worker busy (in
// a handler that blocks) runs at once on a goroutine of its own, and a
// worker whose request ended serves the next.
func TestStreamWorkersNeverQueue(t *testing.T) {
	w := newStreamWorkers(1)
	t.Cleanup(w.close)
	started := func(b blocking, what string) {
		t.Helper()
		select {
		case <-b.started:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not start", what)
		}
	}
	// Straight to the worker, once it is idle: a request it takes never
	// spawns.
	toWorker := func(b blocking, what string) {
		t.Helper()
		select {
		case w.streams <- b:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the worker never took it", what)
		}
	}
	first := newBlocking()
	toWorker(first, "the first request")
	started(first, "the first request")
	second := newBlocking()
	w.serve(second) // the only worker is busy
	started(second, "a request while every worker is busy")
	close(first.release)
	close(second.release)

	third := newBlocking()
	toWorker(third, "a request after the worker's first one ended") // the worker is back
	started(third, "the worker's next request")
	close(third.release)
}
