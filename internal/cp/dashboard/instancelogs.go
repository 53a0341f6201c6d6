package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxLogsRefusal bounds a refusal's body kept to turn it into an event.
const maxLogsRefusal = 64 << 10

// instanceLogs is GET /ui/instances/{id}/logs: the instance page's live
// log view (logs.js) as server-sent events. It calls the API's logs route
// in-process with the session's token and Accept: text/event-stream, and
// writes the API's events straight through, so nothing is buffered here
// beyond the response writer: a slow browser blocks the API's relay and so
// the node. A refusal becomes one "end" event with its code and message
// (an EventSource cannot read a non-200 answer, and would retry it).
// Closing the page ends the request, and so the node's stream.
func (u *UI) instanceLogs(w http.ResponseWriter, r *http.Request, s *session) {
	q := url.Values{}
	for _, k := range []string{"follow", "since", "tail"} {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet,
		"/api/v1/instances/"+url.PathEscape(r.PathValue("id"))+"/logs?"+q.Encode(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req.RemoteAddr = r.RemoteAddr
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Accept", "text/event-stream")
	if cid := r.Header.Get(api.HeaderCorrelationID); httpapi.ValidCorrelationID(cid) {
		req.Header.Set(api.HeaderCorrelationID, cid)
	}
	sw := &sseProxy{w: w}
	u.cfg.API.ServeHTTP(sw, req)
	sw.finish()
}

// sseProxy passes a 200 answer through and keeps a refusal (bounded) to
// send it as an "end" event.
type sseProxy struct {
	w       http.ResponseWriter
	hdr     http.Header
	status  int
	refusal bytes.Buffer
}

func (p *sseProxy) Header() http.Header {
	if p.hdr == nil {
		p.hdr = http.Header{}
	}
	return p.hdr
}

func (p *sseProxy) WriteHeader(code int) {
	if p.status != 0 {
		return
	}
	p.status = code
	if code == http.StatusOK {
		h := p.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("X-Accel-Buffering", "no")
		if cid := p.Header().Get(api.HeaderCorrelationID); cid != "" {
			h.Set(api.HeaderCorrelationID, cid)
		}
		p.w.WriteHeader(http.StatusOK)
	}
}

func (p *sseProxy) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.WriteHeader(http.StatusOK)
	}
	if p.status != http.StatusOK {
		if room := maxLogsRefusal - p.refusal.Len(); room > 0 {
			p.refusal.Write(b[:min(len(b), room)])
		}
		return len(b), nil
	}
	return p.w.Write(b)
}

// Flush flushes the browser's response.
func (p *sseProxy) Flush() {
	if p.status == http.StatusOK {
		_ = http.NewResponseController(p.w).Flush()
	}
}

// Unwrap lets the API's http.ResponseController reach the connection.
func (p *sseProxy) Unwrap() http.ResponseWriter { return p.w }

// finish sends a refusal as the stream's only event.
func (p *sseProxy) finish() {
	if p.status == http.StatusOK || p.status == 0 {
		return
	}
	var env struct {
		Error api.ErrorDetail `json:"error"`
	}
	end := map[string]string{"reason": "error", "code": fmt.Sprintf("http_%d", p.status),
		"message": p.refusal.String()}
	if json.Unmarshal(p.refusal.Bytes(), &env) == nil && env.Error.Code != "" {
		end["code"], end["message"], end["correlation_id"] = env.Error.Code, env.Error.Message, env.Error.CorrelationID
	}
	b, _ := json.Marshal(end)
	h := p.w.Header()
	h.Set("Content-Type", "text/event-stream")
	p.w.WriteHeader(http.StatusOK)
	fmt.Fprintf(p.w, "event: end\ndata: %s\n\n", b)
}
