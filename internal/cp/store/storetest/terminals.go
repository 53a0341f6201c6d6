package storetest

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

var terminalCases = []testCase{
	{"Terminal/CreateGetRoundTrip", testTerminalRoundTrip},
	{"Terminal/CreateDefaults", testTerminalDefaults},
	{"Terminal/CreateConflict", testTerminalConflict},
	{"Terminal/GetNotFound", testTerminalNotFound},
	{"Terminal/List", testTerminalList},
	{"Terminal/Update", testTerminalUpdate},
	{"Terminal/UpdateFnError", testTerminalUpdateFnError},
	{"Terminal/Redeem", testTerminalRedeem},
	{"Terminal/RedeemExpired", testTerminalRedeemExpired},
	{"Terminal/RedeemConcurrent", testTerminalRedeemConcurrent},
	{"Terminal/TimestampsUTC", testTerminalTimestampsUTC},
	{"OperatorToken/GetAndRevokeEvent", testOperatorTokenRevokeEvent},
}

func newTerminal(id, alloc, hash string, created time.Duration) store.TerminalSession {
	return store.TerminalSession{
		ID:             id,
		AllocationID:   alloc,
		NodeID:         "h1",
		Username:       "alice",
		Mode:           "pty",
		TokenHash:      hash,
		TokenExpiresAt: at(created + time.Minute),
		State:          "token_ready",
		CorrelationID:  "corr-" + id,
		Cols:           80,
		Rows:           24,
		CreatedAt:      at(created),
	}
}

func fullTerminal(id string) store.TerminalSession {
	return store.TerminalSession{
		ID:             id,
		AllocationID:   "a-1",
		NodeID:         "h1",
		Username:       "console",
		Mode:           "serial",
		InstanceID:     "i-1",
		TokenHash:      "hash-" + id,
		TokenExpiresAt: at(time.Minute),
		TokenUsedAt:    at(time.Second),
		State:          "failed",
		States:         json.RawMessage(`[{"state":"token_ready","at":"2025-03-01T12:00:00Z","elapsed_ms":0}]`),
		ErrorCode:      "terminal_pty_failed",
		ErrorMessage:   "openpty: no devices",
		TaskID:         "t-open",
		CorrelationID:  "corr-1",
		Cols:           200,
		Rows:           50,
		CreatedBy:      "operator:x",
		CreatedAt:      base,
		ClosedAt:       at(2 * time.Second),
		ExitCode:       -1,
		Exited:         true,
		CloseReason:    "terminal_pty_failed",
		RecordingPath:  "/var/lib/drover/rec/" + id + ".cast",
		RecordingBytes: 1 << 33,

		MintedByTokenID: "tok-1",
	}
}

func createTerminal(t *testing.T, s store.Store, ts store.TerminalSession) {
	t.Helper()
	must(t, s.CreateTerminalSession(ctxT(t), ts))
}

func terminalID(ts store.TerminalSession) string { return ts.ID }

func testTerminalRoundTrip(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for _, ts := range []store.TerminalSession{fullTerminal("s-full"), newTerminal("s-min", "a-1", "hash-min", 0)} {
		createTerminal(t, s, ts)
		got, err := s.GetTerminalSession(ctx, ts.ID)
		must(t, err)
		diff(t, "session "+ts.ID, got, ts)
	}
}

func testTerminalDefaults(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	before := time.Now().Add(-time.Second)
	must(t, s.CreateTerminalSession(ctx, store.TerminalSession{ID: "s-1", AllocationID: "a-1", Mode: "pty", TokenHash: "h"}))
	got, err := s.GetTerminalSession(ctx, "s-1")
	must(t, err)
	if got.State != "token_ready" {
		t.Errorf("default state %q, want token_ready", got.State)
	}
	if got.CreatedAt.Before(before) || got.CreatedAt.Location() != time.UTC {
		t.Errorf("CreatedAt %v, want now in UTC", got.CreatedAt)
	}
	if got.States != nil || !got.TokenUsedAt.IsZero() || !got.ClosedAt.IsZero() || got.Exited {
		t.Errorf("empty fields read back as %q %v %v %v", got.States, got.TokenUsedAt, got.ClosedAt, got.Exited)
	}
	ok := store.TerminalSession{ID: "s-x", AllocationID: "a-1", Mode: "pty", TokenHash: "hx"}
	for name, mutate := range map[string]func(*store.TerminalSession){
		"no id":         func(ts *store.TerminalSession) { ts.ID = "" },
		"no allocation": func(ts *store.TerminalSession) { ts.AllocationID = "" },
		"no token hash": func(ts *store.TerminalSession) { ts.TokenHash = "" },
		"no mode":       func(ts *store.TerminalSession) { ts.Mode = "" },
		"bad mode":      func(ts *store.TerminalSession) { ts.Mode = "ssh" },
		"bad state":     func(ts *store.TerminalSession) { ts.State = "closed" },
	} {
		bad := ok
		mutate(&bad)
		if err := s.CreateTerminalSession(ctx, bad); err == nil {
			t.Errorf("%s: CreateTerminalSession(%+v) accepted", name, bad)
		}
	}
	if _, err := s.GetTerminalSession(ctx, "s-x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused create left a record: %v", err)
	}
}

