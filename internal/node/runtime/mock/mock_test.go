package mock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func spec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Image: runtime.Image{URL: "file:///img", SHA256: "ab"}, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}, Owner: "test"}
}

func inspect(t *testing.T, m *Runtime, id string) runtime.Status {
	t.Helper()
	st, err := m.Inspect(context.Background(), id)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", id, err)
	}
	return st
}

func TestInjectedFailures(t *testing.T) {
	tests := []struct {
		name       string
		perID      bool // SetBehavior instead of SetDefaultBehavior
		b          Behavior
		wantCreate api.ReasonCode // "" = Create succeeds
		wantStart  api.ReasonCode // "" = Start succeeds
	}{
		{name: "create fails (per id, set before it exists)", perID: true, b: Behavior{CreateErr: api.ReasonImagePullFailed}, wantCreate: api.ReasonImagePullFailed},
		{name: "create fails (default)", b: Behavior{CreateErr: api.ReasonRootfsBuildFailed}, wantCreate: api.ReasonRootfsBuildFailed},
		{name: "start fails (per id)", perID: true, b: Behavior{StartErr: api.ReasonNetworkSetupFailed}, wantStart: api.ReasonNetworkSetupFailed},
		{name: "start fails (default)", b: Behavior{StartErr: api.ReasonFirecrackerStartFailed}, wantStart: api.ReasonFirecrackerStartFailed},
		{name: "healthy", b: Behavior{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			m := New(Options{})
			if tc.perID {
				m.SetBehavior("a", tc.b)
			} else {
				m.SetDefaultBehavior(tc.b)
			}
			_, err := m.Create(ctx, spec("a"))
			if got := runtime.ReasonOf(err, ""); got != tc.wantCreate {
				t.Fatalf("Create reason = %q (err %v), want %q", got, err, tc.wantCreate)
			}
			if tc.wantCreate != "" {
				var rerr *runtime.Error
				if !errors.As(err, &rerr) || rerr.Op != "create" || rerr.ID != "a" {
					t.Errorf("Create error = %#v, want a *runtime.Error for create a", err)
				}
				if _, err := m.Inspect(ctx, "a"); !errors.Is(err, runtime.ErrNotFound) {
					t.Errorf("after a failed Create, Inspect: %v, want ErrNotFound", err)
				}
				return
			}
			_, err = m.Start(ctx, "a")
			if got := runtime.ReasonOf(err, ""); got != tc.wantStart {
				t.Fatalf("Start reason = %q (err %v), want %q", got, err, tc.wantStart)
			}
			wantState := runtime.StateRunning
			if tc.wantStart != "" {
				wantState = runtime.StateCreated
			}
			if st := inspect(t, m, "a"); st.State != wantState {
				t.Errorf("state = %q, want %q", st.State, wantState)
			}
			// Another id is unaffected by a per-id behavior.
			if tc.perID {
				if _, err := m.Create(ctx, spec("b")); err != nil {
					t.Errorf("Create(b): %v", err)
				}
				if _, err := m.Start(ctx, "b"); err != nil {
					t.Errorf("Start(b): %v", err)
				}
			}
		})
	}
}

func TestReadiness(t *testing.T) {
	tests := []struct {
		name      string
		b         Behavior
		wantReady bool
	}{
		{name: "default", b: Behavior{}, wantReady: true},
		{name: "ReadyAfter", b: Behavior{ReadyAfter: 5 * time.Millisecond}, wantReady: true},
		{name: "NeverReady", b: Behavior{NeverReady: true}, wantReady: false},
		{name: "not yet", b: Behavior{ReadyAfter: time.Hour}, wantReady: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			m := New(Options{})
			m.SetBehavior("a", tc.b)
			events := m.Subscribe(ctx)
			if _, err := m.Create(ctx, spec("a")); err != nil {
				t.Fatal(err)
			}
			st, err := m.Start(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if st.Ready || st.PID == 0 || st.StartedAt.IsZero() {
				t.Errorf("Start status = {Ready:%v PID:%d StartedAt:%v}, want not ready, with a pid and start time", st.Ready, st.PID, st.StartedAt)
			}
			if ev := <-events; ev.Kind != runtime.EventStarted || ev.ID != "a" {
				t.Errorf("first event = %+v, want started a", ev)
			}
			if tc.wantReady {
				if ev := <-events; ev.Kind != runtime.EventReady || ev.ID != "a" {
					t.Errorf("second event = %+v, want ready a", ev)
				}
				if !inspect(t, m, "a").Ready {
					t.Error("Inspect after EventReady: not ready")
				}
				return
			}
			time.Sleep(3 * DefaultReadyAfter)
			if inspect(t, m, "a").Ready {
				t.Error("instance became ready, want not ready")
			}
			select {
			case ev := <-events:
				t.Errorf("unexpected event %+v", ev)
			default:
			}
		})
	}
}

