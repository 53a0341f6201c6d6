package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestTaskEnvelopes delivers one task per case to a real agent and checks
// what the control plane is told: a valid envelope runs its handler once;
// every other one is refused before any handler runs, with the exact
// result code.
func TestTaskEnvelopes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// build returns the delivery to serve; it may reconfigure the fake.
		build func(t *testing.T, f *fakeCP) api.TaskDelivery
		// wantCode is the failed result's error code; "" means the handler
		// runs once and the result succeeded.
		wantCode string
		// wantJWKSGets is how many times the agent fetches GET .../jwks.
		wantJWKSGets int
		// after, when set, runs once the agent has stopped.
		after func(t *testing.T, f *fakeCP, stateDir string)
	}{
		{
			name: "valid envelope runs the handler",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-valid", testTaskType)
				return deliveryFor(c, sign(t, f.signer, c))
			},
		},
		{
			name: "tampered params keep the signature",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-tampered", testTaskType)
				env := editPayload(t, sign(t, f.signer, c), func(p []byte) []byte {
					return bytes.Replace(p, []byte(`"params":{"n":1}`), []byte(`"params":{"n":2}`), 1)
				})
				return deliveryFor(c, env)
			},
			wantCode: "envelope_bad_signature",
		},
		{
			name: "flipped payload character",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-flipped", testTaskType)
				return deliveryFor(c, flipPayloadChar(t, sign(t, f.signer, c)))
			},
			wantCode: "envelope_bad_signature",
		},
		{
			name: "exp stripped from the payload",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-no-exp", testTaskType)
				env := editPayload(t, sign(t, f.signer, c), func(p []byte) []byte {
					return regexp.MustCompile(`,"exp":[0-9]+`).ReplaceAll(p, nil)
				})
				return deliveryFor(c, env)
			},
			wantCode: "envelope_bad_signature",
		},
		{
			name: "unknown kid is refused after one JWKS refresh",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-unknown-kid", testTaskType)
				return deliveryFor(c, sign(t, newSigner(t), c))
			},
			wantCode:     "envelope_unknown_kid",
			wantJWKSGets: 1,
		},
		{
			name: "rotated key is learnt from the JWKS endpoint",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				rotated := newSigner(t)
				f.setJWKS(api.JWKS{Keys: []api.JWK{f.signer.PublicJWK(), rotated.PublicJWK()}})
				c := claims("task-rotated", testTaskType)
				return deliveryFor(c, sign(t, rotated, c))
			},
			wantJWKSGets: 1,
			after: func(t *testing.T, f *fakeCP, stateDir string) {
				// The refreshed key set is persisted with the identity, so
				// a restarted agent still knows the rotated key.
				d, err := statedir.Open(stateDir)
				if err != nil {
					t.Fatal(err)
				}
				id, ok, err := d.LoadIdentity()
				if err != nil || !ok {
					t.Fatalf("LoadIdentity = %v, %v", ok, err)
				}
				f.mu.Lock()
				want := f.jwks
				f.mu.Unlock()
				if !slices.Equal(id.JWKS.Keys, want.Keys) {
					t.Errorf("stored JWKS = %+v, want the refreshed %+v", id.JWKS.Keys, want.Keys)
				}
			},
		},
		{
			name: "HS256 with the public key as HMAC secret",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-hs256", testTaskType)
				return deliveryFor(c, hs256(t, sign(t, f.signer, c), f.signer.PublicJWK()))
			},
			wantCode: "envelope_algorithm_rejected",
		},
		{
			name: "alg none with an empty signature",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-alg-none", testTaskType)
				payload, err := json.Marshal(c)
				if err != nil {
					t.Fatal(err)
				}
				hdr := b64.EncodeToString([]byte(`{"alg":"none","kid":"` + f.signer.KeyID() + `","typ":"` + task.EnvelopeType + `"}`))
				return deliveryFor(c, hdr+"."+b64.EncodeToString(payload)+".")
			},
			wantCode: "envelope_malformed",
		},
		{
			name: "garbage envelope",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				return deliveryFor(claims("task-garbage", testTaskType), "not-a-jws")
			},
			wantCode: "envelope_malformed",
		},
		{
			name: "expired task",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-expired", testTaskType)
				now := time.Now()
				c.IssuedAt, c.ExpiresAt = now.Add(-10*time.Minute).Unix(), now.Add(-time.Minute).Unix()
				return deliveryFor(c, sign(t, f.signer, c))
			},
			wantCode: "envelope_expired",
		},
		{
			name: "issued too far in the future",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-future", testTaskType)
				now := time.Now()
				c.IssuedAt, c.ExpiresAt = now.Add(time.Hour).Unix(), now.Add(2*time.Hour).Unix()
				return deliveryFor(c, sign(t, f.signer, c))
			},
			wantCode: "envelope_expired",
		},
		{
			name: "task for another node",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-other-node", testTaskType)
				c.NodeID = "some-other-node"
				return deliveryFor(c, sign(t, f.signer, c))
			},
			wantCode: "envelope_wrong_node",
		},
		{
			name: "outer task_type differs from the signed type",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-mismatch", testTaskType)
				d := deliveryFor(c, sign(t, f.signer, c))
				d.TaskType = "diag.health_probe"
				return d
			},
			wantCode: "envelope_delivery_mismatch",
		},
		{
			name: "outer correlation id differs from the signed one",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-cid-mismatch", testTaskType)
				d := deliveryFor(c, sign(t, f.signer, c))
				d.CorrelationID = "cid-forged"
				return d
			},
			wantCode: "envelope_delivery_mismatch",
		},
		{
			name: "validly signed task of an unknown type",
			build: func(t *testing.T, f *fakeCP) api.TaskDelivery {
				c := claims("task-unknown-type", "test.no_such_handler")
				return deliveryFor(c, sign(t, f.signer, c))
			},
			wantCode: "unknown_task_type",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeCP(t)
			h := &counter{}
			dir := t.TempDir()
			a := startAgent(t, f, dir, h.handlers())
			d := tc.build(t, f)
			f.enqueue(d)

			got := f.waitAccepted(t, d.TaskID, 1)[0].Result
			// Every delivered task id, run or refused, is recorded so that a
			// redelivery is answered from the replay cache.
			waitPosted(t, dir, d.TaskID)
			a.stop(t) // after Run returns nothing more can be posted
			if n := len(f.resultsFor(d.TaskID)); n != 1 {
				t.Errorf("result posted %d times, want once", n)
			}
			if all := f.allResults(); len(all) != 1 {
				t.Errorf("results posted for %d task ids, want only %s: %v", len(all), d.TaskID, all)
			}
			if got.CorrelationID != d.CorrelationID {
				t.Errorf("result correlation_id = %q, want %q", got.CorrelationID, d.CorrelationID)
			}
			if got.FinishedAt.IsZero() {
				t.Error("result has no finished_at")
			}
			if n := f.jwksCount(); n != tc.wantJWKSGets {
				t.Errorf("agent fetched the JWKS %d times, want %d", n, tc.wantJWKSGets)
			}
			events := f.eventsFor(d.TaskID)
			if tc.after != nil {
				tc.after(t, f, dir)
			}

			if tc.wantCode == "" {
				if runs := h.runs.Load(); runs != 1 {
					t.Fatalf("handler ran %d times, want once", runs)
				}
				if got.Status != api.ResultSucceeded || got.Error != nil {
					t.Fatalf("result = %+v, want succeeded without error", got)
				}
				var out struct {
					TaskID string          `json:"task_id"`
					Params json.RawMessage `json:"params"`
				}
				if err := json.Unmarshal(got.Output, &out); err != nil || out.TaskID != d.TaskID || string(out.Params) != `{"n":1}` {
					t.Errorf("output = %s (%v), want the handler's output for %s with the signed params", got.Output, err, d.TaskID)
				}
				if got.Timings["work_ms"] != 3 {
					t.Errorf("timings = %v, want work_ms 3 from the handler", got.Timings)
				}
				if _, ok := got.Timings["total_ms"]; !ok {
					t.Errorf("timings = %v, want total_ms", got.Timings)
				}
				if phases := eventPhases(events); !slices.Equal(phases, []string{"started", "work"}) {
					t.Errorf("event phases = %v, want [started work]", phases)
				}
				return
			}
			if runs := h.runs.Load(); runs != 0 {
				t.Errorf("handler ran %d times, want never", runs)
			}
			if got.Status != api.ResultFailed || got.Error == nil {
				t.Fatalf("result = %+v, want failed with an error", got)
			}
			if got.Error.Code != tc.wantCode {
				t.Errorf("error code = %q (%s), want %q", got.Error.Code, got.Error.Message, tc.wantCode)
			}
			if got.Error.Message == "" {
				t.Error("error has no message")
			}
			if len(events) != 0 {
				t.Errorf("events %v posted for a task that must not run", eventPhases(events))
			}
		})
	}
}

