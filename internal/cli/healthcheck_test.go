package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	apiURL, _ := startServer(t)
	unhealthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "draining", http.StatusServiceUnavailable)
	}))
	defer unhealthy.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		name, url string
		code      int
		want      string
	}{
		{"healthy", apiURL + "/healthz", 0, "200 OK"},
		{"unhealthy", unhealthy.URL + "/healthz", 1, "503 Service Unavailable: draining"},
		{"refused", closed.URL + "/healthz", 1, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Run(context.Background(), []string{"healthcheck", "--url", tc.url, "--timeout", "2s"},
				&Env{Stdout: &out, Stderr: &errb})
			if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
				t.Errorf("code %d, stdout %q, stderr %q; want code %d and %q", code, out.String(), errb.String(), tc.code, tc.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if code := Run(context.Background(), []string{"version"}, &Env{Stdout: &out, Stderr: &out}); code != 0 {
		t.Fatalf("version: code %d: %s", code, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || lines[0] != "drover "+Version || !strings.HasPrefix(lines[1], "commit:") ||
		!strings.HasPrefix(lines[2], "build date:") || lines[3] != "go:         "+runtime.Version() ||
		lines[4] != "platform:   "+runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("version printed:\n%s", out.String())
	}
}
