package instances

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/httpapi/parktest"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// desiredStore is a Store of host n1 and its instances, for the desired
// set's reads (any other call panics); afterRead, when set, runs after
// each read of the instances, and panics makes the host's read panic.
type desiredStore struct {
	Store
	mu        sync.Mutex
	host      store.Host
	ins       []store.Instance
	reads     atomic.Int32
	afterRead atomic.Pointer[func()]
	panics    atomic.Bool
}

func (f *desiredStore) GetHost(context.Context, string) (store.Host, error) {
	if f.panics.Load() {
		panic("host lookup bug")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.host, nil
}

func (f *desiredStore) ListInstances(context.Context, store.InstanceFilter) ([]store.Instance, error) {
	f.mu.Lock()
	ins := slices.Clone(f.ins)
	f.mu.Unlock()
	f.reads.Add(1)
	if h := f.afterRead.Load(); h != nil {
		(*h)()
	}
	return ins, nil
}

// update changes the host or its instances under the store's lock.
func (f *desiredStore) update(fn func(h *store.Host, ins []store.Instance)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.host, f.ins)
}

// newDesiredRoom is a room whose store holds host n1 with one running
// instance, and the set's ETag.
func newDesiredRoom(t *testing.T) (*Room, *desiredStore, string) {
	t.Helper()
	st := &desiredStore{host: store.Host{ID: "n1", Enabled: true, Status: api.HostHealthy},
		ins: []store.Instance{{ID: "i-000000000001", Name: "web-1", HostID: "n1", Spec: json.RawMessage(`{"vcpus":1}`),
			DesiredState: api.DesiredRunning, Generation: 1}}}
	r := New(Config{Now: time.Now}, st, nil)
	set, _, err := r.desiredSet(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	return r, st, set.ETag
}

// desiredReq is n1's desired-set request with ?etag= and ?wait=.
func desiredReq(ctx context.Context, etag, wait string) *http.Request {
	return httptest.NewRequestWithContext(ctx, http.MethodGet, "/internal/v1/nodes/n1/instances?etag="+etag+"&wait="+wait, nil)
}

// answeredSet is the set of a 200 answer, checked against its ETag header.
func answeredSet(t *testing.T, w *parktest.Recorder, err error) api.NodeInstances {
	t.Helper()
	var set api.NodeInstances
	if err != nil || !w.Wrote || w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &set) != nil {
		t.Fatalf("answer %v (%v), want a set", w.ResponseRecorder, err)
	}
	if got := w.Header().Get("ETag"); got != strconv.Quote(set.ETag) {
		t.Fatalf("ETag header %s, set's %q", got, set.ETag)
	}
	return set
}