func eventPhases(evs []api.TaskEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Phase)
	}
	return out
}

// TestReplayedTaskIsNotRunAgain serves the same delivery twice (the second
// time as a requeued attempt after the first result was accepted): the
// handler runs once and the agent re-posts the identical result.
func TestReplayedTaskIsNotRunAgain(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	h := &counter{}
	a := startAgent(t, f, t.TempDir(), h.handlers())
	c := claims("task-replayed", testTaskType)
	d := deliveryFor(c, sign(t, f.signer, c))

	f.enqueue(d)
	f.waitAccepted(t, d.TaskID, 1)
	d.Attempt = 2 // not signed; a requeue bumps it
	f.enqueue(d)
	posts := f.waitAccepted(t, d.TaskID, 2)
	a.stop(t)

	if runs := h.runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times, want once", runs)
	}
	if posts[0].Result.Status != api.ResultSucceeded {
		t.Fatalf("first result = %+v, want succeeded", posts[0].Result)
	}
	if !bytes.Equal(posts[0].Body, posts[1].Body) {
		t.Errorf("re-posted result differs:\nfirst:  %s\nsecond: %s", posts[0].Body, posts[1].Body)
	}
	if n := len(f.resultsFor(d.TaskID)); n != 2 {
		t.Errorf("result posted %d times, want twice", n)
	}
	if phases := eventPhases(f.eventsFor(d.TaskID)); !slices.Equal(phases, []string{"started", "work"}) {
		t.Errorf("event phases = %v, want one run's [started work]", phases)
	}
}

