package termgw

import (
	"fmt"
	"net/url"
	"time"
)

// Config configures the terminal gateway. Zero values take the
// defaults documented on each field.
type Config struct {
	// AllowedOrigins are browser origins besides the gateway's own that may
	// open terminals, e.g. "https://console.example.com".
	AllowedOrigins []string
	// TokenTTL is a terminal token's lifetime (default and maximum 60s).
	TokenTTL time.Duration
	// DispatchTimeout bounds the wait for a node to pick up terminal.open
	// (default 10s): node_offline or dispatch_timeout.
	DispatchTimeout time.Duration
	// NodeStreamTimeout bounds the wait for the node's stream once it picked
	// up terminal.open (default 15s): node_stream_timeout.
	NodeStreamTimeout time.Duration
	// PTYTimeout bounds the wait for the node's ready frame once its stream
	// connected (default 15s): terminal_pty_failed.
	PTYTimeout time.Duration
	// IdleTimeout ends a session without user input (default 30m).
	IdleTimeout time.Duration
	// MaxLifetime ends any session (default 12h).
	MaxLifetime time.Duration
	// KeepAlive is the WebSocket ping interval on both legs (default 15s).
	KeepAlive time.Duration
	// RecordingDir holds asciicast v2 recordings, one per session; ""
	// disables recording (the server logs a warning).
	RecordingDir string
	// RecordInput also records keystrokes (off: they include passwords
	// typed at prompts that do not echo).
	RecordInput bool
	// MaxSessionsPerNode is how many terminal sessions one node may have on
	// this replica at once (default 16); beyond it: terminal_session_limit.
	MaxSessionsPerNode int
	// RecheckInterval is how often live sessions re-read their node,
	// allocation and minting token, in case a change event was lost
	// (default 30s). Change events end them at once.
	RecheckInterval time.Duration
	// AdvertiseURL is this replica's own node-facing base URL, directly
	// reachable by agents (not through a load balancer): terminal.open
	// carries it as stream_url (signed), so the node's stream reaches the
	// replica that holds the browser. "" omits stream_url and agents dial
	// their configured NODE_AGENT_TERMINAL_URL (one replica).
	AdvertiseURL string
}

// SetDefaults fills zero fields with their defaults and checks the rest.
func (t *Config) SetDefaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&t.TokenTTL, maxTerminalTokenTTL)
	def(&t.DispatchTimeout, 10*time.Second)
	def(&t.NodeStreamTimeout, 15*time.Second)
	def(&t.PTYTimeout, 15*time.Second)
	def(&t.IdleTimeout, 30*time.Minute)
	def(&t.MaxLifetime, 12*time.Hour)
	def(&t.KeepAlive, 15*time.Second)
	if t.TokenTTL < 0 || t.TokenTTL > maxTerminalTokenTTL {
		return fmt.Errorf("terminal token TTL %s: must be at most %s", t.TokenTTL, maxTerminalTokenTTL)
	}
	if t.KeepAlive > 20*time.Second {
		return fmt.Errorf("terminal keepalive %s: must be at most 20s (proxies drop idle WebSockets)", t.KeepAlive)
	}
	if t.AdvertiseURL != "" {
		if u, err := url.Parse(t.AdvertiseURL); err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.User != nil {
			return fmt.Errorf("advertise node URL %q: must be an https:// URL of this replica's node listener", t.AdvertiseURL)
		}
	}
	for _, o := range t.AllowedOrigins {
		if u, err := url.Parse(o); err != nil || u.Scheme == "" || u.Host == "" || u.Path != "" {
			return fmt.Errorf("terminal allowed origin %q: must be scheme://host[:port]", o)
		}
	}
	return nil
}
