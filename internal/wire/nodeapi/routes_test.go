package nodeapi

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

var wildcard = regexp.MustCompile(`\{[a-z_]+\}`)

// TestTable: every route once, a known method, a node route under
// /internal/v1/nodes/{id} with node-certificate auth, register the only
// bootstrap-token route, and the terminal stream the only upgrade.
func TestTable(t *testing.T) {
	seen := map[string]bool{}
	names := map[string]bool{}
	for _, r := range Routes() {
		if seen[r.MuxPattern()] || names[r.Name] {
			t.Errorf("route %s (%s) listed twice", r.MuxPattern(), r.Name)
		}
		seen[r.MuxPattern()], names[r.Name] = true, true
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodPut:
		default:
			t.Errorf("%s: method %q", r.Name, r.Method)
		}
		if r.Method == http.MethodGet && r.Request != nil {
			t.Errorf("%s: a GET with a request body %v", r.Name, r.Request)
		}
		node := strings.HasPrefix(r.Pattern, "/internal/v1/nodes/{id}/")
		switch {
		case r.Name == "register":
			if r.Auth != AuthBootstrapToken || r.Pattern != "/internal/v1/register" {
				t.Errorf("register: %s auth %s", r.Pattern, r.Auth)
			}
		case !node || r.Auth != AuthNodeCert:
			t.Errorf("%s: pattern %s auth %s, want a node route with node certificate auth", r.Name, r.Pattern, r.Auth)
		}
		if r.Stream != (r.Name == "terminal_stream" || r.Name == "logs_stream") || (r.Stream && r.Response != nil) {
			t.Errorf("%s: stream %v response %v", r.Name, r.Stream, r.Response)
		}
	}
	if len(seen) != 14 {
		t.Errorf("%d routes, want 14", len(seen))
	}
}

// TestPathBuilders: each builder fills every wildcard of its pattern, in
// order, escaping its arguments.
func TestPathBuilders(t *testing.T) {
	built := map[string]bool{}
	for _, tc := range []struct {
		pattern, got, want string
	}{
		{Register.Pattern(), Register.Path(), "/internal/v1/register"},
		{Renew.Pattern(), Renew.Path("n1"), "/internal/v1/nodes/n1/renew"},
		{Heartbeat.Pattern(), Heartbeat.Path("a b/c"), "/internal/v1/nodes/a%20b%2Fc/heartbeat"},
		{JWKS.Pattern(), JWKS.Path("n1"), "/internal/v1/nodes/n1/jwks"},
		{PutCapabilities.Pattern(), PutCapabilities.Path("n1"), "/internal/v1/nodes/n1/capabilities"},
		{WaitTask.Pattern(), WaitTask.Path("n1"), "/internal/v1/nodes/n1/tasks/wait"},
		{PostEvent.Pattern(), PostEvent.Path("n1", "t-1"), "/internal/v1/nodes/n1/tasks/t-1/events"},
		{PostResult.Pattern(), PostResult.Path("n1", "t/1"), "/internal/v1/nodes/n1/tasks/t%2F1/result"},
		{PostResults.Pattern(), PostResults.Path("n1"), "/internal/v1/nodes/n1/tasks/results"},
		{DesiredInstances.Pattern(), DesiredInstances.Path("n1"), "/internal/v1/nodes/n1/instances"},
		{InstanceStatus.Pattern(), InstanceStatus.Path("n1", "i-1"), "/internal/v1/nodes/n1/instances/i-1/status"},
		{InstanceSecrets.Pattern(), InstanceSecrets.Path("n1", "i-1"), "/internal/v1/nodes/n1/instances/i-1/secrets"},
		{TerminalStream.Pattern(), TerminalStream.Path("n1", "s-1"), "/internal/v1/nodes/n1/terminal/s-1"},
		{LogsStream.Pattern(), LogsStream.Path("n1", "ls-1"), "/internal/v1/nodes/n1/logs/ls-1"},
	} {
		built[tc.pattern] = true
		if tc.got != tc.want {
			t.Errorf("%s: built %q, want %q", tc.pattern, tc.got, tc.want)
		}
		if wildcard.MatchString(tc.got) {
			t.Errorf("%s: %q keeps a wildcard", tc.pattern, tc.got)
		}
		// The built path is served by the pattern.
		mux := http.NewServeMux()
		mux.HandleFunc(tc.pattern, func(http.ResponseWriter, *http.Request) {})
		r, _ := http.NewRequest(http.MethodGet, "https://cp"+tc.got, nil)
		if _, p := mux.Handler(r); p != tc.pattern {
			t.Errorf("%q matched %q, want %q", tc.got, p, tc.pattern)
		}
	}
	// The list above is the whole table.
	for _, r := range Routes() {
		if !built[r.Pattern] {
			t.Errorf("route %s has no path builder case", r.Name)
		}
	}
}

// TestResultItemAckErr: a refused result of a batch is the *Error the
// single route would have given, so callers branch on it the same way.
func TestResultItemAckErr(t *testing.T) {
	fields := []api.FieldError{{Field: "status", Message: "bad"}}
	for _, tc := range []struct {
		ack    ResultItemAck
		status int
		code   string
	}{
		{ResultItemAck{TaskID: "t", Status: http.StatusOK, State: api.TaskSucceeded}, 0, ""},
		{ResultItemAck{TaskID: "t", Status: http.StatusNotFound, Error: &api.ErrorDetail{Code: "task_not_found", Message: "m"}}, http.StatusNotFound, "task_not_found"},
		{ResultItemAck{TaskID: "t", Status: http.StatusUnprocessableEntity, Error: &api.ErrorDetail{Code: "invalid_payload", Fields: fields}}, http.StatusUnprocessableEntity, "invalid_payload"},
		{ResultItemAck{TaskID: "t", Status: http.StatusInternalServerError}, http.StatusInternalServerError, ""},
	} {
		err := tc.ack.Err()
		if tc.status == 0 {
			if err != nil {
				t.Errorf("%+v: %v, want nil", tc.ack, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || !IsStatus(err, tc.status) || e.Code != tc.code {
			t.Errorf("%+v: %#v, want status %d code %q", tc.ack, err, tc.status, tc.code)
		}
		if tc.code == "invalid_payload" && (len(e.Fields) != 1 || e.Fields[0].Field != "status") {
			t.Errorf("fields %+v lost", e.Fields)
		}
	}
}