// TestResultSpoolRetriesWithBackoff makes the control plane refuse the
// first three result posts: the agent keeps the result spooled, retries
// with growing delays, reports task_result_post_failed meanwhile, and the
// result finally arrives byte for byte as first sent.
func TestResultSpoolRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	f.setFailResults(3, false)
	h := &counter{}
	dir := t.TempDir()
	a := startAgent(t, f, dir, h.handlers())
	c := claims("task-spooled", testTaskType)
	d := deliveryFor(c, sign(t, f.signer, c))
	f.enqueue(d)

	f.waitAccepted(t, d.TaskID, 1)
	waitPosted(t, dir, d.TaskID)
	// One more heartbeat after the success shows the diagnostic cleared.
	n := len(f.heartbeatLog())
	eventually(t, "a heartbeat after the result was accepted", func() bool { return len(f.heartbeatLog()) > n+1 })
	a.stop(t)

	posts := f.resultsFor(d.TaskID)
	if len(posts) != 4 {
		t.Fatalf("result posted %d times, want 3 refused + 1 accepted", len(posts))
	}
	for i, p := range posts {
		wantStatus := http.StatusServiceUnavailable
		if i == 3 {
			wantStatus = http.StatusOK
		}
		if p.Status != wantStatus {
			t.Errorf("post %d answered %d, want %d", i+1, p.Status, wantStatus)
		}
		if !bytes.Equal(p.Body, posts[0].Body) {
			t.Errorf("post %d body differs from the first:\n%s\n%s", i+1, p.Body, posts[0].Body)
		}
	}
	// Post 1 comes from the task, post 2 from the spool loop it wakes at
	// once; then full-jitter backoff in [cur/2, cur) from 1s, doubling.
	if gap := posts[2].At.Sub(posts[1].At); gap < 500*time.Millisecond {
		t.Errorf("second retry came %s after the first, want >= 500ms of backoff", gap)
	}
	if gap := posts[3].At.Sub(posts[2].At); gap < time.Second {
		t.Errorf("third retry came %s after the second, want >= 1s of backoff", gap)
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Errorf("handler ran %d times, want once", runs)
	}

	// The spool on disk holds exactly what was posted, marked posted.
	rec := readTaskRecord(t, dir, d.TaskID)
	if !rec.Posted || rec.Result == nil {
		t.Fatalf("spool record = %+v, want a posted result", rec)
	}
	saved, err := json.Marshal(*rec.Result)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(saved, posts[3].Body) {
		t.Errorf("accepted result differs from the spooled one:\nposted: %s\nsaved:  %s", posts[3].Body, saved)
	}

	// Heartbeats carried task_result_post_failed while posting failed, and
	// stopped carrying it once the result was accepted.
	hbs := f.heartbeatLog()
	sawFailed := false
	for _, hb := range hbs {
		if hb.At.After(posts[0].At) && hb.At.Before(posts[3].At) && hb.HB.Diagnostic == string(signal.TaskResultPostFailed) {
			sawFailed = true
		}
	}
	if !sawFailed {
		t.Errorf("no heartbeat between the first refusal and the success carried task_result_post_failed: %+v", hbs)
	}
	if last := hbs[len(hbs)-1]; last.HB.Diagnostic != "" {
		t.Errorf("last heartbeat diagnostic = %q, want cleared after the result was accepted", last.HB.Diagnostic)
	}
}

