package agent

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// CollectHandler runs diag.collect: the agent's status document, its recent
// diagnostic events and log lines, bounded by the params' MaxBytes (newest
// kept; those carrying the params' correlation id kept first). The log ring
// never holds credentials: attributes named like one are masked and the
// bootstrap token's value is replaced before a line is stored.
func (a *Agent) CollectHandler() Handler {
	return Handler{Timeout: task.CollectTimeout, Run: func(_ context.Context, t Task) (Outcome, error) {
		p, fe := task.DecodeCollectParams(t.Params)
		if fe != nil {
			return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
		}
		return Outcome{Output: a.collect(p)}, nil
	}}
}

// collect builds diag.collect's output.
func (a *Agent) collect(p task.CollectParams) task.CollectOutput {
	st, _ := a.Status()
	raw, _ := json.Marshal(st)
	out := task.CollectOutput{NodeID: a.nodeID, CollectedAt: a.now().UTC(), Status: raw}
	out.Events, out.Log, out.Truncated = boundCollect(a.diag.eventsCopy(), a.logs.Lines(), p.MaxBytes, p.CorrelationID)
	return out
}

// boundCollect keeps events and lines (both oldest first) within maxBytes:
// first those carrying cid (newest first), then the newest others; what is
// kept stays oldest first. truncated is true when anything was dropped.
func boundCollect(events []task.DiagnosticEvent, lines []string, maxBytes int, cid string) ([]task.DiagnosticEvent, []string, bool) {
	keepEv, keepLn := make([]bool, len(events)), make([]bool, len(lines))
	left, truncated := maxBytes, false
	evSize := func(i int) int {
		b, _ := json.Marshal(events[i])
		return len(b) + 1
	}
	take := func(keep []bool, i, size int) {
		if keep[i] {
			return
		}
		if size > left {
			truncated = true
			return
		}
		keep[i], left = true, left-size
	}
	evMatch := func(i int) bool { return cid != "" && events[i].CorrelationID == cid }
	lnMatch := func(i int) bool { return cid != "" && strings.Contains(lines[i], cid) }
	for _, pass := range []bool{true, false} {
		for i := len(events) - 1; i >= 0; i-- {
			if !pass || evMatch(i) {
				take(keepEv, i, evSize(i))
			}
		}
		for i := len(lines) - 1; i >= 0; i-- {
			if !pass || lnMatch(i) {
				take(keepLn, i, len(lines[i])+3)
			}
		}
	}
	outEv := []task.DiagnosticEvent{}
	for i, k := range keepEv {
		if k {
			outEv = append(outEv, events[i])
		}
	}
	outLn := []string{}
	for i, k := range keepLn {
		if k {
			outLn = append(outLn, lines[i])
		}
	}
	return outEv, slices.Clip(outLn), truncated
}
