package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// reasonCase makes instance "a" fail (or stop) with reason and checks the
// reports it produces.
type reasonCase struct {
	name   string
	reason api.ReasonCode
	setup  func(h *harness, d *api.DesiredInstance)              // before the first SetDesired
	opts   func(o *Options)                                      // optional
	act    func(t *testing.T, h *harness, d api.DesiredInstance) // after it; nil: nothing
	want   []string                                              // the exact reports once settled
	prefix bool                                                  // want is only a prefix (restart loops)
}

func failCreate(code api.ReasonCode) reasonCase {
	return reasonCase{
		name:   "create fails with " + string(code),
		reason: code,
		setup: func(h *harness, d *api.DesiredInstance) {
			h.rt.SetBehavior(d.ID, mock.Behavior{CreateErr: code})
		},
		want: []string{"Pending", "Failed/" + string(code)},
	}
}

func failStart(code api.ReasonCode) reasonCase {
	return reasonCase{
		name:   "start fails with " + string(code),
		reason: code,
		setup: func(h *harness, d *api.DesiredInstance) {
			h.rt.SetBehavior(d.ID, mock.Behavior{StartErr: code})
		},
		want: []string{"Pending", "Failed/" + string(code)},
	}
}

func TestReasonCodesReachTheReporter(t *testing.T) {
	cases := []reasonCase{
		failCreate(api.ReasonImagePullFailed),
		failCreate(api.ReasonRootfsBuildFailed),
		failCreate(api.ReasonVolumeAttachFailed),
		failStart(api.ReasonFirecrackerStartFailed),
		failStart(api.ReasonVMStartFailed),
		failStart(api.ReasonContainerStartFailed),
		failStart(api.ReasonNetworkSetupFailed),
		{
			name:   "secret not in the store",
			reason: api.ReasonSecretsMissing,
			setup:  func(h *harness, d *api.DesiredInstance) { d.Spec.Secrets = []string{"db-password"} },
			opts: func(o *Options) {
				o.Secrets = func(_ context.Context, _ string, names []string) (map[string][]byte, error) {
					return nil, fmt.Errorf("read %s: %w", names[0], fs.ErrNotExist)
				}
			},
			want: []string{"Pending", "Failed/secrets_missing"},
		},
		{
			name:   "no secret store",
			reason: api.ReasonSecretsMissing,
			setup:  func(h *harness, d *api.DesiredInstance) { d.Spec.Secrets = []string{"db-password"} },
			want:   []string{"Pending", "Failed/secrets_missing"},
		},
		{
			name:   "secret store fails",
			reason: api.ReasonSecretsInjectionFailed,
			setup:  func(h *harness, d *api.DesiredInstance) { d.Spec.Secrets = []string{"db-password"} },
			opts: func(o *Options) {
				o.Secrets = func(context.Context, string, []string) (map[string][]byte, error) {
					return nil, errors.New("decrypt: bad key")
				}
			},
			want: []string{"Pending", "Failed/secrets_injection_failed"},
		},
		{
			name:   "never ready",
			reason: api.ReasonHealthcheckFailed,
			setup: func(h *harness, d *api.DesiredInstance) {
				h.rt.SetBehavior(d.ID, mock.Behavior{NeverReady: true})
				d.Spec.Readiness.Timeout = api.Duration(30 * time.Millisecond)
			},
			want:   []string{"Pending", "Booting", "Failed/healthcheck_failed", "Booting", "Failed/healthcheck_failed"},
			prefix: true,
		},
		{
			name:   "health checks fail after ready",
			reason: api.ReasonHealthcheckFailed,
			setup: func(h *harness, d *api.DesiredInstance) {
				d.Spec.HealthCheck = &api.HealthCheck{Interval: api.Duration(5 * time.Millisecond), FailureThreshold: 2}
			},
			act: func(t *testing.T, h *harness, d api.DesiredInstance) {
				h.waitSeq(d.ID, ready...)
				h.rt.SetBehavior(d.ID, mock.Behavior{ProbeErr: errors.New("connection refused")})
			},
			want:   []string{"Pending", "Booting", "Ready", "Failed/healthcheck_failed", "Booting"},
			prefix: true,
		},
		{
			name:   "oom killed",
			reason: api.ReasonOOMKilled,
			act: func(t *testing.T, h *harness, d api.DesiredInstance) {
				h.waitSeq(d.ID, ready...)
				h.rt.Crash(d.ID, api.ReasonOOMKilled)
			},
			// Restarted after the backoff.
			want: []string{"Pending", "Booting", "Ready", "Failed/oom_killed", "Booting", "Ready"},
		},
		{
			name: "guest shut itself down",
			act: func(t *testing.T, h *harness, d api.DesiredInstance) {
				h.waitSeq(d.ID, ready...)
				h.rt.GuestShutdown(d.ID)
			},
			want: []string{"Pending", "Booting", "Ready", "Failed", "Booting", "Ready"},
		},
		{
			name:   "crash loop",
			reason: api.ReasonCrashLoopBackoff,
			opts:   func(o *Options) { o.CrashLoopThreshold = 2 },
			act: func(t *testing.T, h *harness, d api.DesiredInstance) {
				for range 3 {
					n := h.waitLast(d.ID, "Ready")
					h.rt.Crash(d.ID, "")
					waitFor(t, "the crash reported", func() bool { return len(h.rep.seq(d.ID)) > n }, func() string { return "" })
				}
			},
			want: []string{
				"Pending", "Booting", "Ready",
				"Failed", "Booting", "Ready", // restart 1
				"Failed", "Booting", "Ready", // restart 2: the threshold
				"Failed/crash_loop_backoff", "Booting", "Ready",
			},
		},
		{
			name:   "desired stopped",
			reason: api.ReasonTerminatedByOperator,
			act: func(t *testing.T, h *harness, d api.DesiredInstance) {
				h.waitSeq(d.ID, ready...)
				h.rec.SetDesired([]api.DesiredInstance{with(d, api.DesiredStopped)}, false)
				h.waitLast(d.ID, "Stopped/terminated_by_operator")
				if st, err := h.rt.Inspect(context.Background(), d.ID); err != nil || st.State != runtime.StateStopped {
					t.Errorf("after desired stopped: %q, %v; want stopped, not destroyed", st.State, err)
				}
			},
			want: []string{"Pending", "Booting", "Ready", "Draining/terminated_by_operator", "Stopped/terminated_by_operator"},
		},
		{
			name:   "desired deleted",
			reason: api.ReasonTerminatedByOperator,
			act: func(t *testing.T, h *harness, d api.DesiredInstance) {
				h.waitSeq(d.ID, ready...)
				h.rec.SetDesired([]api.DesiredInstance{with(d, api.DesiredDeleted)}, false)
				h.waitLast(d.ID, "Stopped/terminated_by_operator")
				if _, err := h.rt.Inspect(context.Background(), d.ID); !errors.Is(err, runtime.ErrNotFound) {
					t.Errorf("after desired deleted, Inspect: %v, want ErrNotFound", err)
				}
			},
			want: []string{"Pending", "Booting", "Ready", "Draining/terminated_by_operator", "Stopped/terminated_by_operator"},
		},
		{
			name:   "host draining, then undrained",
			reason: api.ReasonNodeDraining,
			act: func(t *testing.T, h *harness, d api.DesiredInstance) {
				h.waitSeq(d.ID, ready...)
				h.rec.SetDesired([]api.DesiredInstance{d}, true)
				h.waitLast(d.ID, "Stopped/node_draining")
				if got := h.rec.Allocated(); got != (api.Capacity{}) {
					t.Errorf("Allocated while drained = %+v, want none", got)
				}
				h.rec.SetDesired([]api.DesiredInstance{d}, false)
			},
			want: []string{"Pending", "Booting", "Ready", "Draining/node_draining", "Stopped/node_draining", "Booting", "Ready"},
		},
	}

	covered := map[api.ReasonCode]bool{}
	for _, tc := range cases {
		covered[tc.reason] = true
		t.Run(tc.name, func(t *testing.T) {
			opts := fastOpts()
			if tc.opts != nil {
				tc.opts(&opts)
			}
			h := newHarness(t, opts)
			d := desired("a", 1)
			if tc.setup != nil {
				tc.setup(h, &d)
			}
			h.rec.SetDesired([]api.DesiredInstance{d}, false)
			if tc.act != nil {
				tc.act(t, h, d)
			}
			if tc.prefix {
				h.waitPrefix(d.ID, tc.want...)
			} else {
				h.waitSeq(d.ID, tc.want...)
				settle() // retries with backoff add no reports
				h.waitSeq(d.ID, tc.want...)
			}
			last := h.rep.reports(d.ID)
			for _, rep := range last {
				if rep.Phase == api.InstanceFailed && rep.ReasonCode == tc.reason && rep.Message == "" {
					t.Errorf("Failed/%s report without a message", tc.reason)
				}
			}
			if strings.HasPrefix(tc.name, "create fails") || strings.HasPrefix(tc.name, "start fails") {
				op := "create"
				if strings.HasPrefix(tc.name, "start") {
					op = "start"
				}
				if n := h.rt.CallCount(op, d.ID); n < 2 {
					t.Errorf("%s attempted %d times, want retries with backoff", op, n)
				}
			}
		})
	}

	// Every reason code is produced by the reconciler and covered above.
	for _, code := range api.ReasonCodes() {
		if !covered[code] {
			t.Errorf("reason code %s is not covered", code)
		}
	}
}