// TestResultErrorFields: a handler's HandlerError fields reach the result's
// error; a control plane that predates ResultError.Fields (422 to a result
// carrying them) gets the same result again without them, and accepts it.
func TestResultErrorFields(t *testing.T) {
	t.Parallel()
	fe := []api.FieldError{{Field: "params.slots[0].pci_address", Message: "not a device of an approved slot"}}
	h := agent.Handlers{testTaskType: {Timeout: 5 * time.Second, Run: func(context.Context, agent.Task) (agent.Outcome, error) {
		return agent.Outcome{}, &agent.HandlerError{CodedError: api.CodedError{Code: "device_not_allowed",
			Message: "phase device_check: " + fe[0].Field + ": " + fe[0].Message, Fields: fe}}
	}}}
	for _, old := range []bool{false, true} {
		f := newFakeCP(t)
		f.setNoResultFields(old)
		dir := t.TempDir()
		a := startAgent(t, f, dir, h)
		c := claims("task-fields", testTaskType)
		f.enqueue(deliveryFor(c, sign(t, f.signer, c)))
		got := f.waitAccepted(t, c.TaskID, 1)[0].Result
		waitPosted(t, dir, c.TaskID)
		a.stop(t)

		posts := f.resultsFor(c.TaskID)
		wantFields := fe
		if old {
			wantFields = nil
			if len(posts) != 2 || posts[0].Status != http.StatusUnprocessableEntity ||
				!reflect.DeepEqual(posts[0].Result.Error.Fields, fe) {
				t.Fatalf("old control plane: posts %+v, want a 422 to the result with fields, then the accepted one", posts)
			}
		} else if len(posts) != 1 {
			t.Fatalf("posts %+v, want one", posts)
		}
		if got.Status != api.ResultFailed || got.Error == nil || got.Error.Code != "device_not_allowed" ||
			got.Error.Message != "phase device_check: "+fe[0].Field+": "+fe[0].Message || !reflect.DeepEqual(got.Error.Fields, wantFields) {
			t.Errorf("old=%v: accepted result error = %+v, want fields %+v", old, got.Error, wantFields)
		}
		// The spool keeps the result as the handler made it.
		if rec := readTaskRecord(t, dir, c.TaskID); rec.Result == nil || !reflect.DeepEqual(rec.Result.Error.Fields, fe) {
			t.Errorf("old=%v: spooled result = %+v", old, rec.Result)
		}
	}
}

