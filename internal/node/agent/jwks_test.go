package agent_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/wire/api"
)

// offsetClock is the wall clock shifted by an offset the test advances, so
// the agent's loops keep running while its notion of "a minute later"
// arrives at once.
type offsetClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *offsetClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *offsetClock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// agentMetric reads one series from the agent's local /metrics.
func agentMetric(t *testing.T, a *runningAgent, series string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	addr, err := a.LocalAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return 0
}

// TestUnknownKidRefreshThrottled floods the agent with deliveries signed by
// keys nobody published. The first unknown kid refreshes the JWKS; every
// other one within the next minute fails without asking the control plane
// and is left for redelivery (no result, not recorded as executed). A
// minute later by the agent's clock, the redelivery of one of them
// refreshes again and, its key now published, runs.
func TestUnknownKidRefreshThrottled(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	clk := &offsetClock{}
	h := &counter{}
	dir := t.TempDir()
	a := startAgent(t, f, dir, h.handlers(), agent.WithClock(clk.now))

	first := claims("task-kid-first", testTaskType)
	f.enqueue(deliveryFor(first, sign(t, newSigner(t), first)))
	if got := f.waitAccepted(t, first.TaskID, 1)[0].Result; got.Error == nil || got.Error.Code != "envelope_unknown_kid" {
		t.Fatalf("first unknown kid: result %+v, want envelope_unknown_kid", got)
	}
	if n := f.jwksCount(); n != 1 {
		t.Fatalf("JWKS fetched %d times for the first unknown kid, want 1", n)
	}

	const flood = 20
	rotated := newSigner(t) // signs the first flooded task; published later
	var late api.TaskDelivery
	for i := range flood {
		c := claims(fmt.Sprintf("task-flood-%02d", i), testTaskType)
		s := newSigner(t)
		if i == 0 {
			s = rotated
		}
		d := deliveryFor(c, sign(t, s, c))
		if i == 0 {
			late = d
		}
		f.enqueue(d)
	}
	eventually(t, "every flooded delivery refused without a refresh", func() bool {
		return agentMetric(t, a, `drover_agent_jwks_refreshes_total{result="throttled"}`) == flood
	})
	if n := f.jwksCount(); n != 1 {
		t.Fatalf("JWKS fetched %d times after %d unknown kids within a minute, want 1", n, flood+1)
	}
	if all := f.allResults(); len(all) != 1 {
		t.Fatalf("results posted for %d task ids, want only %s (throttled ones are left for redelivery)", len(all), first.TaskID)
	}

	// A minute later: the redelivery may refresh, and the key is published.
	f.setJWKS(api.JWKS{Keys: []api.JWK{f.signer.PublicJWK(), rotated.PublicJWK()}})
	clk.advance(time.Minute + time.Second)
	f.enqueue(late)
	if got := f.waitAccepted(t, late.TaskID, 1)[0].Result; got.Status != api.ResultSucceeded {
		t.Fatalf("redelivered task after a minute: result %+v, want succeeded", got)
	}
	if n := f.jwksCount(); n != 2 {
		t.Fatalf("JWKS fetched %d times, want 2 (one more a minute later)", n)
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times, want once (the redelivered task)", runs)
	}
	// A throttled delivery is not recorded: its redelivery is verified afresh.
	if _, err := os.Stat(filepath.Join(dir, "tasks", "task-flood-01.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("throttled task recorded in the state directory (stat: %v)", err)
	}
}

// TestRenewalKeepsRefreshedKeys: a certificate renewal whose request
// predates a signing-key rotation answers with the old JWKS. A task signed
// by the new key arrives meanwhile, and the agent refreshes its keys and
// runs it. When the renewal's answer lands, it must not put the old key
// set back: the next task signed by the new key runs at once (with the old
// set back it would be an unknown kid again, and the refresh throttled for
// a minute). This was a flake of TestAgentRenewsAndFollowsKeyRotation.
func TestRenewalKeepsRefreshedKeys(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	f.enrolTTL = 3 * time.Second // renewed at about 2s
	f.renewStarted, f.renewGate = make(chan struct{}, 1), make(chan struct{})
	h := &counter{}
	dir := t.TempDir()
	startAgent(t, f, dir, h.handlers())
	select {
	case <-f.renewStarted:
	case <-time.After(waitDeadline):
		t.Fatal("the agent did not renew its 3s certificate")
	}

	rotated := newSigner(t)
	f.setJWKS(api.JWKS{Keys: []api.JWK{f.signer.PublicJWK(), rotated.PublicJWK()}})
	first := claims("task-rotated-1", testTaskType)
	f.enqueue(deliveryFor(first, sign(t, rotated, first)))
	if got := f.waitAccepted(t, first.TaskID, 1)[0].Result; got.Status != api.ResultSucceeded {
		t.Fatalf("first task signed by the new key: %+v, want succeeded after a refresh", got)
	}

	close(f.renewGate) // the renewal answers, with the JWKS of before the rotation
	sd, err := statedir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var saved statedir.Identity
	eventually(t, "the renewed identity saved", func() bool {
		id, ok, err := sd.LoadIdentity()
		saved = id
		return err == nil && ok && id.NotAfter.Equal(f.renewed())
	})
	if !slices.ContainsFunc(saved.JWKS.Keys, func(k api.JWK) bool { return k.Kid == rotated.PublicJWK().Kid }) {
		t.Errorf("the renewed identity's JWKS lacks the rotated key %s: the renewal put the old set back", rotated.PublicJWK().Kid)
	}
	second := claims("task-rotated-2", testTaskType)
	f.enqueue(deliveryFor(second, sign(t, rotated, second)))
	if got := f.waitAccepted(t, second.TaskID, 1)[0].Result; got.Status != api.ResultSucceeded {
		t.Fatalf("second task signed by the new key after the renewal: %+v, want succeeded", got)
	}
	if n := f.jwksCount(); n != 1 {
		t.Errorf("JWKS fetched %d times, want 1 (the renewal must not undo the refresh)", n)
	}
}
