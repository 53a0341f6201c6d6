package dashboard

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

//go:embed templates/*.html
var templateFS embed.FS

// templates parses the pages; they are compiled in, so an error is a bug.
func templates() *template.Template {
	funcs := template.FuncMap{"path": url.PathEscape,
		"json": func(v any) (string, error) {
			b, err := json.MarshalIndent(v, "", "  ")
			return string(b), err
		},
		"act": func(id, action, label, csrf string) map[string]string {
			return map[string]string{"ID": id, "Action": action, "Label": label, "CSRF": csrf}
		},
		"millis": millis, "flatJSON": flatJSON}
	return template.Must(template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html"))
}

func (u *UI) render(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := u.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		u.cfg.Log.Error("dashboard template", "page", name, "err", err)
		http.Error(w, "template error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// filter is the fleet page's filters.
type filter struct{ Status, OS, Accel, Q string }

func filterOf(r *http.Request) filter {
	q := r.URL.Query()
	return filter{Status: q.Get("status"), OS: q.Get("os"), Accel: q.Get("accel"), Q: strings.TrimSpace(q.Get("q"))}
}

func (f filter) match(h api.Host) bool {
	if f.Status != "" && string(h.Status) != f.Status || f.OS != "" && h.OSFamily != f.OS ||
		f.Accel != "" && h.SelectedAccel != f.Accel {
		return false
	}
	if f.Q == "" {
		return true
	}
	q := strings.ToLower(f.Q)
	return strings.Contains(strings.ToLower(h.ID+" "+h.Hostname+" "+h.AgentVersion+" "+h.LastFailureSignal), q)
}

// row is one host of the fleet table.
type row struct {
	api.Host
	AccelWorks     bool
	AccelError     string
	Used, Free     api.Capacity
	HasCap         bool
	Age            string // heartbeat age, "" if never seen
	AgeBar         int    // SVG bar width 0..60 (3 heartbeat intervals)
	AgeLate        bool
	LastFailureAgo string
}

func ago(now time.Time, t *time.Time) string {
	if t == nil {
		return ""
	}
	return now.Sub(*t).Round(100 * time.Millisecond).String()
}

func rowOf(now time.Time, h api.Host) row {
	r := row{Host: h}
	if h.Capabilities != nil {
		r.AccelError = h.Capabilities.AccelError
		r.AccelWorks = h.SelectedAccel != "" && r.AccelError == ""
	}
	if h.Capacity != nil {
		r.HasCap, r.Free = true, h.Capacity.Free
		r.Used = h.Capacity.Allocated
	}
	if h.LastSeenAt != nil {
		age := now.Sub(*h.LastSeenAt)
		r.Age = age.Round(100 * time.Millisecond).String()
		window := 3 * time.Duration(h.HeartbeatInterval)
		if window <= 0 {
			window = 30 * time.Second
		}
		r.AgeBar = int(min(60, 60*age/window))
		r.AgeLate = age >= window
	}
	r.LastFailureAgo = ago(now, h.LastFailureAt)
	return r
}

// fleetData is the fleet page's model.
type fleetData struct {
	Me       *session
	Filter   filter
	Rows     []row
	Statuses []api.HostStatus
	OSes     []string
	Accels   []string
	Query    string
	Error    string
}

func (u *UI) fleet(r *http.Request, s *session) (fleetData, error) {
	var hosts []api.Host
	err := u.call(r, s, http.MethodGet, "/api/v1/hosts", nil, &hosts)
	f := filterOf(r)
	d := fleetData{Me: s, Filter: f, Query: r.URL.RawQuery, Statuses: []api.HostStatus{api.HostHealthy, api.HostStale,
		api.HostAuthFailed, api.HostAPIUnreachable, api.HostTaskResultFailed, api.HostUnknown}}
	oses, accels := map[string]bool{}, map[string]bool{}
	now := u.cfg.Now()
	for _, h := range hosts {
		oses[h.OSFamily] = h.OSFamily != ""
		accels[h.SelectedAccel] = h.SelectedAccel != ""
		if f.match(h) {
			d.Rows = append(d.Rows, rowOf(now, h))
		}
	}
	d.OSes, d.Accels = keys(oses), keys(accels)
	return d, err
}

func keys(m map[string]bool) []string {
	var out []string
	for k, ok := range m {
		if ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// revoked ends the session when the API no longer takes its token (revoked
// or expired: 401) and sends the browser to the login page.
func (u *UI) revoked(w http.ResponseWriter, r *http.Request, err error) bool {
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		return false
	}
	u.endSession(r)
	u.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/ui/login?error=invalid", http.StatusSeeOther)
	return true
}

func (u *UI) fleetPage(w http.ResponseWriter, r *http.Request, s *session) {
	d, err := u.fleet(r, s)
	if u.revoked(w, r, err) {
		return
	}
	if err != nil {
		d.Error = err.Error()
	}
	u.render(w, http.StatusOK, "fleet", d)
}

// fleetEvents streams the fleet table as server-sent events: "reset" then
// a "row" (the <tr> HTML) for each host that matches the filters, then,
// once per heartbeat interval, a "row" for each row that changed and a
// "remove" (the host id) for each that left. It ends when the session's
// token stops working or the client goes.
func (u *UI) fleetEvents(w http.ResponseWriter, r *http.Request, s *session) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	select {
	case u.streams <- struct{}{}:
		defer func() { <-u.streams }()
	default:
		http.Error(w, "too many live fleet streams", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(event, data string) {
		fmt.Fprintf(w, "event: %s\n", event)
		for _, line := range strings.Split(data, "\n") {
			fmt.Fprintf(w, "data: %s\n", line)
		}
		fmt.Fprint(w, "\n")
	}
	send("reset", "")
	last := map[string]string{}
	for {
		d, err := u.fleet(r, s)
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized || r.Context().Err() != nil ||
			u.sessionOf(r) == nil { // the token stopped working, the client went, or it logged out
			return
		}
		interval := time.Second
		seen := map[string]bool{}
		for _, rw := range d.Rows {
			if iv := time.Duration(rw.HeartbeatInterval); iv > 0 {
				interval = iv
			}
			seen[rw.ID] = true
			var buf bytes.Buffer
			if err := u.tmpl.ExecuteTemplate(&buf, "row", rw); err != nil {
				return
			}
			if html := buf.String(); last[rw.ID] != html {
				last[rw.ID] = html
				send("row", html)
			}
		}
		for id := range last {
			if !seen[id] {
				delete(last, id)
				send("remove", "host-"+id)
			}
		}
		fl.Flush()
		interval = max(interval, 250*time.Millisecond)
		select {
		case <-r.Context().Done():
			return
		case <-time.After(interval):
		}
	}
}

// hostAction runs one operator action through the API and redirects back
// to the host page with its outcome. A viewer gets 403 before the API is
// called (the API would refuse it too).
func (u *UI) hostAction(w http.ResponseWriter, r *http.Request, s *session) {
	if !s.canAct() {
		http.Error(w, "requires role operator", http.StatusForbidden)
		return
	}
	id := r.PathValue("id")
	base := "/api/v1/hosts/" + url.PathEscape(id) + "/"
	var err error
	done := r.PathValue("action")
	switch done {
	case "enable", "disable", "drain", "undrain":
		err = u.call(r, s, http.MethodPost, base+done, struct{}{}, nil)
	case "health-probe":
		var t api.Task
		err = u.call(r, s, http.MethodPost, "/api/v1/tasks",
			api.EnqueueTaskRequest{NodeID: id, Type: "diag.health_probe"}, &t)
		done = "health probe queued: task " + t.ID
	case "preflight":
		var t api.Task
		err = u.call(r, s, http.MethodPost, "/api/v1/tasks",
			api.EnqueueTaskRequest{NodeID: id, Type: task.TypePreflight}, &t)
		done = "preflight queued: task " + t.ID
	case "rotate-token": // hostactions.go
		u.rotateToken(w, r, s, id)
		return
	case "revoke":
		u.revokeHost(w, r, s, id)
		return
	default:
		http.NotFound(w, r)
		return
	}
	q := url.Values{}
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusForbidden {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		q.Set("error", err.Error())
	} else {
		q.Set("done", done)
	}
	http.Redirect(w, r, "/ui/hosts/"+url.PathEscape(id)+"?"+q.Encode(), http.StatusSeeOther)
}