// TestSpooledResultSurvivesRestart stops an agent while the control plane
// refuses every result, then starts a new agent on the same state
// directory: it posts the spooled result without running the handler again,
// keeps its identity, and a redelivery of the task is answered from the
// spool too.
func TestSpooledResultSurvivesRestart(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	f.setFailResults(0, true)
	h := &counter{}
	dir := t.TempDir()
	a1 := startAgent(t, f, dir, h.handlers())
	c := claims("task-restart", testTaskType)
	d := deliveryFor(c, sign(t, f.signer, c))
	f.enqueue(d)

	eventually(t, "a refused result post", func() bool { return len(f.resultsFor(d.TaskID)) > 0 })
	a1.stop(t)
	refused := f.resultsFor(d.TaskID)
	if len(f.accepted(d.TaskID)) != 0 {
		t.Fatal("a result was accepted while the fake refused them all")
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Fatalf("first agent ran the handler %d times, want once", runs)
	}
	if rec := readTaskRecord(t, dir, d.TaskID); rec.Posted || rec.Result == nil {
		t.Fatalf("after stopping, spool record = %+v, want an unposted result", rec)
	}

	f.setFailResults(0, false)
	a2 := startAgent(t, f, dir, h.handlers())
	posts := f.waitAccepted(t, d.TaskID, 1)
	if !bytes.Equal(posts[0].Body, refused[0].Body) {
		t.Errorf("second agent posted a different result:\nnow:    %s\nbefore: %s", posts[0].Body, refused[0].Body)
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Errorf("handler ran %d times across both agents, want once", runs)
	}

	d.Attempt = 2
	f.enqueue(d)
	posts = f.waitAccepted(t, d.TaskID, 2)
	waitPosted(t, dir, d.TaskID)
	a2.stop(t)
	if !bytes.Equal(posts[1].Body, refused[0].Body) {
		t.Errorf("redelivery after restart re-posted a different result:\nnow:    %s\nbefore: %s", posts[1].Body, refused[0].Body)
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Errorf("handler ran %d times after a redelivery, want once", runs)
	}
	if n := f.registerCount(); n != 1 {
		t.Errorf("agent registered %d times, want once (the second agent reuses the stored identity)", n)
	}
}

// TestInterruptedTaskReportedAtStart: a task whose handler was cut off
// (the replay cache holds its begin record and no result: the state a kill
// -9 leaves) is reported failed with agent_restarted_during_task and its
// correlation id as soon as the agent starts again, without waiting for
// the control plane to redeliver it; a redelivery re-posts that result and
// the handler never runs.
func TestInterruptedTaskReportedAtStart(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	h := &counter{}
	dir := t.TempDir()
	startAgent(t, f, dir, h.handlers()).stop(t) // enrolled: the identity is on disk
	c := claims("task-cut-off", testTaskType)
	sd, err := statedir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sd.Begin(c.TaskID, c.CorrelationID, time.Unix(c.ExpiresAt, 0), time.Now()); err != nil {
		t.Fatal(err)
	}

	a := startAgent(t, f, dir, h.handlers())
	posts := f.waitAccepted(t, c.TaskID, 1)
	res := posts[0].Result
	if res.Status != api.ResultFailed || res.Error == nil || res.Error.Code != "agent_restarted_during_task" ||
		res.CorrelationID != c.CorrelationID || res.FinishedAt.IsZero() {
		t.Errorf("result posted at start = %s", posts[0].Body)
	}
	d := deliveryFor(c, sign(t, f.signer, c))
	d.Attempt = 2
	f.enqueue(d)
	posts = f.waitAccepted(t, c.TaskID, 2)
	a.stop(t)
	if !bytes.Equal(posts[1].Body, posts[0].Body) {
		t.Errorf("redelivery re-posted a different result:\nnow:    %s\nbefore: %s", posts[1].Body, posts[0].Body)
	}
	if runs := h.runs.Load(); runs != 0 {
		t.Errorf("handler ran %d times, want never", runs)
	}
}