// TestNodeDesiredLongPoll: a poll whose ETag is current waits (parked: its
// handler returns before the answer) and is answered on a wake that
// changed the set, 403 on a wake after a revocation, the last set read
// when its time is up; a wake that changes nothing the ETag covers keeps
// it waiting. A change during the first read is not lost.
func TestNodeDesiredLongPoll(t *testing.T) {
	bump := func(_ *store.Host, ins []store.Instance) { ins[0].Generation++ }
	for _, m := range parktest.Modes() {
		for _, tc := range []struct {
			name    string
			wait    string
			during  func(h *store.Host, ins []store.Instance) // a change during the first read (then a wake)
			changes []func(h *store.Host, ins []store.Instance)
			want    int    // status
			name0   string // the answered set's first instance's name
			newETag bool
		}{
			{"a change wakes it", "1m", nil, []func(*store.Host, []store.Instance){bump}, http.StatusOK, "web-1", true},
			{"a drain wakes it", "1m", nil, []func(*store.Host, []store.Instance){
				func(h *store.Host, _ []store.Instance) { h.Draining = true }}, http.StatusOK, "web-1", true},
			{"a rename, then the timeout", "300ms", nil, []func(*store.Host, []store.Instance){
				func(_ *store.Host, ins []store.Instance) { ins[0].Name = "renamed" }}, http.StatusOK, "renamed", false},
			{"the timeout", "20ms", nil, nil, http.StatusOK, "web-1", false},
			{"revoked", "1m", nil, []func(*store.Host, []store.Instance){
				func(h *store.Host, _ []store.Instance) { h.Revoked = true }}, http.StatusForbidden, "", false},
			{"a change during the first read", "1m", bump, nil, http.StatusOK, "web-1", true},
		} {
			t.Run(m.String()+"/"+tc.name, func(t *testing.T) {
				r, st, etag := newDesiredRoom(t)
				if tc.during != nil {
					once := sync.OnceFunc(func() { st.update(tc.during); r.Wake("n1") })
					st.afterRead.Store(&once)
				}
				pd := m.Start(t, r.NodeDesired, desiredReq(t.Context(), etag, tc.wait), "n1")
				if m == parktest.Parked && (pd.Park == nil || tc.changes != nil && pd.Ended()) {
					t.Fatalf("parked %v, ended %v; want parked, answered later", pd.Park != nil, pd.Ended())
				}
				parktest.Eventually(t, "the poll read", func() bool { return st.reads.Load() >= 2 }) // newDesiredRoom's read, then its
				for i, change := range tc.changes {
					st.update(change)
					r.Wake("n1")
					parktest.Eventually(t, "the wake re-read", func() bool { return st.reads.Load() == int32(i+3) })
				}
				w, err := pd.Wait(t)
				if tc.want == http.StatusForbidden {
					var he *httpapi.Error
					if !errors.As(err, &he) || he.Status != http.StatusForbidden || he.Code != "node_identity_revoked" {
						t.Fatalf("woken after revocation: %v, want 403 node_identity_revoked", err)
					}
				} else if set := answeredSet(t, w, err); (set.ETag != etag) != tc.newETag || set.Instances[0].Name != tc.name0 {
					t.Fatalf("answered %s %q; want a new ETag %v, name %q", set.ETag, set.Instances[0].Name, tc.newETag, tc.name0)
				}
				if n := r.waiters.Count(); n != 0 {
					t.Fatalf("%d waiters left", n)
				}
			})
		}
	}
}

// TestNodeDesiredAnswersAtOnce: a request that would not wait (no or
// another ETag, no wait, a revoked node) is answered by its first read,
// without parking, and leaves no waiter.
func TestNodeDesiredAnswersAtOnce(t *testing.T) {
	for _, m := range parktest.Modes() {
		for _, tc := range []struct {
			name, etag, wait string
			revoked          bool
			want             int
		}{
			{"no etag", "", "1m", false, http.StatusOK},
			{"another etag", "stale", "1m", false, http.StatusOK},
			{"no wait", "current", "", false, http.StatusOK},
			{"revoked", "current", "1m", true, http.StatusForbidden},
			{"bad wait", "current", "soon", false, http.StatusUnprocessableEntity},
		} {
			t.Run(m.String()+"/"+tc.name, func(t *testing.T) {
				r, st, etag := newDesiredRoom(t)
				st.host.Revoked = tc.revoked
				if tc.etag == "current" {
					tc.etag = etag
				}
				pd := m.Start(t, r.NodeDesired, desiredReq(t.Context(), tc.etag, tc.wait), "n1")
				if pd.Park != nil {
					t.Fatal("parked")
				}
				w, err := pd.Wait(t)
				var he *httpapi.Error
				switch {
				case tc.want == http.StatusOK:
					if set := answeredSet(t, w, err); set.ETag != etag {
						t.Fatalf("answered ETag %s, want %s", set.ETag, etag)
					}
				case !errors.As(err, &he) || he.Status != tc.want:
					t.Fatalf("answer %v, want %d", err, tc.want)
				}
				if n := r.waiters.Count(); n != 0 {
					t.Fatalf("%d waiters left", n)
				}
			})
		}
	}
}

