package agent

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Bounds of the agent's in-memory diagnostics.
const (
	maxEvents       = 512
	maxLogLines     = 2000
	maxLogBytes     = 512 << 10
	maxDetailLength = 512
)

// Request operations, the sources of problems.
const (
	opHeartbeat = "heartbeat"
	opTaskPoll  = "task_poll"
	opVerify    = "task_verify"
	opResult    = "result_post"
	opRenew     = "renew"
	opEnrol     = "enrol"
	opDisk      = "disk"
	opWrite     = "write"
)

// problem is one active condition.
type problem struct {
	detail, cid, op string
	since, seen     time.Time
}

// diagnostics holds the agent's active problems and a bounded ring of
// diagnostic events. Safe for concurrent use.
type diagnostics struct {
	now    func() time.Time
	mu     sync.Mutex
	active map[signal.Name]problem
	events []task.DiagnosticEvent // oldest first, at most maxEvents
}

func newDiagnostics(now func() time.Time) *diagnostics {
	return &diagnostics{now: now, active: map[signal.Name]problem{}}
}

// priority orders active problems: the first one present is the current.
func priority() []signal.Name {
	return []signal.Name{signal.AuthFailed, signal.BinaryInvalid, signal.APITLSFailed, signal.APIUnreachable,
		signal.EdgeRateLimited, signal.DiskFull, signal.DiskPressure, signal.TaskResultPostFailed, signal.TaskClaimFailed}
}

// report records that op saw n. A new problem, or a new detail, is an event.
func (d *diagnostics) report(n signal.Name, op, detail, cid string) {
	if len(detail) > maxDetailLength {
		detail = detail[:maxDetailLength] + "…"
	}
	now := d.now().UTC()
	d.mu.Lock()
	defer d.mu.Unlock()
	p, was := d.active[n]
	if !was {
		p.since = now
	}
	changed := !was || p.detail != detail
	p.detail, p.op, p.seen = detail, op, now
	if cid != "" {
		p.cid = cid
	}
	d.active[n] = p
	if changed {
		d.appendEvent(task.DiagnosticEvent{At: now, Signal: string(n), Detail: detail, CorrelationID: cid})
	}
}

// clear ends n, with an event, when it is active.
func (d *diagnostics) clear(n signal.Name) {
	d.clearIf(func(m signal.Name, _ problem) bool { return m == n })
}

// clearIf ends every active problem for which fn is true.
func (d *diagnostics) clearIf(fn func(signal.Name, problem) bool) {
	now := d.now().UTC()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range priority() {
		p, ok := d.active[n]
		if !ok || !fn(n, p) {
			continue
		}
		delete(d.active, n)
		d.appendEvent(task.DiagnosticEvent{At: now, Signal: string(n), Detail: "cleared after " +
			now.Sub(p.since).Round(time.Millisecond).String() + ": " + p.detail, CorrelationID: p.cid, Cleared: true})
	}
}

func (d *diagnostics) appendEvent(ev task.DiagnosticEvent) {
	if len(d.events) >= maxEvents {
		d.events = slices.Delete(d.events, 0, len(d.events)-maxEvents+1)
	}
	d.events = append(d.events, ev)
}

// current is the most important active problem.
func (d *diagnostics) current() (signal.Name, problem, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range priority() {
		if p, ok := d.active[n]; ok {
			return n, p, true
		}
	}
	return "", problem{}, false
}

// has reports whether n is active.
func (d *diagnostics) has(n signal.Name) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.active[n]
	return ok
}

// eventsCopy returns the events, oldest first.
func (d *diagnostics) eventsCopy() []task.DiagnosticEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.events)
}

// shrink drops the older half of the events (disk pressure).
func (d *diagnostics) shrink() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.events) / 2
	d.events = slices.Delete(d.events, 0, n)
	return n
}

// logRing keeps the agent's recent log lines (one JSON record each),
// bounded by count and bytes, with the given secret values masked. It is
// the io.Writer of a slog.JSONHandler, which writes one record per call.
type logRing struct {
	mu       sync.Mutex
	lines    []string // oldest first
	bytes    int
	maxLines int
	maxBytes int
	secrets  []string
}

func newLogRing(maxLines, maxBytes int, secrets ...string) *logRing {
	r := &logRing{maxLines: maxLines, maxBytes: maxBytes}
	for _, s := range secrets {
		if len(s) >= 4 {
			r.secrets = append(r.secrets, s)
		}
	}
	return r
}

// Write appends p's lines.
func (r *logRing) Write(p []byte) (int, error) {
	n := len(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	for line := range bytes.SplitSeq(bytes.TrimRight(p, "\n"), []byte("\n")) {
		s := string(line)
		for _, sec := range r.secrets {
			s = strings.ReplaceAll(s, sec, redacted)
		}
		if len(s) > r.maxBytes {
			s = s[:r.maxBytes]
		}
		r.lines = append(r.lines, s)
		r.bytes += len(s)
	}
	drop := 0
	for len(r.lines)-drop > r.maxLines || r.bytes > r.maxBytes {
		r.bytes -= len(r.lines[drop])
		drop++
	}
	r.lines = slices.Delete(r.lines, 0, drop)
	return n, nil
}

// Lines returns the lines, oldest first.
func (r *logRing) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines)
}

// shrink drops the older half of the lines (disk pressure).
func (r *logRing) shrink() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.lines) / 2
	for _, l := range r.lines[:n] {
		r.bytes -= len(l)
	}
	r.lines = slices.Delete(r.lines, 0, n)
	return n
}

// redacted replaces secrets in the log ring.
const redacted = "[redacted]"

// secretKey reports whether a log attribute's key names a credential.
func secretKey(key string) bool {
	k := strings.ToLower(key)
	for _, s := range []string{"token", "secret", "password", "private", "key_pem", "authorization", "nonce"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}
