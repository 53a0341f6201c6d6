package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// BootstrapTokenCredential is the systemd credential the bootstrap token
// may come from (LoadCredential=drover-agent-bootstrap-token:PATH): it
// keeps the token out of the environment and the env file.
const BootstrapTokenCredential = "drover-agent-bootstrap-token"

// WithCredentials wraps getenv so NODE_AGENT_BOOTSTRAP_TOKEN, when it is
// unset, comes from the credential BootstrapTokenCredential in
// $CREDENTIALS_DIRECTORY (systemd's LoadCredential=), read once here,
// trailing whitespace trimmed. It counts as the environment: a flag still
// wins over it. A credential that is named but unreadable is an error.
func WithCredentials(getenv func(string) string) (func(string) string, error) {
	dir := getenv("CREDENTIALS_DIRECTORY")
	if dir == "" || getenv("NODE_AGENT_BOOTSTRAP_TOKEN") != "" {
		return getenv, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, BootstrapTokenCredential))
	if errors.Is(err, fs.ErrNotExist) {
		return getenv, nil
	}
	if err != nil {
		return nil, fmt.Errorf("credential %s: %w", BootstrapTokenCredential, err)
	}
	token := strings.TrimRight(string(b), " \t\r\n")
	if token == "" {
		return getenv, nil
	}
	return func(key string) string {
		if key == "NODE_AGENT_BOOTSTRAP_TOKEN" {
			return token
		}
		return getenv(key)
	}, nil
}

// NewLogger is the agent's logger on w: text, or JSON (one object a line,
// for journald and log shippers) when DROVER_LOG_FORMAT is json. The
// systemd unit sets DROVER_LOG_FORMAT=json.
func NewLogger(w io.Writer, getenv func(string) string) (*slog.Logger, error) {
	switch f := getenv("DROVER_LOG_FORMAT"); f {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, nil)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil)), nil
	default:
		return nil, fmt.Errorf("DROVER_LOG_FORMAT %q: must be text or json", f)
	}
}
