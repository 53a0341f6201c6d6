package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/webui"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// This file is the allocations pages: the list, one allocation with its
// terminal sessions' readiness chains, the browser terminal (the console's
// terminal.js, minting its token through the dashboard) and the replay of
// a session's recording (the console's replay.js, fetching the recording
// through the dashboard).

// allocStates are the allocation list's state filter choices.
var allocStates = []api.AllocationState{api.AllocationProvisioning, api.AllocationActive, api.AllocationFailed,
	api.AllocationReleasing, api.AllocationReleased}

// allocFilter is the allocation list's filters (the API's own query names).
type allocFilter struct{ Host, Instance, State string }

// allocsData is the allocation list's model.
type allocsData struct {
	Me          *session
	Filter      allocFilter
	States      []api.AllocationState
	Allocations []api.Allocation
	Error       string
}

func (u *UI) allocationsPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := allocsData{Me: s, States: allocStates, Filter: allocFilter{Host: strings.TrimSpace(q.Get("host_id")),
		Instance: strings.TrimSpace(q.Get("instance_id")), State: q.Get("state")}}
	aq := url.Values{}
	for k, v := range map[string]string{"host_id": d.Filter.Host, "instance_id": d.Filter.Instance, "state": d.Filter.State} {
		if v != "" {
			aq.Set(k, v)
		}
	}
	err := u.call(r, s, http.MethodGet, "/api/v1/allocations?"+aq.Encode(), nil, &d.Allocations)
	if u.revoked(w, r, err) {
		return
	}
	if err != nil {
		d.Error = err.Error()
	}
	u.render(w, http.StatusOK, "allocations", d)
}

// chainStep is one readiness state of a session's chain.
type chainStep struct {
	State   string
	Reached bool
	// ElapsedMS is the time since the token was minted, when reached.
	ElapsedMS int64
	Detail    string
}

// sessionView is one terminal session with its readiness chain.
type sessionView struct {
	api.TerminalSession
	Chain []chainStep
	// Failed is the failure step (state "failed"), nil for a session that
	// did not fail; FailedAfter is the last state reached before it.
	Failed      *chainStep
	FailedAfter string
	Sig         *signal.Signal
}

// chainOf is s's readiness chain: every state of terminal.States() before
// failed, in order, reached or not, then the failure if there was one.
func chainOf(s api.TerminalSession) sessionView {
	v := sessionView{TerminalSession: s}
	reached := map[string]api.TerminalStateEvent{}
	for _, e := range s.States {
		if _, seen := reached[e.State]; !seen {
			reached[e.State] = e
		}
	}
	for _, st := range terminal.States() {
		if st == terminal.StateFailed {
			continue
		}
		e, ok := reached[string(st)]
		v.Chain = append(v.Chain, chainStep{State: string(st), Reached: ok, ElapsedMS: e.ElapsedMS, Detail: e.Detail})
		if ok {
			v.FailedAfter = string(st)
		}
	}
	if e, ok := reached[string(terminal.StateFailed)]; ok || s.State == string(terminal.StateFailed) {
		v.Failed = &chainStep{State: string(terminal.StateFailed), Reached: true, ElapsedMS: e.ElapsedMS, Detail: e.Detail}
	} else {
		v.FailedAfter = ""
	}
	if s.Signal != "" {
		if sig, ok := signal.Lookup(signal.Name(s.Signal)); ok {
			v.Sig = &sig
		}
	}
	return v
}

// allocData is the allocation page's model.
type allocData struct {
	Me         *session
	Allocation api.Allocation
	Sessions   []sessionView
	Error      string
}

func (u *UI) allocationPage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	var d allocData
	if err := u.call(r, s, http.MethodGet, "/api/v1/allocations/"+url.PathEscape(id), nil, &d.Allocation); err != nil {
		if u.revoked(w, r, err) {
			return
		}
		u.render(w, apiStatus(err), "error", map[string]any{"Me": s, "Error": err.Error()})
		return
	}
	d.Me = s
	var sessions []api.TerminalSession
	if err := u.call(r, s, http.MethodGet, "/api/v1/allocations/"+url.PathEscape(id)+"/sessions", nil, &sessions); err != nil {
		d.Error = err.Error()
	}
	for _, ts := range sessions {
		d.Sessions = append(d.Sessions, chainOf(ts))
	}
	u.render(w, http.StatusOK, "allocation", d)
}

// xtermData is the model of the pages that draw xterm.js: the terminal
// (Allocation) and the replay (Session); Script is the console module.
type xtermData struct {
	Me         *session
	Title      string
	Script     string
	Allocation api.Allocation
	Session    api.TerminalSession
	// Signals maps each terminal error code (and each signal name the
	// console reports as its own code) to its outage signal.
	Signals map[string]string
}

// terminalSignals is the outage signal of every terminal error code, for
// the terminal page's error box.
func terminalSignals() map[string]string {
	m := map[string]string{}
	for _, s := range signal.Signals() {
		m[string(s.Name)] = string(s.Name)
	}
	for _, c := range terminal.ErrorCodes() {
		if n, ok := signal.FromTerminalCode(c); ok {
			m[string(c)] = string(n)
		}
	}
	return m
}

// xtermPage sets the console's policy on a page that draws xterm.js: it
// is the dashboard's but for style-src 'unsafe-inline' (xterm's renderer
// injects <style> elements) and ws:/wss: for the terminal WebSocket.
// Scripts still come only from this origin.
func xtermPage(w http.ResponseWriter) {
	w.Header().Set("Content-Security-Policy", webui.ContentSecurityPolicy)
}

