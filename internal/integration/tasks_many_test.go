package integration

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
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
