package agent_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/agent"
)

func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestCredentialBootstrapToken(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, agent.BootstrapTokenCredential), []byte("tok-from-cred\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"credential when unset", map[string]string{"CREDENTIALS_DIRECTORY": dir}, "tok-from-cred"},
		{"environment wins", map[string]string{"CREDENTIALS_DIRECTORY": dir, "NODE_AGENT_BOOTSTRAP_TOKEN": "tok-env"}, "tok-env"},
		{"no credentials directory", map[string]string{}, ""},
		{"credential absent", map[string]string{"CREDENTIALS_DIRECTORY": t.TempDir()}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			getenv, err := agent.WithCredentials(envMap(c.env))
			if err != nil {
				t.Fatal(err)
			}
			if got := getenv("NODE_AGENT_BOOTSTRAP_TOKEN"); got != c.want {
				t.Fatalf("token %q, want %q", got, c.want)
			}
			if got := getenv("CREDENTIALS_DIRECTORY"); got != c.env["CREDENTIALS_DIRECTORY"] {
				t.Fatalf("other keys changed: %q", got)
			}
		})
	}
	// The token reaches the configuration like an environment variable.
	getenv, err := agent.WithCredentials(envMap(map[string]string{"CREDENTIALS_DIRECTORY": dir}))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := agent.LoadConfig([]string{"-control-plane-url", "https://cp:8443", "-state-dir", t.TempDir(), "-runtime", "none"}, getenv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BootstrapToken != "tok-from-cred" {
		t.Fatalf("config token %q", cfg.BootstrapToken)
	}
}

func TestCredentialUnreadable(t *testing.T) {
	dir := t.TempDir()
	// A directory where the file should be: reading it fails.
	if err := os.Mkdir(filepath.Join(dir, agent.BootstrapTokenCredential), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := agent.WithCredentials(envMap(map[string]string{"CREDENTIALS_DIRECTORY": dir}))
	if err == nil || !strings.Contains(err.Error(), agent.BootstrapTokenCredential) {
		t.Fatalf("err = %v, want one naming the credential", err)
	}
}

func TestCredentialLogFormat(t *testing.T) {
	var buf bytes.Buffer
	log, err := agent.NewLogger(&buf, envMap(map[string]string{"DROVER_LOG_FORMAT": "json"}))
	if err != nil {
		t.Fatal(err)
	}
	log.Info("agent running", "node_id", "n1")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["msg"] != "agent running" || rec["node_id"] != "n1" {
		t.Fatalf("not one JSON record: %q (%v)", buf.String(), err)
	}
	if _, err := agent.NewLogger(&buf, envMap(map[string]string{"DROVER_LOG_FORMAT": "xml"})); err == nil {
		t.Fatal("DROVER_LOG_FORMAT=xml accepted")
	}
	if _, err := agent.NewLogger(&buf, envMap(nil)); err != nil {
		t.Fatal(err)
	}
}
