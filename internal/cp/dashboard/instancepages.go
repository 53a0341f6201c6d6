package dashboard

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// instancePhases and desiredStates are the instance list's filter choices.
var (
	instancePhases = []api.InstancePhase{api.InstancePending, api.InstanceBooting, api.InstanceReady,
		api.InstanceDraining, api.InstanceStopped, api.InstanceFailed}
	desiredStates = []api.DesiredState{api.DesiredRunning, api.DesiredStopped, api.DesiredDeleted}
)

// instFilter is the instance list's filters: Host goes to the API
// (?host=), the others are applied here.
type instFilter struct{ Host, Phase, Desired, Q string }

func (f instFilter) match(in api.Instance) bool {
	if f.Phase != "" && string(in.Phase) != f.Phase || f.Desired != "" && string(in.DesiredState) != f.Desired {
		return false
	}
	q := strings.ToLower(f.Q)
	return q == "" || strings.Contains(strings.ToLower(in.ID+" "+in.Name+" "+in.Group+" "+in.HostID+" "+
		string(in.ReasonCode)+" "+in.Message), q)
}

// instRow is one instance as the pages show it.
type instRow struct {
	api.Instance
	Converged bool   // the agent acted on the current generation
	StatusAge string // since the agent's last report, "" before any
	Health    health
}

// health is an instance's current health as far as its phase tells.
type health struct {
	State string // "passing", "failing" or "unknown"
	Note  string
}

// healthOf reads health from the phase: Ready passes (readiness, then the
// health checks, hold), Failed with healthcheck_failed fails; any other
// phase says nothing about it.
func healthOf(in api.Instance) health {
	switch {
	case in.Phase == api.InstanceFailed && in.ReasonCode == api.ReasonHealthcheckFailed:
		return health{State: "failing", Note: "health checks failed: " + in.Message}
	case in.Phase == api.InstanceReady && in.Spec.HealthCheck != nil:
		return health{State: "passing", Note: "ready, health checks passing"}
	case in.Phase == api.InstanceReady:
		return health{State: "passing", Note: "ready (no health check configured)"}
	}
	return health{State: "unknown", Note: "not checked while " + string(in.Phase)}
}

func instRowOf(now time.Time, in api.Instance) instRow {
	return instRow{Instance: in, Converged: in.ObservedGeneration >= in.Generation, StatusAge: ago(now, in.StatusAt),
		Health: healthOf(in)}
}

// HealthCheckText is the health check configuration in words.
func (r instRow) HealthCheckText() string {
	hc := r.Spec.HealthCheck
	if hc == nil {
		return "none"
	}
	iv, th := time.Duration(hc.Interval), hc.FailureThreshold
	if iv <= 0 {
		iv = 10 * time.Second
	}
	if th <= 0 {
		th = 3
	}
	return fmt.Sprintf("every %s, failed after %d in a row", iv, th)
}

// ReadinessText is the readiness configuration in words.
func (r instRow) ReadinessText() string {
	rd := r.Spec.Readiness
	var parts []string
	if rd.SerialMarker != "" {
		parts = append(parts, fmt.Sprintf("serial marker %q", rd.SerialMarker))
	}
	if rd.TCPPort > 0 {
		parts = append(parts, fmt.Sprintf("TCP port %d accepts", rd.TCPPort))
	}
	if len(parts) == 0 {
		parts = append(parts, "process running")
	}
	to := time.Duration(rd.Timeout)
	if to <= 0 {
		to = 5 * time.Minute
	}
	return strings.Join(parts, " and ") + fmt.Sprintf(" (timeout %s)", to)
}

// forward is one network forward with the host port the agent chose.
type forward struct {
	api.PortForward
	Actual int // 0 when not reported
}

// Forwards are the spec's forwards with their runtime host ports.
func (r instRow) Forwards() []forward {
	var out []forward
	for _, f := range r.Spec.Network.Forwards {
		fw := forward{PortForward: f}
		if r.Runtime != nil {
			fw.Actual = r.Runtime.Ports[f.Name]
		}
		out = append(out, fw)
	}
	return out
}

