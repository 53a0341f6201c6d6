package agent_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
)

// expiredIdentity enrols an agent in a fresh state directory with a
// certificate living ttl, stops it before any renewal (the fake holds
// them), and waits until that certificate expired.
func expiredIdentity(t *testing.T, f *fakeCP, ttl time.Duration) string {
	t.Helper()
	f.mu.Lock()
	f.enrolTTL, f.renewGate = ttl, make(chan struct{})
	f.mu.Unlock()
	dir := t.TempDir()
	startAgent(t, f, dir, (&counter{}).handlers()).stop(t)
	time.Sleep(ttl + 200*time.Millisecond)
	return dir
}

// TestExpiredIdentityFallsBackToToken: an agent that starts with an
// expired certificate enrols again by proof of that certificate first,
// and when the control plane refuses it, with its bootstrap token.
func TestExpiredIdentityFallsBackToToken(t *testing.T) {
	f := newFakeCP(t)
	dir := expiredIdentity(t, f, 2*time.Second)
	startAgent(t, f, dir, (&counter{}).handlers())
	if got, want := f.credentialLog(), []string{"token", "previous_certificate", "token"}; !slices.Equal(got, want) {
		t.Errorf("registrations %v, want %v", got, want)
	}
}

// TestExpiredIdentityWithoutToken: refused, and without a bootstrap token,
// the agent stops with ErrNotEnrolled, saying why.
func TestExpiredIdentityWithoutToken(t *testing.T) {
	f := newFakeCP(t)
	dir := expiredIdentity(t, f, 2*time.Second)
	cfg := testConfig(f, dir)
	cfg.BootstrapToken = ""
	a, err := agent.New(cfg, agent.WithAccelProbe(fixedAccel(accel.TCG)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	err = a.Run(ctx)
	if !errors.Is(err, agent.ErrNotEnrolled) || ctx.Err() != nil {
		t.Fatalf("Run = %v, want ErrNotEnrolled at once", err)
	}
	if got, want := f.credentialLog(), []string{"token", "previous_certificate"}; !slices.Equal(got, want) {
		t.Errorf("registrations %v, want %v", got, want)
	}
}
