package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// instanceAction is POST /ui/instances/{id}/actions/{action}: start, stop
// or delete through the API, then back to the instance page with the
// outcome. Delete needs the instance's name typed back into the confirm
// field (400 and nothing deleted otherwise). A viewer gets 403 before the
// API is called (the API would refuse it too).
func (u *UI) instanceAction(w http.ResponseWriter, r *http.Request, s *session) {
	if !s.canAct() {
		http.Error(w, "requires role operator", http.StatusForbidden)
		return
	}
	id := r.PathValue("id")
	base := "/api/v1/instances/" + url.PathEscape(id)
	action := r.PathValue("action")
	var (
		in   api.Instance
		err  error
		done string
	)
	switch action {
	case "start", "stop":
		err = u.call(r, s, http.MethodPost, base+"/"+action, struct{}{}, &in)
		done = fmt.Sprintf("%s requested: desired state %s, generation %d", action, in.DesiredState, in.Generation)
	case "delete":
		if err = u.call(r, s, http.MethodGet, base, nil, &in); err != nil {
			break
		}
		if got := strings.TrimSpace(r.PostFormValue(confirmField)); got != in.Name {
			u.render(w, http.StatusBadRequest, "instance-delete-refused", map[string]any{"Me": s, "ID": id, "Name": in.Name,
				"Message": fmt.Sprintf("type the instance name %q to confirm; nothing was deleted", in.Name)})
			return
		}
		err = u.call(r, s, http.MethodDelete, base, nil, &in)
		done = fmt.Sprintf("delete requested: the record goes when the agent reports the instance stopped (generation %d)", in.Generation)
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
		if u.revoked(w, r, err) {
			return
		}
		q.Set("error", err.Error())
	} else {
		q.Set("done", done)
	}
	http.Redirect(w, r, "/ui/instances/"+url.PathEscape(id)+"?"+q.Encode(), http.StatusSeeOther)
}