func testTerminalConflict(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createTerminal(t, s, newTerminal("s-1", "a-1", "hash-1", 0))
	wantErr(t, s.CreateTerminalSession(ctx, newTerminal("s-1", "a-1", "hash-2", 0)), store.ErrConflict)
	wantErr(t, s.CreateTerminalSession(ctx, newTerminal("s-2", "a-1", "hash-1", 0)), store.ErrConflict)
	got, err := s.ListTerminalSessions(ctx, store.TerminalSessionFilter{})
	must(t, err)
	diff(t, "ids", ids(got, terminalID), []string{"s-1"})
}

func testTerminalNotFound(t *testing.T, s store.Store) {
	_, err := s.GetTerminalSession(ctxT(t), "s-nope")
	wantErr(t, err, store.ErrNotFound)
}

func testTerminalList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	got, err := s.ListTerminalSessions(ctx, store.TerminalSessionFilter{})
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("empty store lists %d sessions", len(got))
	}
	onH2 := newTerminal("s-4", "a-2", "hash-4", 4*time.Second)
	onH2.NodeID, onH2.TaskID = "h2", "t-9"
	for _, ts := range []store.TerminalSession{
		newTerminal("s-2", "a-1", "hash-2", 2*time.Second),
		newTerminal("s-1", "a-1", "hash-1", time.Second),
		onH2,
		newTerminal("s-3", "a-1", "hash-3", 2*time.Second), // same time as s-2: id breaks the tie
		newTerminal("s-5", "a-2", "hash-5", 5*time.Second),
	} {
		createTerminal(t, s, ts)
	}
	for _, tt := range []struct {
		name string
		f    store.TerminalSessionFilter
		want []string
	}{
		{"all newest first", store.TerminalSessionFilter{}, []string{"s-5", "s-4", "s-3", "s-2", "s-1"}},
		{"limit", store.TerminalSessionFilter{Limit: 2}, []string{"s-5", "s-4"}},
		{"allocation", store.TerminalSessionFilter{AllocationID: "a-1"}, []string{"s-3", "s-2", "s-1"}},
		{"allocation limit", store.TerminalSessionFilter{AllocationID: "a-1", Limit: 1}, []string{"s-3"}},
		{"node", store.TerminalSessionFilter{NodeID: "h2"}, []string{"s-4"}},
		{"allocation and node", store.TerminalSessionFilter{AllocationID: "a-2", NodeID: "h1"}, []string{"s-5"}},
		{"unknown allocation", store.TerminalSessionFilter{AllocationID: "a-9"}, []string{}},
		{"correlation", store.TerminalSessionFilter{CorrelationID: "corr-s-4"}, []string{"s-4"}},
		{"task", store.TerminalSessionFilter{TaskID: "t-9"}, []string{"s-4"}},
	} {
		got, err := s.ListTerminalSessions(ctx, tt.f)
		must(t, err)
		diff(t, "list "+tt.name, ids(got, terminalID), tt.want)
	}
}

