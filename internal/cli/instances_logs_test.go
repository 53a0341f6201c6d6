package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestInstancesLogs: the CLI sends follow, since and tail, streams the
// body to stdout, reports an error end from the trailer, and prints a
// refusal's code, message and correlation id.
func TestInstancesLogs(t *testing.T) {
	var gotQuery string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.HeaderCorrelationID, "cid-123")
		switch r.URL.Path {
		case "/api/v1/instances/web/logs":
			gotQuery = r.URL.RawQuery
			w.Header().Set("Trailer", logsTrailer)
			w.Write([]byte("line one\nline two\n"))
			w.Header().Set(logsTrailer, "eof")
		case "/api/v1/instances/broken/logs":
			w.Header().Set("Trailer", logsTrailer)
			w.Write([]byte("partial\n"))
			w.Header().Set(logsTrailer, "error logs_read_failed: disk gone")
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusGatewayTimeout)
			w.Write([]byte(`{"error":{"code":"logs_node_stream_timeout","message":"the node's logs stream did not arrive","correlation_id":"cid-123"}}`))
		}
	}))
	defer srv.Close()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", srv.URL, "--token", "t"), &Env{Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	code, out, errs := run("instances", "logs", "web", "-f", "--since", "10m", "--tail", "5")
	if code != 0 || out != "line one\nline two\n" {
		t.Fatalf("logs = %d %q %q", code, out, errs)
	}
	if gotQuery != "follow=true&since=10m&tail=5" {
		t.Errorf("query = %q", gotQuery)
	}
	code, out, errs = run("instances", "logs", "broken")
	if code == 0 || out != "partial\n" || !strings.Contains(errs, "logs_read_failed: disk gone") || !strings.Contains(errs, "cid-123") {
		t.Errorf("broken stream = %d %q %q", code, out, errs)
	}
	code, _, errs = run("instances", "logs", "slow")
	if code == 0 || !strings.Contains(errs, "logs_node_stream_timeout") || !strings.Contains(errs, "HTTP 504") ||
		!strings.Contains(errs, "correlation_id cid-123") {
		t.Errorf("refusal = %d %q", code, errs)
	}
}
