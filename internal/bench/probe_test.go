package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestProbe: the probe calls /readyz and reads a host with the token, in
// a loop; probeFigures turns its events into the restart time, the
// answered reads' latency and the failures.
func TestProbe(t *testing.T) {
	var readyCalls, hostCalls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz":
			if readyCalls.Add(1) < 3 {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case r.Header.Get("Authorization") != "Bearer tok":
			w.WriteHeader(http.StatusUnauthorized)
		case strings.HasPrefix(r.URL.Path, "/api/v1/hosts/h"):
			if hostCalls.Add(1) == 2 {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			_, _ = w.Write([]byte(`{}`))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	t0 := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- Probe(ctx, srv.URL, "tok", []string{"h1", "h2"}, &out) }()
	// The probe is sequential: once the server has seen the 6th host read,
	// the events of the first 5 (and of 6 /readyz calls) are written. The
	// 5th call alone would not do: cancelling while it is answered can
	// leave it without an event.
	for hostCalls.Load() < 6 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var events []ProbeEvent
	dec := json.NewDecoder(&out)
	for dec.More() {
		var ev ProbeEvent
		if err := dec.Decode(&ev); err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
	if len(events) < 10 || !events[0].Ready || events[0].OK || events[1].Ready || !events[2].Ready || events[2].OK ||
		!events[4].Ready || !events[4].OK || events[5].Ready {
		t.Fatalf("events %+v: want /readyz and a host read alternating, /readyz failing twice", events)
	}
	var op recorder
	readyS, fails := probeFigures(events, t0, &op)
	if readyS < 0 || readyS > 5 || fails != 1 || op.len() < 4 {
		t.Fatalf("ready %.2fs, %d failures, %d answered: want ready, 1 failure (the 500), ≥ 4 answered", readyS, fails, op.len())
	}
	if first := time.Unix(0, events[4].At); readyS < secs(first.Sub(t0)) {
		t.Errorf("ready at %.2fs, before the first answered /readyz began", readyS)
	}
	if r, _ := probeFigures(events, time.Now().Add(time.Hour), &recorder{}); r != -1 {
		t.Errorf("events before t0 counted: ready %.2f", r)
	}
	if err := Probe(context.Background(), "http://192.0.2.1:1", "tok", []string{"h"}, &out); err == nil ||
		!strings.Contains(err.Error(), "loopback") {
		t.Errorf("non-loopback --api: %v, want refused", err)
	}
}