func testTerminalUpdate(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createTerminal(t, s, newTerminal("s-1", "a-1", "hash-1", 0))
	states := json.RawMessage(`[{"state":"token_ready","at":"2025-03-01T12:00:00Z","elapsed_ms":0},` +
		`{"state":"pty_ready","at":"2025-03-01T12:00:01Z","elapsed_ms":1000}]`)
	got, err := s.UpdateTerminalSession(ctx, "s-1", func(ts *store.TerminalSession) error {
		ts.ID, ts.CreatedAt, ts.TokenHash = "s-ignored", at(time.Hour), "hash-ignored"
		ts.State, ts.States, ts.TaskID = "pty_ready", states, "t-open"
		ts.ClosedAt, ts.ExitCode, ts.Exited, ts.CloseReason = at(time.Minute), 3, true, "exit"
		ts.RecordingPath, ts.RecordingBytes, ts.Cols, ts.Rows = "/rec/s-1.cast", 4096, 120, 40
		return nil
	})
	must(t, err)
	want := newTerminal("s-1", "a-1", "hash-1", 0)
	want.State, want.States, want.TaskID = "pty_ready", states, "t-open"
	want.ClosedAt, want.ExitCode, want.Exited, want.CloseReason = at(time.Minute), 3, true, "exit"
	want.RecordingPath, want.RecordingBytes, want.Cols, want.Rows = "/rec/s-1.cast", 4096, 120, 40
	diff(t, "updated session", got, want)
	stored, err := s.GetTerminalSession(ctx, "s-1")
	must(t, err)
	diff(t, "stored session", stored, want)
	if _, err := s.GetTerminalSession(ctx, "s-ignored"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fn renamed the id: %v", err)
	}
	_, err = s.RedeemTerminalToken(ctx, "hash-ignored", at(time.Second))
	wantErr(t, err, store.ErrNotFound)

	// A redeemed token stays redeemed whatever fn does.
	_, err = s.RedeemTerminalToken(ctx, "hash-1", at(time.Second))
	must(t, err)
	got, err = s.UpdateTerminalSession(ctx, "s-1", func(ts *store.TerminalSession) error {
		ts.TokenUsedAt = time.Time{}
		return nil
	})
	must(t, err)
	if !got.TokenUsedAt.Equal(at(time.Second)) {
		t.Fatalf("TokenUsedAt after fn cleared it: %v, want %v", got.TokenUsedAt, at(time.Second))
	}
	_, err = s.RedeemTerminalToken(ctx, "hash-1", at(2*time.Second))
	wantErr(t, err, store.ErrConflict)

	called := false
	_, err = s.UpdateTerminalSession(ctx, "s-nope", func(*store.TerminalSession) error { called = true; return nil })
	wantErr(t, err, store.ErrNotFound)
	if called {
		t.Error("fn called for a missing session")
	}
}

