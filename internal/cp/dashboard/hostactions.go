package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// confirmField is the revoke form's field in which the operator types the
// host id back.
const confirmField = "confirm"

// tokenData is the one page that shows a rotated bootstrap token: it is
// rendered into this response only (no-store), never kept in the session,
// a redirect or a log.
type tokenData struct {
	Me  *session
	BT  api.BootstrapToken
	Env []string // the agent's env lines, NODE_AGENT_*=...
}

// agentEnv is the agent's env for a bootstrap token, as `drover hosts
// create` and `rotate-token` print it.
func agentEnv(bt api.BootstrapToken) []string {
	return []string{
		"NODE_AGENT_HOST_ID=" + bt.HostID,
		"NODE_AGENT_BOOTSTRAP_TOKEN=" + bt.Token,
		"NODE_AGENT_CONTROL_PLANE_URL=" + bt.NodeURL,
		"NODE_AGENT_CA_HASH=" + bt.CAHash,
	}
}

// IsAdmin is whether the session may revoke hosts (role admin).
func (s *session) IsAdmin() bool { return s.p.Role.AtLeast(api.RoleAdmin) }

// rotateToken issues a fresh bootstrap token through the API and shows it
// with the agent's env once, on this response.
func (u *UI) rotateToken(w http.ResponseWriter, r *http.Request, s *session, id string) {
	var bt api.BootstrapToken
	if err := u.call(r, s, http.MethodPost, "/api/v1/hosts/"+url.PathEscape(id)+"/rotate-token", struct{}{}, &bt); err != nil {
		u.actionFailed(w, r, id, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	u.render(w, http.StatusOK, "token", tokenData{Me: s, BT: bt, Env: agentEnv(bt)})
}

// revokeHost revokes the host's identity after the operator typed its id
// back into the confirm field; without a match it answers 400 with a field
// error and revokes nothing. Revoking takes role admin (the API's rule).
func (u *UI) revokeHost(w http.ResponseWriter, r *http.Request, s *session, id string) {
	if !s.IsAdmin() {
		http.Error(w, "requires role admin", http.StatusForbidden)
		return
	}
	if got := strings.TrimSpace(r.PostFormValue(confirmField)); got != id {
		u.render(w, http.StatusBadRequest, "revoke-refused", map[string]any{"Me": s, "ID": id,
			"Message": fmt.Sprintf("type the host id %q to confirm; nothing was revoked", id)})
		return
	}
	if err := u.call(r, s, http.MethodPost, "/api/v1/hosts/"+url.PathEscape(id)+"/revoke", struct{}{}, nil); err != nil {
		u.actionFailed(w, r, id, err)
		return
	}
	http.Redirect(w, r, "/ui/hosts/"+url.PathEscape(id)+"?"+url.Values{"done": {"revoked"}}.Encode(), http.StatusSeeOther)
}

// actionFailed answers a refused action: the API's 403 as 403, anything
// else back on the host page.
func (u *UI) actionFailed(w http.ResponseWriter, r *http.Request, id string, err error) {
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusForbidden {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	http.Redirect(w, r, "/ui/hosts/"+url.PathEscape(id)+"?"+url.Values{"error": {err.Error()}}.Encode(), http.StatusSeeOther)
}

// evidence is GET /ui/evidence/{cid}: the evidence bundle of a correlation
// id, fetched through the operator API with the session's token and sent
// as an attachment.
func (u *UI) evidence(w http.ResponseWriter, r *http.Request, s *session) {
	cid := r.PathValue("cid")
	rec, err := u.raw(r, s, http.MethodGet, "/api/v1/evidence/"+url.PathEscape(cid))
	if err != nil {
		var ae *apiError
		status := http.StatusBadGateway
		if errors.As(err, &ae) {
			status = ae.Status
		}
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", `attachment; filename="evidence-`+cid+`.tar.gz"`)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(rec.body.Bytes())
}

// raw calls the operator API in-process with the session's token and
// returns a 2xx answer as it came (call decodes JSON; a bundle is not).
func (u *UI) raw(r *http.Request, s *session, method, path string) (*recorder, error) {
	return u.send(r, s, method, path, nil)
}