func TestExits(t *testing.T) {
	tests := []struct {
		name       string
		exit       func(m *Runtime)
		wantState  runtime.State
		wantReason api.ReasonCode
		wantDetail string
	}{
		{name: "oom", exit: func(m *Runtime) { m.Crash("a", api.ReasonOOMKilled) }, wantState: runtime.StateCrashed, wantReason: api.ReasonOOMKilled, wantDetail: "crashed (injected)"},
		{name: "crash without reason", exit: func(m *Runtime) { m.Crash("a", "") }, wantState: runtime.StateCrashed, wantDetail: "crashed (injected)"},
		{name: "guest shutdown", exit: func(m *Runtime) { m.GuestShutdown("a") }, wantState: runtime.StateStopped, wantDetail: "guest shut down"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			m := New(Options{})
			m.SetBehavior("a", Behavior{ReadyAfter: 20 * time.Millisecond})
			events := m.Subscribe(ctx)
			if _, err := m.Create(ctx, spec("a")); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Start(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			<-events // started
			tc.exit(m)
			ev := <-events
			want := runtime.Event{ID: "a", Kind: runtime.EventExited, State: tc.wantState, Reason: tc.wantReason, Detail: tc.wantDetail}
			if d := cmp.Diff(want, ev, cmpIgnoreEventTimes); d != "" {
				t.Errorf("exit event (-want +got):\n%s", d)
			}
			st := inspect(t, m, "a")
			if st.State != tc.wantState || st.ExitReason != tc.wantReason || st.PID != 0 || st.ExitedAt.IsZero() {
				t.Errorf("status = {State:%q ExitReason:%q PID:%d ExitedAt:%v}, want {%q %q 0 set}", st.State, st.ExitReason, st.PID, st.ExitedAt, tc.wantState, tc.wantReason)
			}
			if m.Running() != nil {
				t.Errorf("Running() = %v, want none", m.Running())
			}
			// The pending readiness of the dead process never fires.
			time.Sleep(40 * time.Millisecond)
			select {
			case ev := <-events:
				t.Errorf("event after exit: %+v", ev)
			default:
			}
			// Exiting again is a no-op; a restart clears the exit.
			tc.exit(m)
			st, err := m.Start(ctx, "a")
			if err != nil || st.State != runtime.StateRunning || st.ExitReason != "" {
				t.Errorf("restart = {State:%q ExitReason:%q}, %v; want running, no exit reason", st.State, st.ExitReason, err)
			}
		})
	}
}

var cmpIgnoreEventTimes = cmp.Comparer(func(a, b time.Time) bool { return true })

func TestStop(t *testing.T) {
	tests := []struct {
		name     string
		ignore   bool
		cancel   bool
		wantHard bool
		wantErr  bool
	}{
		{name: "graceful"},
		{name: "guest ignores stop", ignore: true, wantHard: true},
		{name: "guest ignores stop, ctx ends", ignore: true, cancel: true, wantHard: true, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			m := New(Options{})
			m.SetBehavior("a", Behavior{IgnoreStop: tc.ignore})
			if _, err := m.Create(ctx, spec("a")); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Start(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			graceful := 30 * time.Millisecond
			stopCtx := ctx
			if tc.cancel {
				graceful = time.Hour
				c, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
				defer cancel()
				stopCtx = c
			}
			res, err := m.Stop(stopCtx, "a", graceful)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Stop error = %v, want error %v", err, tc.wantErr)
			}
			if res.HardStopped != tc.wantHard {
				t.Errorf("HardStopped = %v, want %v", res.HardStopped, tc.wantHard)
			}
			if tc.wantHard && !tc.cancel && res.Took < graceful {
				t.Errorf("Took = %v, want at least the graceful %v", res.Took, graceful)
			}
			if st := inspect(t, m, "a"); st.State != runtime.StateStopped || st.ExitReason != "" {
				t.Errorf("after Stop = {State:%q ExitReason:%q}, want stopped without a reason", st.State, st.ExitReason)
			}
			res, err = m.Stop(ctx, "a", graceful)
			if err != nil || res.HardStopped {
				t.Errorf("second Stop = %+v, %v; want a no-op", res, err)
			}
		})
	}
}