// waitPosted polls the agent's record of taskID until it is marked posted.
func waitPosted(t *testing.T, stateDir, taskID string) {
	t.Helper()
	eventually(t, "task "+taskID+" marked posted in the spool", func() bool {
		return readTaskRecord(t, stateDir, taskID).Posted
	})
}

// readTaskRecord reads the agent's on-disk record of taskID.
func readTaskRecord(t *testing.T, stateDir, taskID string) statedir.TaskRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "tasks", taskID+".json"))
	if err != nil {
		t.Fatalf("read task record: %v", err)
	}
	var rec statedir.TaskRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatalf("decode task record: %v", err)
	}
	return rec
}

// TestHeartbeatRateLimited answers one heartbeat with 429 and Retry-After:
// 1: the next heartbeat waits at least a second and reports
// edge_rate_limited, and the one after that is clean again.
func TestHeartbeatRateLimited(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	const limited = 3
	f.setHeartbeatStatus(func(n int) int {
		if n == limited {
			return http.StatusTooManyRequests
		}
		return http.StatusOK
	})
	a := startAgent(t, f, t.TempDir(), (&counter{}).handlers())
	eventually(t, "two heartbeats after the rate-limited one", func() bool { return len(f.heartbeatLog()) >= limited+2 })
	a.stop(t)

	hbs := f.heartbeatLog()
	for i, hb := range hbs[:limited] {
		if hb.HB.Diagnostic != "" {
			t.Errorf("heartbeat %d carried diagnostic %q before any rate limit", i+1, hb.HB.Diagnostic)
		}
	}
	limitedHB, next, after := hbs[limited-1], hbs[limited], hbs[limited+1]
	if limitedHB.Status != http.StatusTooManyRequests {
		t.Fatalf("heartbeat %d answered %d, want 429", limited, limitedHB.Status)
	}
	if gap := next.At.Sub(limitedHB.At); gap < time.Second {
		t.Errorf("heartbeat after a 429 with Retry-After: 1 came %s later, want >= 1s", gap)
	} else if gap > 5*time.Second {
		t.Errorf("heartbeat after a 429 with Retry-After: 1 came %s later, want about 1s", gap)
	}
	if next.Status != http.StatusOK || next.HB.Diagnostic != string(signal.EdgeRateLimited) {
		t.Errorf("heartbeat after the 429: status %d diagnostic %q, want 200 with edge_rate_limited", next.Status, next.HB.Diagnostic)
	}
	if after.HB.Diagnostic != "" {
		t.Errorf("second heartbeat after the 429 carried diagnostic %q, want it cleared", after.HB.Diagnostic)
	}
	if gap := after.At.Sub(next.At); gap >= time.Second {
		t.Errorf("heartbeat interval after recovery is %s, want back to about 100ms", gap)
	}
}

// TestCapabilitiesReported: after enrolment the agent reports its
// capabilities (total system memory, the accelerators that work), and
// then calls its memory release (WithMemoryRelease) after the reading.
func TestCapabilitiesReported(t *testing.T) {
	f := newFakeCP(t)
	var released atomic.Int64
	startAgent(t, f, t.TempDir(), agent.Handlers{}, agent.WithMemoryRelease(func(*slog.Logger) { released.Add(1) }))
	eventually(t, "the memory release after the first host reading", func() bool { return released.Load() == 1 })
	var got api.Capabilities
	eventually(t, "a capabilities report", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.caps) == 0 {
			return false
		}
		got = f.caps[len(f.caps)-1]
		return true
	})
	if got.RAMTotalMB < 256 || got.CPUCores < 1 || got.OSFamily != api.OSLinux {
		t.Fatalf("capabilities %+v", got)
	}
	if len(got.Accelerators) != 1 || got.Accelerators[0] != "tcg" || got.SelectedAccel != "tcg" || got.AccelError != "" {
		t.Fatalf("accelerators %v selected %q error %q; want [tcg], tcg, none", got.Accelerators, got.SelectedAccel, got.AccelError)
	}
}
