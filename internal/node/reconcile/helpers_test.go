package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fastOpts keeps every deadline in milliseconds.
func fastOpts() Options {
	return Options{
		Interval:           5 * time.Millisecond,
		BackoffBase:        5 * time.Millisecond,
		BackoffMax:         40 * time.Millisecond,
		CrashLoopThreshold: 3,
		CrashLoopWindow:    time.Minute,
		Log:                quiet,
	}
}

func desired(id string, gen int64) api.DesiredInstance {
	return api.DesiredInstance{
		ID:           id,
		Name:         "name-" + id,
		Generation:   gen,
		DesiredState: api.DesiredRunning,
		Spec: api.InstanceSpec{
			Image:           api.Artifact{URL: "file:///images/tiny.qcow2", SHA256: "ab"},
			VCPUs:           1,
			MemoryMiB:       256,
			DiskGiB:         2,
			Readiness:       api.Readiness{Timeout: api.Duration(2 * time.Second)},
			GracefulTimeout: api.Duration(time.Second),
		},
	}
}

func with(d api.DesiredInstance, state api.DesiredState) api.DesiredInstance {
	d.DesiredState = state
	return d
}

// recorder is a Reporter that keeps every attempt and every successful
// report; fail, when set, decides whether an attempt fails.
type recorder struct {
	mu       sync.Mutex
	ok       map[string][]api.InstanceStatusReport
	attempts map[string][]api.InstanceStatusReport
	fail     func(id string, r api.InstanceStatusReport) error
}

func newRecorder() *recorder {
	return &recorder{ok: map[string][]api.InstanceStatusReport{}, attempts: map[string][]api.InstanceStatusReport{}}
}

func (r *recorder) ReportStatus(ctx context.Context, id string, rep api.InstanceStatusReport) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts[id] = append(r.attempts[id], rep)
	if r.fail != nil {
		if err := r.fail(id, rep); err != nil {
			return err
		}
	}
	r.ok[id] = append(r.ok[id], rep)
	return nil
}

func (r *recorder) setFail(f func(id string, r api.InstanceStatusReport) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = f
}

func (r *recorder) reports(id string) []api.InstanceStatusReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ok[id])
}

// seq renders id's successful reports as "Phase" or "Phase/reason".
func (r *recorder) seq(id string) []string { return render(r.reports(id)) }

func (r *recorder) attemptSeq(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return render(r.attempts[id])
}

func render(reps []api.InstanceStatusReport) []string {
	out := make([]string, 0, len(reps))
	for _, rep := range reps {
		s := string(rep.Phase)
		if rep.ReasonCode != "" {
			s += "/" + string(rep.ReasonCode)
		}
		out = append(out, s)
	}
	return out
}

// harness runs a Reconciler over a mock runtime until the test ends.
type harness struct {
	t   *testing.T
	rt  *mock.Runtime
	rep *recorder
	rec *Reconciler
	end func() // stops Run and waits for it
}

func startHarness(t *testing.T, rt *mock.Runtime, rep *recorder, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, rt: rt, rep: rep, rec: New(rt, rep, opts)}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- h.rec.Run(ctx) }()
	var once sync.Once
	h.end = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run returned %v, want context.Canceled", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("Run did not return within 5s of its context ending")
			}
		})
	}
	t.Cleanup(h.end)
	return h
}

func newHarness(t *testing.T, opts Options) *harness {
	return startHarness(t, mock.New(mock.Options{Log: quiet}), newRecorder(), opts)
}

// waitSeq waits until id's successful reports are exactly want.
func (h *harness) waitSeq(id string, want ...string) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("%s reports %v", id, want), func() bool { return slices.Equal(h.rep.seq(id), want) },
		func() string { return fmt.Sprint(h.rep.seq(id)) })
}

// waitPrefix waits until id's successful reports start with want.
func (h *harness) waitPrefix(id string, want ...string) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("%s reports starting %v", id, want), func() bool {
		got := h.rep.seq(id)
		return len(got) >= len(want) && slices.Equal(got[:len(want)], want)
	}, func() string { return fmt.Sprint(h.rep.seq(id)) })
}

// waitLast waits until id's last successful report is want and returns the
// number of reports so far.
func (h *harness) waitLast(id, want string) int {
	h.t.Helper()
	var n int
	waitFor(h.t, fmt.Sprintf("%s last report %s", id, want), func() bool {
		got := h.rep.seq(id)
		n = len(got)
		return n > 0 && got[n-1] == want
	}, func() string { return fmt.Sprint(h.rep.seq(id)) })
	return n
}

// settle lets many resync ticks pass.
func settle() { time.Sleep(100 * time.Millisecond) }

func waitFor(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; have %s", what, state())
		}
		time.Sleep(2 * time.Millisecond)
	}
}