// instancesData is the instance list's model.
type instancesData struct {
	Me      *session
	Filter  instFilter
	Phases  []api.InstancePhase
	Desired []api.DesiredState
	Rows    []instRow
	Total   int
	Error   string
}

func (u *UI) instancesPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := instFilter{Host: strings.TrimSpace(q.Get("host")), Phase: q.Get("phase"), Desired: q.Get("desired"),
		Q: strings.TrimSpace(q.Get("q"))}
	d := instancesData{Me: s, Filter: f, Phases: instancePhases, Desired: desiredStates}
	path := "/api/v1/instances"
	if f.Host != "" {
		path += "?" + url.Values{"host": {f.Host}}.Encode()
	}
	var ins []api.Instance
	err := u.call(r, s, http.MethodGet, path, nil, &ins)
	if u.revoked(w, r, err) {
		return
	}
	if err != nil {
		d.Error = err.Error()
	}
	now := u.cfg.Now()
	d.Total = len(ins)
	for _, in := range ins {
		if f.match(in) {
			d.Rows = append(d.Rows, instRowOf(now, in))
		}
	}
	u.render(w, http.StatusOK, "instances", d)
}

// recording is a serial-console session of the instance that has a
// recording to replay.
type recording struct {
	api.TerminalSession
	Replay string // the dashboard's replay page
}

// instanceData is the instance page's model.
type instanceData struct {
	Me          *session
	Row         instRow
	Events      []api.InstanceEvent
	Chart       template.HTML // the phase timeline, inline SVG
	Allocations []api.Allocation
	Recordings  []recording
	Audit       []api.AuditEvent
	Console     string // where the serial console starts
	Done, Error string
}

// maxConsoleAllocations bounds the allocations whose sessions the page
// reads.
const maxConsoleAllocations = 10

func (u *UI) instancePage(w http.ResponseWriter, r *http.Request, s *session) {
	var in api.Instance
	if err := u.call(r, s, http.MethodGet, "/api/v1/instances/"+url.PathEscape(r.PathValue("id")), nil, &in); err != nil {
		if u.revoked(w, r, err) {
			return
		}
		u.render(w, apiStatus(err), "error", map[string]any{"Me": s, "Error": err.Error()})
		return
	}
	now := u.cfg.Now()
	d := instanceData{Me: s, Row: instRowOf(now, in), Done: r.URL.Query().Get("done"), Error: r.URL.Query().Get("error"),
		Console: "/ui/allocations?" + url.Values{"instance_id": {in.ID}}.Encode()}
	id := url.PathEscape(in.ID)
	var errs []string
	for _, c := range []struct {
		path string
		out  any
	}{
		{"/api/v1/instances/" + id + "/events?limit=200", &d.Events},
		{"/api/v1/allocations?" + url.Values{"instance_id": {in.ID}}.Encode(), &d.Allocations},
		{"/api/v1/audit?" + url.Values{"limit": {"20"}, "target": {in.ID}}.Encode(), &d.Audit},
	} {
		if err := u.call(r, s, http.MethodGet, c.path, nil, c.out); err != nil {
			errs = append(errs, err.Error())
		}
	}
	for i, a := range d.Allocations {
		if i == maxConsoleAllocations {
			break
		}
		var ss []api.TerminalSession
		if err := u.call(r, s, http.MethodGet, "/api/v1/allocations/"+url.PathEscape(a.ID)+"/sessions", nil, &ss); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		for _, t := range ss {
			if t.RecordingURL != "" {
				d.Recordings = append(d.Recordings, recording{TerminalSession: t, Replay: "/ui/sessions/" + url.PathEscape(t.ID) + "/replay"})
			}
		}
	}
	if len(errs) > 0 && d.Error == "" {
		d.Error = strings.Join(errs, "; ")
	}
	d.Chart = phaseTimeline(d.Events, now)
	u.render(w, http.StatusOK, "instance", d)
}