func testTerminalUpdateFnError(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	ts := newTerminal("s-1", "a-1", "hash-1", 0)
	createTerminal(t, s, ts)
	boom := errors.New("boom")
	_, err := s.UpdateTerminalSession(ctx, "s-1", func(ts *store.TerminalSession) error {
		ts.State, ts.ErrorCode = "failed", "x"
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want fn's error", err)
	}
	got, err := s.GetTerminalSession(ctx, "s-1")
	must(t, err)
	diff(t, "session after failed update", got, ts)
}

func testTerminalRedeem(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	_, err := s.RedeemTerminalToken(ctx, "hash-nope", at(time.Second))
	wantErr(t, err, store.ErrNotFound)
	_, err = s.RedeemTerminalToken(ctx, "", at(time.Second))
	wantErr(t, err, store.ErrNotFound)

	ts := newTerminal("s-1", "a-1", "hash-1", 0)
	createTerminal(t, s, ts)
	createTerminal(t, s, newTerminal("s-2", "a-1", "hash-2", 0))
	got, err := s.RedeemTerminalToken(ctx, "hash-1", at(10*time.Second))
	must(t, err)
	want := ts
	want.TokenUsedAt = at(10 * time.Second)
	diff(t, "redeemed session", got, want)
	stored, err := s.GetTerminalSession(ctx, "s-1")
	must(t, err)
	diff(t, "stored session", stored, want)

	_, err = s.RedeemTerminalToken(ctx, "hash-1", at(11*time.Second))
	wantErr(t, err, store.ErrConflict)
	stored, err = s.GetTerminalSession(ctx, "s-1")
	must(t, err)
	if !stored.TokenUsedAt.Equal(at(10 * time.Second)) {
		t.Fatalf("a refused redeem moved TokenUsedAt to %v", stored.TokenUsedAt)
	}
	// The other session's token is untouched.
	other, err := s.GetTerminalSession(ctx, "s-2")
	must(t, err)
	if !other.TokenUsedAt.IsZero() {
		t.Fatalf("redeeming hash-1 burned s-2's token at %v", other.TokenUsedAt)
	}
}

// testTerminalRedeemExpired: an expired token is burned and returned; the
// caller refuses it by TokenExpiresAt.
func testTerminalRedeemExpired(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	ts := newTerminal("s-1", "a-1", "hash-1", 0) // expires at base+1m
	createTerminal(t, s, ts)
	got, err := s.RedeemTerminalToken(ctx, "hash-1", at(time.Hour))
	must(t, err)
	if got.ID != "s-1" || !got.TokenUsedAt.Equal(at(time.Hour)) || !got.TokenExpiresAt.Equal(at(time.Minute)) {
		t.Fatalf("redeemed expired token: id %q used %v expires %v", got.ID, got.TokenUsedAt, got.TokenExpiresAt)
	}
	_, err = s.RedeemTerminalToken(ctx, "hash-1", at(time.Hour))
	wantErr(t, err, store.ErrConflict)
}

// testTerminalRedeemConcurrent: of several concurrent redeemers of one
// token exactly one wins; the others see ErrConflict.
func testTerminalRedeemConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for round := range 5 {
		id, hash := nth("s", round), nth("hash", round)
		createTerminal(t, s, newTerminal(id, "a-1", hash, 0))
		const workers = 8
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			mu    sync.Mutex
			wins  []store.TerminalSession
			other []error
		)
		for w := range workers {
			wg.Go(func() {
				<-start
				got, err := s.RedeemTerminalToken(ctx, hash, at(time.Duration(w+1)*time.Second))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins = append(wins, got)
				case !errors.Is(err, store.ErrConflict):
					other = append(other, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(other) > 0 {
			t.Fatalf("round %d: unexpected errors: %v", round, other)
		}
		if len(wins) != 1 {
			t.Fatalf("round %d: %d redeemers won, want exactly 1", round, len(wins))
		}
		stored, err := s.GetTerminalSession(ctx, id)
		must(t, err)
		if wins[0].ID != id || !stored.TokenUsedAt.Equal(wins[0].TokenUsedAt) || stored.TokenUsedAt.IsZero() {
			t.Fatalf("round %d: winner %q used %v, stored used %v", round, wins[0].ID, wins[0].TokenUsedAt, stored.TokenUsedAt)
		}
	}
}

func testTerminalTimestampsUTC(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	zone := time.FixedZone("UTC+9", 9*3600)
	local := time.Date(2025, 3, 1, 21, 0, 0, 555666777, zone)
	ts := newTerminal("s-1", "a-1", "hash-1", 0)
	ts.CreatedAt, ts.TokenExpiresAt, ts.ClosedAt = local, local, local
	createTerminal(t, s, ts)
	want := local.Truncate(time.Millisecond).UTC()
	check := func(what string, got store.TerminalSession, fields ...string) {
		t.Helper()
		all := map[string]time.Time{"CreatedAt": got.CreatedAt, "TokenExpiresAt": got.TokenExpiresAt,
			"ClosedAt": got.ClosedAt, "TokenUsedAt": got.TokenUsedAt}
		for _, name := range fields {
			if v := all[name]; v != want {
				t.Errorf("%s: %s = %v (%v), want %v UTC", what, name, v, v.Location(), want)
			}
		}
	}
	got, err := s.GetTerminalSession(ctx, "s-1")
	must(t, err)
	check("get", got, "CreatedAt", "TokenExpiresAt", "ClosedAt")
	got, err = s.RedeemTerminalToken(ctx, "hash-1", local)
	must(t, err)
	check("redeem", got, "CreatedAt", "TokenExpiresAt", "ClosedAt", "TokenUsedAt")
	list, err := s.ListTerminalSessions(ctx, store.TerminalSessionFilter{})
	must(t, err)
	check("list", list[0], "CreatedAt", "TokenExpiresAt", "ClosedAt", "TokenUsedAt")
	got, err = s.UpdateTerminalSession(ctx, "s-1", func(ts *store.TerminalSession) error { ts.ClosedAt = local; return nil })
	must(t, err)
	check("update", got, "CreatedAt", "TokenExpiresAt", "ClosedAt", "TokenUsedAt")
}

// testOperatorTokenRevokeEvent: GetOperatorToken finds a token by id, and
// revoking it publishes EventOperatorToken (gateways end the terminals it
// minted).
func testOperatorTokenRevokeEvent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	tok := store.OperatorToken{ID: "tok-1", Name: "alice", Role: "operator", TokenHash: "h-1", CreatedAt: base}
	must(t, s.CreateOperatorToken(ctx, tok))
	got, err := s.GetOperatorToken(ctx, "tok-1")
	must(t, err)
	diff(t, "token", got, tok)
	_, err = s.GetOperatorToken(ctx, "tok-nope")
	wantErr(t, err, store.ErrNotFound)

	ch := subscribe(t, s)
	wantErr(t, s.RevokeOperatorToken(ctx, "tok-nope"), store.ErrNotFound)
	must(t, s.RevokeOperatorToken(ctx, "tok-1"))
	waitEvent(t, ch, store.Event{Kind: store.EventOperatorToken, ID: "tok-1"})
	noEvent(t, ch, store.Event{Kind: store.EventOperatorToken, ID: "tok-nope"}, 200*time.Millisecond)
	got, err = s.GetOperatorToken(ctx, "tok-1")
	must(t, err)
	if !got.Revoked {
		t.Fatal("token not revoked")
	}
}
