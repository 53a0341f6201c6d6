package bench

// The storm probe: the reconnect storm's operator client and readiness
// poll, run as a process of their own. In the harness process they shared
// a Go scheduler with thousands of simulated agents in the middle of their
// handshakes, so their calls waited behind the agents' goroutines: the
// harness saw the new server ready 4-6 s after the kill when curl from a
// shell saw it within 0.2 s. The operating system schedules the probe's
// threads fairly against the harness and the server, so its figures are
// the server's, not the harness's queueing.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// ProbeEvent is one call of the storm probe (a JSON line on its stdout).
type ProbeEvent struct {
	At    int64   `json:"at_ns"`           // Unix ns when the call began
	Ready bool    `json:"ready,omitempty"` // GET /readyz (else GET /api/v1/hosts/{id})
	Ms    float64 `json:"ms"`
	OK    bool    `json:"ok"` // answered 200
}

// Probe (loopback only) calls opURL/readyz and then reads one of the hosts
// (GET /api/v1/hosts/{id}) with token, in a loop (10 ms apart, 50 ms after
// a failure), writing one ProbeEvent per call to w, until ctx ends. The
// first /readyz answered 200 after a kill is the restarted server's.
func Probe(ctx context.Context, opURL, token string, hosts []string, w io.Writer) error {
	if len(hosts) == 0 {
		return errors.New("storm probe: no host to read")
	}
	if !isLoopbackURL(opURL) {
		return fmt.Errorf("storm probe: %s is not a loopback address; the harness only targets loopback", opURL)
	}
	op := newOpClient(opURL, token)
	defer op.hc.CloseIdleConnections()
	enc := json.NewEncoder(w)
	emit := func(t time.Time, ready, ok bool) error {
		return enc.Encode(ProbeEvent{At: t.UnixNano(), Ready: ready, Ms: ms(time.Since(t)), OK: ok})
	}
	for i := 0; ctx.Err() == nil; i++ {
		t := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ready := getOK(rctx, op.hc, opURL+"/readyz")
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err := emit(t, true, ready); err != nil {
			return err
		}
		t = time.Now()
		rctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		err := op.call(rctx, http.MethodGet, "/api/v1/hosts/"+hosts[i%len(hosts)], nil, nil)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err := emit(t, false, err == nil); err != nil {
			return err
		}
		if err != nil || !ready {
			sleep(ctx, 50*time.Millisecond)
		} else {
			sleep(ctx, 10*time.Millisecond)
		}
	}
	return nil
}

func getOK(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// probeProc is a running `drover bench storm-probe` child and the events
// it has written.
type probeProc struct {
	cmd  *exec.Cmd
	done sync.WaitGroup

	mu     sync.Mutex
	events []ProbeEvent
	err    error
}

// startProbe runs exe (a drover binary) as the storm probe against the
// target's operator API, reading hosts; the token goes in its environment,
// not its arguments.
func startProbe(exe, opURL, token string, hosts []string) (*probeProc, error) {
	cmd := exec.Command(exe, "bench", "storm-probe", "--api", opURL, "--hosts", strings.Join(hosts, ","))
	cmd.Env = append(os.Environ(), "DROVER_TOKEN="+token)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the storm probe: %w", err)
	}
	p := &probeProc{cmd: cmd}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev ProbeEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				p.mu.Lock()
				p.err = fmt.Errorf("storm probe: %q: %w", sc.Text(), err)
				p.mu.Unlock()
				continue
			}
			p.mu.Lock()
			p.events = append(p.events, ev)
			p.mu.Unlock()
		}
	}()
	return p, nil
}

// stop ends the probe and returns every event it wrote.
func (p *probeProc) stop() ([]ProbeEvent, error) {
	_ = p.cmd.Process.Kill()
	p.done.Wait()
	_ = p.cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.events, p.err
}

// probeFigures are the storm figures taken from the probe's events: the
// seconds from t0 to the first 200 from /readyz (-1: none), and the host
// reads begun after t0 (answered ones into op).
func probeFigures(events []ProbeEvent, t0 time.Time, op *recorder) (readyS float64, fails int64) {
	readyS = -1
	for _, ev := range events {
		at := time.Unix(0, ev.At)
		if at.Before(t0) {
			continue
		}
		switch {
		case ev.Ready && ev.OK && readyS < 0:
			readyS = secs(at.Add(time.Duration(ev.Ms * float64(time.Millisecond))).Sub(t0))
		case ev.Ready:
		case ev.OK:
			op.add(time.Duration(ev.Ms * float64(time.Millisecond)))
		default:
			fails++
		}
	}
	return readyS, fails
}
