package docker

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/moby/moby/api/types/container"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// readyPoll is the period of the readiness checks after a start.
const readyPoll = 250 * time.Millisecond

// readyState is an instance's readiness since its last start.
type readyState struct {
	ready  bool
	cancel context.CancelFunc
}

func (r *Runtime) isReady(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := r.ready[id]
	return rs != nil && rs.ready
}

// resetReady forgets readiness (a start, an exit) and stops its watcher.
func (r *Runtime) resetReady(id string) {
	r.forgetReady(id)
}

func (r *Runtime) forgetReady(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rs := r.ready[id]; rs != nil {
		rs.cancel()
		delete(r.ready, id)
	}
}

// watchReady checks the instance's readiness until it passes (then marks
// it Ready and emits EventReady) or the container stops running.
func (r *Runtime) watchReady(id string) {
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	if old := r.ready[id]; old != nil {
		old.cancel()
	}
	rs := &readyState{cancel: cancel}
	r.ready[id] = rs
	r.mu.Unlock()
	go func() {
		defer cancel()
		for {
			ins, err := r.inspect(ctx, "probe", id)
			if err != nil || ins.State == nil || !ins.State.Running {
				return
			}
			if r.check(ctx, ins) == nil {
				r.mu.Lock()
				current := r.ready[id] == rs
				if current {
					rs.ready = true
				}
				r.mu.Unlock()
				if current {
					r.emit(runtime.Event{ID: id, Kind: runtime.EventReady, At: time.Now()})
				}
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(readyPoll):
			}
		}
	}()
}

// Probe is one health check: the container runs and, with a readiness
// port, answers on it (HTTP 2xx/3xx on the readiness path when one is
// set).
func (r *Runtime) Probe(ctx context.Context, id string) error {
	ins, err := r.inspect(ctx, "probe", id)
	if err != nil {
		return err
	}
	if ins.State == nil || !ins.State.Running {
		return fmt.Errorf("probe %s: container is not running", id)
	}
	if err := r.check(ctx, ins); err != nil {
		return fmt.Errorf("probe %s: %w", id, err)
	}
	return nil
}

// check runs the spec's readiness check once against a running container.
func (r *Runtime) check(ctx context.Context, ins container.InspectResponse) error {
	spec := r.status(ins).Spec
	rd := spec.Readiness
	if rd.TCPPort == 0 {
		return nil
	}
	hp := r.hostPort(ins, rd.TCPPort)
	if hp == 0 {
		return fmt.Errorf("readiness port %d is not published", rd.TCPPort)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(hp))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if rd.HTTPPath == "" {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+rd.HTTPPath, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", rd.HTTPPath, resp.Status)
	}
	return nil
}
