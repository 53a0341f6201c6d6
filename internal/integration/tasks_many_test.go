package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestWaitClaimsMany: GET .../tasks/wait?max=N claims up to N of the
// caller's own tasks, oldest first, each in an envelope signed for it,
// audited as a single claim is; ?max= is checked and capped at
// api.MaxClaim.
func TestWaitClaimsMany(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t))
			n := e.enroll("node-m", e.createHost("node-m").Token)
			o := e.enroll("node-o", e.createHost("node-o").Token)
			wait := func(id string, c *http.Client, query string) (int, []api.TaskDelivery, []byte) {
				st, _, body := e.nodeCall(c, http.MethodGet, nodePath(id, "/tasks/wait?timeout=200ms"+query), nil)
				var d api.TaskDelivery
				if st != http.StatusOK {
					return st, nil, body
				}
				if err := json.Unmarshal(body, &d); err != nil {
					t.Fatal(err)
				}
				all := append([]api.TaskDelivery{d}, d.More...)
				all[0].More = nil
				for _, m := range d.More {
					if len(m.More) > 0 {
						t.Fatalf("delivery %s has a More of its own", m.TaskID)
					}
				}
				return st, all, body
			}
			var jwks api.JWKS
			if st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-m", "/jwks"), nil); st != http.StatusOK {
				t.Fatalf("jwks: %d %s", st, body)
			} else if err := json.Unmarshal(body, &jwks); err != nil {
				t.Fatal(err)
			}
			v, err := task.NewVerifier(jwks)
			if err != nil {
				t.Fatal(err)
			}

			for _, q := range []string{"&max=0", "&max=-2", "&max=two", "&max=1.5"} {
				st, code, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-m", "/tasks/wait?timeout=100ms"+q), nil)
				var eb api.ErrorBody
				_ = json.Unmarshal(body, &eb)
				if st != http.StatusUnprocessableEntity || code != "invalid_payload" || len(eb.Error.Fields) != 1 || eb.Error.Fields[0].Field != "max" {
					t.Fatalf("wait%s: %d %s, want a 422 naming max", q, st, body)
				}
			}

			var want []string
			for range 5 {
				want = append(want, e.enqueue("node-m", "diag.health_probe", nil).ID)
				time.Sleep(2 * time.Millisecond) // created_at is in milliseconds; ties go by id
			}
			other := e.enqueue("node-o", "diag.health_probe", nil)

			var got []string
			for _, max := range []string{"&max=3", "", "&max=5"} {
				st, ds, body := wait("node-m", n.client, max)
				if st != http.StatusOK {
					t.Fatalf("wait%s: %d %s", max, st, body)
				}
				if limit := map[string]int{"&max=3": 3, "": 1, "&max=5": 1}[max]; len(ds) != limit {
					t.Fatalf("wait%s delivered %d tasks, want %d", max, len(ds), limit)
				}
				for _, d := range ds {
					c, err := v.Verify(d.Envelope, "node-m", time.Now())
					if err != nil {
						t.Fatalf("delivery %s: %v", d.TaskID, err)
					}
					if err := task.CheckDelivery(d, c); err != nil || d.Attempt != 1 {
						t.Fatalf("delivery %+v: %v", d, err)
					}
					if _, err := v.Verify(d.Envelope, "node-o", time.Now()); err == nil {
						t.Fatalf("envelope of %s verifies for another node", d.TaskID)
					}
					got = append(got, d.TaskID)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("claimed %v, want %v (oldest first)", got, want)
			}
			for _, id := range want {
				if !e.auditHas("task.claim", id, "dispatched") {
					t.Fatalf("claim of %s not audited", id)
				}
			}
			if st, _, _ := wait("node-m", n.client, "&max=5"); st != http.StatusNoContent {
				t.Fatalf("wait on an empty queue: %d, want 204", st)
			}
			if st, ds, _ := wait("node-o", o.client, "&max=5"); st != http.StatusOK || len(ds) != 1 || ds[0].TaskID != other.ID {
				t.Fatalf("other node's wait: %d %+v", st, ds)
			}

			// ?max= above api.MaxClaim claims api.MaxClaim.
			for range api.MaxClaim + 3 {
				e.enqueue("node-m", "diag.health_probe", nil)
			}
			if st, ds, body := wait("node-m", n.client, "&max=1000"); st != http.StatusOK || len(ds) != api.MaxClaim {
				t.Fatalf("wait&max=1000: %d, %d tasks, want %d: %s", st, len(ds), api.MaxClaim, body)
			}
		})
	}
}