// TestNodeDesiredCancelled: a poll whose request is cancelled ends without
// an answer, and frees its waiter and its long-poll slot, which it held
// until then.
func TestNodeDesiredCancelled(t *testing.T) {
	for _, m := range parktest.Modes() {
		t.Run(m.String(), func(t *testing.T) {
			r, _, etag := newDesiredRoom(t)
			reg := prometheus.NewRegistry()
			h := httpapi.NewLongPolls("instances", 1, reg, httpapi.NewLimitRefusals(reg)).Limit(httpapi.WaitRequested, r.NodeDesired)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			pd := m.Start(t, h, desiredReq(ctx, etag, "1m"), "n1")
			parktest.Eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
			var he *httpapi.Error
			if _, err := m.Start(t, h, desiredReq(t.Context(), etag, "10ms"), "n1").Wait(t); !errors.As(err, &he) ||
				he.Status != http.StatusTooManyRequests {
				t.Fatalf("a second poll while the first waits: %v, want 429", err)
			}
			cancel()
			if w, err := pd.Wait(t); w.Wrote || err != nil {
				t.Fatalf("cancelled poll: %v, wrote %v; want nothing", err, w.Wrote)
			}
			if n := r.waiters.Count(); n != 0 {
				t.Fatalf("%d waiters left", n)
			}
			w, err := m.Start(t, h, desiredReq(t.Context(), etag, "10ms"), "n1").Wait(t)
			answeredSet(t, w, err)
		})
	}
}

// TestNodeDesiredParkedPanicOnWake: a parked poll whose re-read panics
// aborts its request (the transport drops it) and still removes its
// waiter and runs the rest of its chain with a nil error.
func TestNodeDesiredParkedPanicOnWake(t *testing.T) {
	r, st, etag := newDesiredRoom(t)
	pd := parktest.Parked.Start(t, r.NodeDesired, desiredReq(t.Context(), etag, "1m"), "n1")
	parktest.Eventually(t, "the poll waits", func() bool { return r.waiters.Count() == 1 })
	st.panics.Store(true)
	r.Wake("n1")
	v, err := pd.WaitAbort(t)
	if v != "host lookup bug" {
		t.Fatalf("aborted with %v, want the panic's value", v)
	}
	if n := r.waiters.Count(); n != 0 || err != nil {
		t.Fatalf("%d waiters left, chain's error %v; want none, nil", n, err)
	}
}

// TestNodeDesiredParkedHoldsNoGoroutine: parked polls hold no goroutine;
// a wake that changes nothing runs each on a goroutine that ends when it
// parks again, and one that changes the set answers them all.
func TestNodeDesiredParkedHoldsNoGoroutine(t *testing.T) {
	r, st, etag := newDesiredRoom(t)
	const n = 50
	before := runtime.NumGoroutine()
	pds := make([]*parktest.Pending, n)
	for i := range pds {
		if pds[i] = parktest.Parked.Start(t, r.NodeDesired, desiredReq(t.Context(), etag, "1m"), "n1"); pds[i].Park == nil {
			t.Fatalf("poll %d did not park", i)
		}
	}
	if got := runtime.NumGoroutine() - before; got > n/10 {
		t.Fatalf("%d goroutines more with %d parked polls", got, n)
	}
	r.WakeAll()
	parktest.Eventually(t, "every poll re-read", func() bool { return st.reads.Load() == 1+2*n })
	parktest.Eventually(t, "the woken polls parked again", func() bool { return runtime.NumGoroutine()-before <= n/10 })
	st.update(func(_ *store.Host, ins []store.Instance) { ins[0].DesiredState = api.DesiredStopped })
	r.Wake("n1")
	for _, pd := range pds {
		if w, err := pd.Wait(t); answeredSet(t, w, err).ETag == etag {
			t.Fatal("answered the old set")
		}
	}
	if got := r.waiters.Count(); got != 0 {
		t.Fatalf("%d waiters left", got)
	}
}
