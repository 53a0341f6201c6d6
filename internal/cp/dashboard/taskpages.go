package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// taskStates are the task list's state filter choices.
var taskStates = []api.TaskState{api.TaskQueued, api.TaskDispatched, api.TaskRunning, api.TaskSucceeded,
	api.TaskFailed, api.TaskExpired, api.TaskCanceled}

// taskFilter is the task list's filters (the API's own query names).
type taskFilter struct{ Node, Type, State string }

// tasksData is the task list's model.
type tasksData struct {
	Me     *session
	Filter taskFilter
	Types  []string
	States []api.TaskState
	Tasks  []api.Task
	Error  string
}

// apiStatus is the status to answer for a failed API call.
func apiStatus(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return http.StatusBadGateway
}

func (u *UI) tasksPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := tasksData{Me: s, States: taskStates,
		Filter: taskFilter{Node: strings.TrimSpace(q.Get("node_id")), Type: q.Get("type"), State: q.Get("state")}}
	aq := url.Values{"limit": {"200"}}
	for k, v := range map[string]string{"node_id": d.Filter.Node, "type": d.Filter.Type, "state": d.Filter.State} {
		if v != "" {
			aq.Set(k, v)
		}
	}
	err := u.call(r, s, http.MethodGet, "/api/v1/tasks?"+aq.Encode(), nil, &d.Tasks)
	if err == nil {
		err = u.call(r, s, http.MethodGet, "/api/v1/task-types", nil, &d.Types)
	}
	if u.revoked(w, r, err) {
		return
	}
	if err != nil {
		d.Error = err.Error()
	}
	u.render(w, http.StatusOK, "tasks", d)
}

// step is one line of a task's state history.
type step struct {
	At          time.Time
	State, Note string
}

// phase is one bar of the phase chart.
type phase struct {
	Label string
	MS    int64
}

// taskData is the task page's model.
type taskData struct {
	Me      *session
	Task    api.Task
	Params  string
	Result  string
	History []step
	Chart   template.HTML
}

func (u *UI) taskPage(w http.ResponseWriter, r *http.Request, s *session) {
	var t api.Task
	if err := u.call(r, s, http.MethodGet, "/api/v1/tasks/"+url.PathEscape(r.PathValue("id")), nil, &t); err != nil {
		if u.revoked(w, r, err) {
			return
		}
		u.render(w, apiStatus(err), "error", map[string]any{"Me": s, "Error": err.Error()})
		return
	}
	d := taskData{Me: s, Task: t, Params: pretty(t.Params), History: historyOf(t), Chart: phaseChart(phasesOf(t))}
	if t.Result != nil {
		b, _ := json.MarshalIndent(t.Result, "", "  ")
		d.Result = string(b)
	}
	u.render(w, http.StatusOK, "task", d)
}

// pretty indents a JSON document (as it came, if it is not one).
func pretty(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// historyOf is t's states in order: queued, dispatched, each progress
// event, then its final state.
func historyOf(t api.Task) []step {
	h := []step{{At: t.CreatedAt, State: string(api.TaskQueued), Note: "by " + t.CreatedBy}}
	if t.DispatchedAt != nil {
		h = append(h, step{At: *t.DispatchedAt, State: string(api.TaskDispatched), Note: fmt.Sprintf("attempt %d", t.Attempts)})
	}
	for _, e := range t.Events {
		note := e.Phase
		if e.Status != "" {
			note += " " + e.Status
		}
		if e.DurationMS > 0 {
			note += fmt.Sprintf(" (%d ms)", e.DurationMS)
		}
		if e.Message != "" {
			note += ": " + e.Message
		}
		st := ""
		if e.Phase == "started" {
			st = string(api.TaskRunning)
		}
		h = append(h, step{At: e.At, State: st, Note: note})
	}
	if t.FinishedAt != nil {
		h = append(h, step{At: *t.FinishedAt, State: string(t.State)})
	}
	return h
}

// phasesOf is the result's timings ("<phase>_ms", by name) then the
// events' durations.
func phasesOf(t api.Task) []phase {
	var out []phase
	if t.Result != nil {
		names := make([]string, 0, len(t.Result.Timings))
		for k := range t.Result.Timings {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			out = append(out, phase{Label: strings.TrimSuffix(k, "_ms"), MS: t.Result.Timings[k]})
		}
	}
	for _, e := range t.Events {
		if e.DurationMS > 0 {
			out = append(out, phase{Label: "event " + e.Phase, MS: e.DurationMS})
		}
	}
	return out
}

// Chart geometry: a label column, then bars scaled to the longest phase.
const (
	chartLabelW = 170
	chartBarW   = 300
	chartRowH   = 22
	chartValueW = 90
)

// barWidth is ms's bar on a chart whose longest phase is maxMS: at least
// 1 px for a phase that took any time.
func barWidth(ms, maxMS int64) int {
	if ms <= 0 || maxMS <= 0 {
		return 0
	}
	return max(1, int(ms*chartBarW/maxMS))
}

// phaseChart draws phases as an inline SVG horizontal bar chart (labels
// escaped; it scales down with its box through its viewBox). No phases:
// empty.
func phaseChart(phases []phase) template.HTML {
	if len(phases) == 0 {
		return ""
	}
	var maxMS, total int64
	for _, p := range phases {
		maxMS, total = max(maxMS, p.MS), total+p.MS
	}
	wd, ht := chartLabelW+chartBarW+chartValueW, len(phases)*chartRowH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="phase-chart" class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-labelledby="phase-chart-title">`,
		wd, ht, wd, ht)
	fmt.Fprintf(&b, `<title id="phase-chart-title">Phase timings: %d phases, %d ms in all</title>`, len(phases), total)
	for i, p := range phases {
		y, label := i*chartRowH, html.EscapeString(p.Label)
		fmt.Fprintf(&b, `<g class="phase"><title>%s: %d ms</title>`, label, p.MS)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" class="label">%s</text>`, chartLabelW-6, y+15, label)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" class="bar" data-ms="%d"/>`,
			chartLabelW, y+4, barWidth(p.MS, maxMS), chartRowH-8, p.MS)
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="value">%d ms</text></g>`,
			chartLabelW+barWidth(p.MS, maxMS)+4, y+15, p.MS)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built here, every label escaped
}
