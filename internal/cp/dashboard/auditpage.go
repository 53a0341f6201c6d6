package dashboard

import (
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// auditFilter is the audit page's filters. Since and Until are as typed:
// RFC 3339, or a datetime-local value ("2006-01-02T15:04", UTC).
type auditFilter struct{ Actor, Role, Action, Target, Since, Until string }

func auditFilterOf(r *http.Request) auditFilter {
	q := r.URL.Query()
	t := func(k string) string { return strings.TrimSpace(q.Get(k)) }
	return auditFilter{Actor: t("actor"), Role: t("role"), Action: t("action"), Target: t("target"),
		Since: t("since"), Until: t("until")}
}

// apiTime is v as the API takes it (RFC 3339); a datetime-local value is
// UTC; anything else goes as it is (the API names it in a 422).
func apiTime(v string) string {
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05"} {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			return t.Format(time.RFC3339)
		}
	}
	return v
}

// query is the filters as GET /api/v1/audit's query.
func (f auditFilter) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"actor": f.Actor, "role": f.Role, "action": f.Action, "target": f.Target,
		"since": apiTime(f.Since), "until": apiTime(f.Until)} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

// pageQuery is the filters as this page's query (the export link's).
func (f auditFilter) pageQuery() string {
	q := url.Values{}
	for k, v := range map[string]string{"actor": f.Actor, "role": f.Role, "action": f.Action, "target": f.Target,
		"since": f.Since, "until": f.Until} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q.Encode()
}

// auditData is the audit page's model.
type auditData struct {
	Me     *session
	Filter auditFilter
	Roles  []api.Role
	Events []api.AuditEvent
	Export string // the export link
	Error  string
}

func (u *UI) auditPage(w http.ResponseWriter, r *http.Request, s *session) {
	f := auditFilterOf(r)
	d := auditData{Me: s, Filter: f, Roles: api.Roles, Export: "/ui/audit/export?" + f.pageQuery()}
	q := f.query()
	q.Set("limit", "200")
	err := u.call(r, s, http.MethodGet, "/api/v1/audit?"+q.Encode(), nil, &d.Events)
	if u.revoked(w, r, err) {
		return
	}
	if err != nil {
		d.Error = err.Error()
	}
	u.render(w, http.StatusOK, "audit", d)
}

// auditExport is GET /ui/audit/export: the filtered audit records as JSON
// lines (GET /api/v1/audit?format=jsonl), as an attachment.
func (u *UI) auditExport(w http.ResponseWriter, r *http.Request, s *session) {
	q := auditFilterOf(r).query()
	q.Set("format", "jsonl")
	rec, err := u.raw(r, s, http.MethodGet, "/api/v1/audit?"+q.Encode())
	if err != nil {
		if u.revoked(w, r, err) {
			return
		}
		http.Error(w, err.Error(), apiStatus(err))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Content-Disposition", `attachment; filename="audit.jsonl"`)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(rec.body.Bytes())
}