func TestProbe(t *testing.T) {
	ctx := testCtx(t)
	m := New(Options{})
	if err := m.Probe(ctx, "a"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Probe(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := m.Create(ctx, spec("a")); err != nil {
		t.Fatal(err)
	}
	if err := m.Probe(ctx, "a"); err == nil {
		t.Error("Probe(created) = nil, want an error")
	}
	if _, err := m.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Probe(ctx, "a"); err != nil {
		t.Errorf("Probe(running) = %v", err)
	}
	boom := errors.New("port closed")
	m.SetBehavior("a", Behavior{ProbeErr: boom})
	if err := m.Probe(ctx, "a"); !errors.Is(err, boom) {
		t.Errorf("Probe with ProbeErr = %v, want it wrapped", err)
	}
	m.SetBehavior("a", Behavior{})
	if err := m.Probe(ctx, "a"); err != nil {
		t.Errorf("Probe after clearing ProbeErr = %v", err)
	}
}

func TestSpecHandling(t *testing.T) {
	ctx := testCtx(t)
	m := New(Options{})
	s := spec("a")
	s.Secrets = map[string][]byte{"token": []byte("hunter2")}
	s.Ports = []api.PortForward{{Name: "ssh", GuestPort: 22}, {Name: "http", GuestPort: 80, HostPort: 8080}}
	st, err := m.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if st.Spec.Secrets != nil {
		t.Error("the runtime keeps secrets in its status, want them left out")
	}
	if st.Ports["http"] != 8080 || st.Ports["ssh"] == 0 {
		t.Errorf("Ports = %v, want http 8080 and a picked ssh port", st.Ports)
	}
	// Secrets are not part of the spec's identity.
	s.Secrets = map[string][]byte{"token": []byte("other")}
	if _, err := m.Create(ctx, s); err != nil {
		t.Errorf("Create with other secret values: %v, want the no-op", err)
	}
	// Mutating a returned status does not change the runtime's copy.
	st.Ports["http"] = 1
	st.Spec.Ports[0].Name = "changed"
	if got := inspect(t, m, "a"); got.Ports["http"] != 8080 || got.Spec.Ports[0].Name != "ssh" {
		t.Error("a returned status aliases the runtime's state")
	}
	if _, err := m.Create(ctx, spec("Bad ID")); err == nil {
		t.Error("Create with an invalid id returned nil")
	}
}

func TestRecoverAndCalls(t *testing.T) {
	ctx := testCtx(t)
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	m := New(Options{Now: func() time.Time { return base }})
	for _, id := range []string{"run", "made"} {
		if _, err := m.Create(ctx, spec(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Start(ctx, "run"); err != nil {
		t.Fatal(err)
	}

	m2 := m.Reopen()
	list, err := m2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.Status{}
	for _, st := range list {
		got[st.ID] = st
	}
	if len(list) != 2 || !got["run"].Adopted || got["run"].State != runtime.StateRunning || got["made"].Adopted {
		t.Errorf("Recover = %+v, want run adopted and running, made not adopted", list)
	}
	if err := m2.Destroy(ctx, "made"); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"run"}, m.Running()); d != "" {
		t.Errorf("Running (-want +got):\n%s", d)
	}

	want := []Call{
		{"create", "run", base}, {"create", "made", base}, {"start", "run", base},
		{"recover", "", base}, {"destroy", "made", base},
	}
	if d := cmp.Diff(want, m.Calls()); d != "" {
		t.Errorf("Calls (-want +got):\n%s", d)
	}
	if n := m.CallCount("create", ""); n != 2 {
		t.Errorf("CallCount(create) = %d, want 2", n)
	}
	if n := m2.CallCount("start", "run"); n != 1 {
		t.Errorf("CallCount(start, run) = %d, want 1", n)
	}
}

func TestSlowSubscriberDoesNotBlock(t *testing.T) {
	ctx := testCtx(t)
	m := New(Options{})
	m.SetDefaultBehavior(Behavior{NeverReady: true})
	subCtx, cancel := context.WithCancel(ctx)
	slow := m.Subscribe(subCtx) // never read until the end
	if _, err := m.Create(ctx, spec("a")); err != nil {
		t.Fatal(err)
	}
	for range subscriberBuffer * 2 {
		if _, err := m.Start(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Stop(ctx, "a", time.Second); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	n := 0
	for range slow {
		n++
	}
	if n != subscriberBuffer {
		t.Errorf("slow subscriber got %d events, want its buffer of %d (the rest dropped)", n, subscriberBuffer)
	}
}