// terminalPage is the browser terminal of an allocation (operators only:
// a viewer cannot mint terminal tokens).
func (u *UI) terminalPage(w http.ResponseWriter, r *http.Request, s *session) {
	if !s.canAct() {
		u.render(w, http.StatusForbidden, "error", map[string]any{"Me": s, "Error": "Opening a terminal requires role operator."})
		return
	}
	var a api.Allocation
	if err := u.call(r, s, http.MethodGet, "/api/v1/allocations/"+url.PathEscape(r.PathValue("id")), nil, &a); err != nil {
		if u.revoked(w, r, err) {
			return
		}
		u.render(w, apiStatus(err), "error", map[string]any{"Me": s, "Error": err.Error()})
		return
	}
	xtermPage(w)
	u.render(w, http.StatusOK, "terminal", xtermData{Me: s, Title: "Terminal " + a.ID, Script: "terminal.js", Allocation: a,
		Signals: terminalSignals()})
}

// mintTerminalToken is POST /ui/allocations/{id}/terminal-token: the
// browser terminal's single-use token, minted through the API with the
// session's operator token (form fields csrf, cols, rows). It answers
// the API's api.TerminalToken, or its error envelope, as JSON, with the
// X-Correlation-ID of the mint.
func (u *UI) mintTerminalToken(w http.ResponseWriter, r *http.Request, s *session) {
	if !s.canAct() {
		writeJSONError(w, http.StatusForbidden, "forbidden", "opening a terminal requires role operator", "")
		return
	}
	var size api.TerminalTokenRequest
	size.Cols, _ = strconv.Atoi(r.PostFormValue("cols"))
	size.Rows, _ = strconv.Atoi(r.PostFormValue("rows"))
	body, err := json.Marshal(size)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, "internal", err.Error(), "")
		return
	}
	cid := r.Header.Get(api.HeaderCorrelationID)
	rec, err := u.send(r, s, http.MethodPost, "/api/v1/allocations/"+url.PathEscape(r.PathValue("id"))+"/terminal-token",
		strings.NewReader(string(body)))
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			writeJSONError(w, http.StatusBadGateway, "terminal_token_mint_failed", err.Error(), cid)
			return
		}
		writeJSONError(w, ae.Status, ae.Code, ae.Message, cid)
		return
	}
	if c := rec.hdr.Get(api.HeaderCorrelationID); c != "" {
		w.Header().Set(api.HeaderCorrelationID, c)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}

// writeJSONError writes the API's error envelope.
func writeJSONError(w http.ResponseWriter, status int, code, message, cid string) {
	if code == "" {
		code = fmt.Sprintf("http_%d", status)
	}
	if cid != "" {
		w.Header().Set(api.HeaderCorrelationID, cid)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": message,
		"correlation_id": cid}})
}

// replayPage plays a session's recording with the console's player.
func (u *UI) replayPage(w http.ResponseWriter, r *http.Request, s *session) {
	var ts api.TerminalSession
	if err := u.call(r, s, http.MethodGet, "/api/v1/terminal-sessions/"+url.PathEscape(r.PathValue("sid")), nil, &ts); err != nil {
		if u.revoked(w, r, err) {
			return
		}
		u.render(w, apiStatus(err), "error", map[string]any{"Me": s, "Error": err.Error()})
		return
	}
	xtermPage(w)
	u.render(w, http.StatusOK, "replay", xtermData{Me: s, Title: "Replay " + ts.ID, Script: "replay.js", Session: ts})
}

// recording is GET /ui/sessions/{sid}/recording: the session's asciicast
// recording through the API (operators only, as the API decides).
func (u *UI) recording(w http.ResponseWriter, r *http.Request, s *session) {
	rec, err := u.send(r, s, http.MethodGet, "/api/v1/terminal-sessions/"+url.PathEscape(r.PathValue("sid"))+"/recording", nil)
	if err != nil {
		http.Error(w, err.Error(), apiStatus(err))
		return
	}
	ct := rec.hdr.Get("Content-Type")
	if ct == "" {
		ct = "application/x-asciicast"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(rec.body.Bytes())
}

// Offset is the step's time since the token was minted, as "+1.234s".
func (c chainStep) Offset() string {
	return "+" + (time.Duration(c.ElapsedMS) * time.Millisecond).String()
}

// millis formats a duration in milliseconds for the workflow tables.
func millis(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).String()
}

// keyValue is one row of a flattened JSON object.
type keyValue struct{ Key, Value string }

// flatJSON flattens a JSON object the node reported (a slice VM's
// performance or readiness) into sorted dotted keys and their scalar
// values, arrays by index ("guest.gpus.0"); nil for anything else.
func flatJSON(raw json.RawMessage) []keyValue {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return nil
	}
	if _, ok := v.(map[string]any); !ok {
		return nil
	}
	var out []keyValue
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, c := range t {
				walk(strings.TrimPrefix(prefix+"."+k, "."), c)
			}
		case []any:
			for i, c := range t {
				walk(prefix+"."+strconv.Itoa(i), c)
			}
		case nil:
		case float64:
			out = append(out, keyValue{Key: prefix, Value: strconv.FormatFloat(t, 'f', -1, 64)})
		default:
			out = append(out, keyValue{Key: prefix, Value: fmt.Sprint(t)})
		}
	}
	walk("", v)
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
