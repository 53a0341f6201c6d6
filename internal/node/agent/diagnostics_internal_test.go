package agent

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestLogRingBoundsAndSecrets: the ring keeps the newest lines within its
// line and byte bounds, and never stores a credential: attributes named
// like one are masked, and the bootstrap token's value is replaced
// wherever it appears.
func TestLogRingBoundsAndSecrets(t *testing.T) {
	const token = "bt-super-secret-value"
	ring := newLogRing(10, 2000, token)
	log := slog.New(slog.NewJSONHandler(ring, &slog.HandlerOptions{ReplaceAttr: redactAttr}))
	for i := range 25 {
		log.Info("line", "n", i)
	}
	lines := ring.Lines()
	if len(lines) != 10 || !strings.Contains(lines[0], `"n":15`) || !strings.Contains(lines[9], `"n":24`) {
		t.Fatalf("ring kept %d lines, first %q last %q; want the newest 10", len(lines), lines[0], lines[len(lines)-1])
	}
	log.Info("enrol with "+token, "bootstrap_token", token, "key_pem", "-----BEGIN PRIVATE KEY-----", "Authorization", "Bearer x",
		"nonce", "n-123", "url", "https://cp?t="+token)
	last := ring.Lines()[len(ring.Lines())-1]
	for _, secret := range []string{token, "BEGIN PRIVATE KEY", "Bearer x", "n-123"} {
		if strings.Contains(last, secret) {
			t.Errorf("log ring stored %q: %s", secret, last)
		}
	}
	if !strings.Contains(last, redacted) {
		t.Errorf("no redaction marker in %s", last)
	}
	big := newLogRing(1000, 300)
	for i := range 20 {
		fmt.Fprintf(big, "%s%d\n", strings.Repeat("x", 40), i)
	}
	total := 0
	for _, l := range big.Lines() {
		total += len(l)
	}
	if total > 300 || !strings.HasSuffix(big.Lines()[len(big.Lines())-1], "19") {
		t.Errorf("byte bound: %d bytes kept, last %q", total, big.Lines()[len(big.Lines())-1])
	}
	if n := big.shrink(); n == 0 || len(big.Lines()) == 0 {
		t.Errorf("shrink dropped %d", n)
	}
}

// TestDiagnosticsEvents: a problem is one event until its detail changes,
// clearing it is an event marked cleared, and the current problem follows
// the priority order.
func TestDiagnosticsEvents(t *testing.T) {
	now := time.Date(2026, 5, 25, 10, 0, 0, 0, time.UTC)
	d := newDiagnostics(func() time.Time { return now })
	d.report(signal.TaskResultPostFailed, opResult, "1 results spooled", "cid-r")
	d.report(signal.APIUnreachable, opHeartbeat, "refused: cp:8443", "")
	d.report(signal.APIUnreachable, opHeartbeat, "refused: cp:8443", "")
	if n, p, _ := d.current(); n != signal.APIUnreachable || !p.since.Equal(now) {
		t.Errorf("current = %s since %v", n, p.since)
	}
	now = now.Add(time.Minute)
	d.clear(signal.APIUnreachable)
	if n, _, _ := d.current(); n != signal.TaskResultPostFailed {
		t.Errorf("current after clearing = %s", n)
	}
	evs := d.eventsCopy()
	if len(evs) != 3 || !evs[2].Cleared || evs[2].Signal != string(signal.APIUnreachable) || !strings.Contains(evs[2].Detail, "1m0s") {
		t.Errorf("events %+v", evs)
	}
	for i := range maxEvents + 10 {
		d.report(signal.DiskPressure, opDisk, fmt.Sprint(i), "")
	}
	if len(d.eventsCopy()) != maxEvents {
		t.Errorf("events not bounded: %d", len(d.eventsCopy()))
	}
}

// TestBoundCollect: the output fits MaxBytes, keeps the newest, keeps the
// lines and events of the asked correlation id first, and stays oldest
// first.
func TestBoundCollect(t *testing.T) {
	at := time.Date(2026, 5, 25, 10, 0, 0, 0, time.UTC)
	var events []task.DiagnosticEvent
	var lines []string
	for i := range 100 {
		cid := ""
		if i == 3 {
			cid = "cid-old"
		}
		events = append(events, task.DiagnosticEvent{At: at.Add(time.Duration(i) * time.Second), Signal: string(signal.APIUnreachable),
			Detail: fmt.Sprint("event ", i), CorrelationID: cid})
		line := fmt.Sprintf(`{"msg":"line %03d"}`, i)
		if i == 5 {
			line = `{"msg":"line 005","correlation_id":"cid-old"}`
		}
		lines = append(lines, line)
	}
	all, allLines, truncated := boundCollect(events, lines, task.MaxCollectBytes, "")
	if truncated || len(all) != 100 || len(allLines) != 100 {
		t.Fatalf("everything fits: %d events %d lines truncated %v", len(all), len(allLines), truncated)
	}
	const limit = 2000
	evs, ls, truncated := boundCollect(events, lines, limit, "cid-old")
	if !truncated {
		t.Error("not marked truncated")
	}
	size := 0
	for _, l := range ls {
		size += len(l) + 3
	}
	if size > limit {
		t.Errorf("lines alone are %d bytes > %d", size, limit)
	}
	if len(evs) == 0 || evs[0].CorrelationID != "cid-old" {
		t.Errorf("the correlation id's event was not kept first: %+v", evs)
	}
	if evs[len(evs)-1].Detail != "event 99" {
		t.Errorf("newest event dropped: %+v", evs[len(evs)-1])
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].At.Before(evs[i-1].At) {
			t.Fatalf("events not oldest first")
		}
	}
	if len(ls) > 0 && !strings.Contains(ls[0], "cid-old") && !strings.Contains(strings.Join(ls, ""), "cid-old") {
		t.Errorf("the correlation id's line was dropped: %v", ls)
	}
	if e, l, _ := boundCollect(events, lines, 10, ""); len(e) != 0 || len(l) != 0 {
		t.Errorf("10 bytes kept %d events %d lines", len(e), len(l))
	}
}