// TestPostResults: POST .../tasks/results records each result as POST
// .../tasks/{id}/result would and answers each on its own: accepted,
// replayed, conflicting, another node's task, an unknown one, an invalid
// one. A body that is not 1 to api.MaxResultBatch distinct tasks is
// refused whole, recording nothing.
func TestPostResults(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := startEnv(t, b.open(t))
			n := e.enroll("node-r", e.createHost("node-r").Token)
			e.enroll("node-s", e.createHost("node-s").Token)
			post := func(items []api.TaskResultFor) (int, string, nodeapi.ResultsAck, []byte) {
				st, code, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-r", "/tasks/results"), api.TaskResults{Results: items})
				var ack nodeapi.ResultsAck
				if st == http.StatusOK {
					if err := json.Unmarshal(body, &ack); err != nil {
						t.Fatal(err)
					}
				}
				return st, code, ack, body
			}
			ok := func(cid string) api.TaskResult {
				return api.TaskResult{Status: api.ResultSucceeded, Output: json.RawMessage(`{"ok":true}`), CorrelationID: cid,
					FinishedAt: time.Now().UTC().Truncate(time.Millisecond)}
			}
			var mine []api.Task
			for range 4 {
				mine = append(mine, e.enqueue("node-r", "diag.health_probe", nil))
			}
			theirs := e.enqueue("node-s", "diag.health_probe", nil)
			if st, _, body := e.nodeCall(n.client, http.MethodGet, nodePath("node-r", "/tasks/wait?timeout=1s&max=4"), nil); st != http.StatusOK {
				t.Fatalf("wait: %d %s", st, body)
			}
			first := ok(mine[0].CorrelationID)
			if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-r", "/tasks/"+mine[0].ID+"/result"), first); st != http.StatusOK {
				t.Fatalf("single result: %d %s", st, body)
			}
			conflict := api.TaskResult{Status: api.ResultFailed, Error: &api.ResultError{Code: "x", Message: "y"}, CorrelationID: mine[1].CorrelationID}
			if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("node-r", "/tasks/"+mine[1].ID+"/result"), ok(mine[1].CorrelationID)); st != http.StatusOK {
				t.Fatalf("single result: %d %s", st, body)
			}
			failed := api.TaskResult{Status: api.ResultFailed, Error: &api.ResultError{Code: "disk_full", Message: "no space"}, CorrelationID: mine[3].CorrelationID}

			items := []api.TaskResultFor{
				{TaskID: mine[0].ID, Result: first},                                 // the same result again: 200
				{TaskID: mine[1].ID, Result: conflict},                              // a different one for a finished task: 409
				{TaskID: mine[2].ID, Result: ok(mine[2].CorrelationID)},             // 200 succeeded
				{TaskID: mine[3].ID, Result: failed},                                // 200 failed
				{TaskID: theirs.ID, Result: ok(theirs.CorrelationID)},               // another node's task: 404
				{TaskID: "tsk_nope", Result: ok("")},                                // unknown: 404
				{TaskID: mine[2].ID + "x", Result: api.TaskResult{Status: "maybe"}}, // invalid: 422 naming status
			}
			st, _, ack, body := post(items)
			if st != http.StatusOK || len(ack.Results) != len(items) {
				t.Fatalf("results: %d %s", st, body)
			}
			want := []struct {
				status int
				state  api.TaskState
				code   string
			}{{200, api.TaskSucceeded, ""}, {409, "", "task_conflict"}, {200, api.TaskSucceeded, ""}, {200, api.TaskFailed, ""},
				{404, "", "task_not_found"}, {404, "", "task_not_found"}, {422, "", "invalid_payload"}}
			for i, w := range want {
				got := ack.Results[i]
				code := ""
				if got.Error != nil {
					code = got.Error.Code
				}
				if got.TaskID != items[i].TaskID || got.Status != w.status || got.State != w.state || code != w.code {
					t.Errorf("result %d (%s): %+v %+v, want %d %q %q", i, items[i].TaskID, got, got.Error, w.status, w.state, w.code)
				}
			}
			if f := ack.Results[6].Error; f == nil || len(f.Fields) != 1 || f.Fields[0].Field != "status" {
				t.Errorf("invalid result's error %+v, want the status field named", f)
			}
			for id, state := range map[string]api.TaskState{mine[0].ID: api.TaskSucceeded, mine[1].ID: api.TaskSucceeded,
				mine[2].ID: api.TaskSucceeded, mine[3].ID: api.TaskFailed, theirs.ID: api.TaskQueued} {
				var got api.Task
				if e.op(http.MethodGet, "/api/v1/tasks/"+id, nil, &got); got.State != state {
					t.Errorf("task %s is %s, want %s", id, got.State, state)
				}
			}
			if !e.auditHas("task.result", theirs.ID, "refused") || !e.auditHas("task.result", mine[2].ID, "succeeded") {
				t.Error("results not audited as single results are")
			}

			// Refused whole, nothing recorded.
			late := e.enqueue("node-r", "diag.health_probe", nil)
			many := make([]api.TaskResultFor, api.MaxResultBatch+1)
			for i := range many {
				many[i] = api.TaskResultFor{TaskID: fmt.Sprintf("tsk_%d", i), Result: ok("")}
			}
			many[0].TaskID = late.ID
			for name, tc := range map[string]struct {
				items []api.TaskResultFor
				field string
			}{
				"empty":      {nil, "results"},
				"too many":   {many, "results"},
				"twice":      {[]api.TaskResultFor{{TaskID: late.ID, Result: ok("")}, {TaskID: late.ID, Result: ok("")}}, "results[1].task_id"},
				"no task id": {[]api.TaskResultFor{{TaskID: late.ID, Result: ok("")}, {Result: ok("")}}, "results[1].task_id"},
			} {
				st, code, _, body := post(tc.items)
				var eb api.ErrorBody
				_ = json.Unmarshal(body, &eb)
				if st != http.StatusUnprocessableEntity || code != "invalid_payload" || len(eb.Error.Fields) != 1 || eb.Error.Fields[0].Field != tc.field {
					t.Errorf("%s: %d %s, want 422 naming %s", name, st, body, tc.field)
				}
			}
			var got api.Task
			if e.op(http.MethodGet, "/api/v1/tasks/"+late.ID, nil, &got); got.State != api.TaskQueued {
				t.Errorf("refused batch recorded a result: task is %s", got.State)
			}
		})
	}
}
