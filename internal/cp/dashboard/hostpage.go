package dashboard

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
)

// hostData is the host page's model.
type hostData struct {
	Me    *session
	Row   row
	Live  hostLive
	Inv   *invView
	Slots []api.Slot
	Tasks []api.Task
	Audit []api.AuditEvent
	Done  string
	Error string
}

// hostLive is the part of the host page that refreshes itself: the status
// line with the heartbeat age, the capacity and the latest preflight run.
// htmx polls GET /ui/hosts/{id}/live once per heartbeat interval and swaps
// the status block in; the capacity and preflight sections come in the
// same answer as out-of-band swaps.
type hostLive struct {
	Row       row
	Every     string // the poll's hx-trigger, "every 2s"
	Capacity  template.HTML
	Preflight *preflightView
	Error     string
	OOB       bool // rendered for the poll: the sections swap out of band
}

// preflightView is a host's latest preflight run with its report.
type preflightView struct {
	Run    api.PreflightRun
	Report preflight.Report
}

// pollEvery is the live block's poll interval: the host's heartbeat
// interval, between 1 s and 30 s.
func pollEvery(h api.Host) string {
	iv := time.Duration(h.HeartbeatInterval)
	iv = min(max(iv, time.Second), 30*time.Second)
	return fmt.Sprintf("every %dms", iv.Milliseconds())
}

// live builds the live block of host h: its latest preflight run through
// the API (an error is shown in the block, not fatal).
func (u *UI) live(r *http.Request, s *session, h api.Host) hostLive {
	l := hostLive{Row: rowOf(u.cfg.Now(), h), Every: pollEvery(h), Capacity: capacityChart(h.Capacity)}
	var runs []api.PreflightRun
	err := u.call(r, s, http.MethodGet, "/api/v1/preflight-runs?host_id="+url.QueryEscape(h.ID), nil, &runs)
	if err == nil && len(runs) > 0 {
		pv := &preflightView{}
		if err = u.call(r, s, http.MethodGet, "/api/v1/preflight-runs/"+url.PathEscape(runs[0].ID), nil, &pv.Run); err == nil {
			if err = json.Unmarshal(pv.Run.Report, &pv.Report); err != nil {
				err = fmt.Errorf("preflight run %s: report: %w", pv.Run.ID, err)
			}
			l.Preflight = pv
		}
	}
	if err != nil {
		l.Error = err.Error()
	}
	return l
}

// host reads host id through the API; on failure it has answered.
func (u *UI) host(w http.ResponseWriter, r *http.Request, s *session, id string) (api.Host, bool) {
	var h api.Host
	if err := u.call(r, s, http.MethodGet, "/api/v1/hosts/"+url.PathEscape(id), nil, &h); err != nil {
		if u.revoked(w, r, err) {
			return h, false
		}
		u.render(w, apiStatus(err), "error", map[string]any{"Me": s, "Error": err.Error()})
		return h, false
	}
	return h, true
}

func (u *UI) hostPage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	h, ok := u.host(w, r, s, id)
	if !ok {
		return
	}
	d := hostData{Me: s, Row: rowOf(u.cfg.Now(), h), Live: u.live(r, s, h), Done: r.URL.Query().Get("done"),
		Error: r.URL.Query().Get("error")}
	if h.Capabilities != nil {
		d.Inv = inventoryView(h.Capabilities.Inventory)
	}
	var errs []string
	for _, c := range []struct {
		path string
		out  any
	}{
		{"/api/v1/hosts/" + url.PathEscape(id) + "/slots", &d.Slots},
		{"/api/v1/tasks?limit=10&node_id=" + url.QueryEscape(id), &d.Tasks},
		{"/api/v1/audit?limit=20&target=" + url.QueryEscape(id), &d.Audit},
	} {
		if err := u.call(r, s, http.MethodGet, c.path, nil, c.out); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 && d.Error == "" {
		d.Error = strings.Join(errs, "; ")
	}
	u.render(w, http.StatusOK, "host", d)
}

// hostLivePage is GET /ui/hosts/{id}/live: the host page's live block (an
// htmx fragment). A session whose token stopped working is sent to the
// login page (HX-Redirect); an unknown host answers 286, which ends the
// polling.
func (u *UI) hostLivePage(w http.ResponseWriter, r *http.Request, s *session) {
	var h api.Host
	if err := u.call(r, s, http.MethodGet, "/api/v1/hosts/"+url.PathEscape(r.PathValue("id")), nil, &h); err != nil {
		switch st := apiStatus(err); st {
		case http.StatusUnauthorized:
			u.endSession(r)
			u.setCookie(w, r, sessionCookie, "", -1)
			w.Header().Set("HX-Redirect", "/ui/login?error=invalid")
			w.WriteHeader(http.StatusOK)
		case http.StatusNotFound, http.StatusForbidden:
			http.Error(w, err.Error(), 286) // htmx: stop polling
		default:
			http.Error(w, err.Error(), st)
		}
		return
	}
	l := u.live(r, s, h)
	l.OOB = true
	u.render(w, http.StatusOK, "host-live-update", l)
}
