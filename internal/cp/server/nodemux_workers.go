package server

import (
	"runtime"
	"sync"
)

// streamWorkers serve framed requests on goroutines kept between requests.
// A new goroutine per request starts with a small stack and grows it in
// the handler, every time (runtime.newstack under the host cache's read:
// ≈ 2.7 % of the server's CPU at 25,000 heartbeats/s, docs/performance.md);
// a worker keeps the stack it grew. gRPC-Go's server workers
// (NumStreamWorkers) do the same. A request that finds no idle worker gets
// a goroutine of its own, so a worker held by a handler that blocks never
// delays another request.
type streamWorkers struct {
	streams chan servable
	stop    chan struct{}
	once    sync.Once
}

// servable is what a worker runs: a *muxStream.
type servable interface{ serve() }

// workersPerProc is the number of workers per GOMAXPROCS: more than run
// at once, fewer than an idle fleet's stacks would cost.
const workersPerProc = 4

// newStreamWorkers starts n workers (0: workersPerProc per GOMAXPROCS).
func newStreamWorkers(n int) *streamWorkers {
	if n <= 0 {
		n = workersPerProc * runtime.GOMAXPROCS(0)
	}
	w := &streamWorkers{streams: make(chan servable), stop: make(chan struct{})}
	for range n {
		go w.run()
	}
	return w
}

func (w *streamWorkers) run() {
	for {
		select {
		case st := <-w.streams:
			st.serve()
		case <-w.stop:
			return
		}
	}
}

// serve hands st to an idle worker, or else to a goroutine of its own.
func (w *streamWorkers) serve(st servable) {
	select {
	case w.streams <- st:
	default:
		go st.serve()
	}
}

// close ends the idle workers; busy ones end with their request.
func (w *streamWorkers) close() { w.once.Do(func() { close(w.stop) }) }
