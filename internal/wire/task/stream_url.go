package task

import (
	"net/url"
	"strings"
)

// MaxStreamURL bounds the stream_url param.
const MaxStreamURL = 2048

// checkStreamURL checks the stream_url param of terminal.open and logs.open:
// the node-facing base URL of the control plane replica that holds the
// session (its --advertise-node-url). The agent dials the node API's stream
// path under it instead of its configured NODE_AGENT_TERMINAL_URL, so the
// stream reaches the replica the browser is on whatever a load balancer in
// front of the replicas would do. It travels in the signed envelope: a
// node cannot be sent elsewhere by a forged task, and the agent still
// verifies the server's certificate against its pinned control plane CA.
// Absent (older control planes, or a single replica with no advertise URL
// set), the agent dials its configured URL.
//
// It accepts "" or an absolute https:// URL with a host and no user info,
// query or fragment, of at most MaxStreamURL bytes.
func checkStreamURL(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > MaxStreamURL {
		return "must be at most 2048 bytes"
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "must be a URL"
	case u.Scheme != "https":
		return "must be an https:// URL"
	case u.Host == "" || u.Hostname() == "":
		return "must name a host"
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(s, " \t\r\n"):
		return "must have no user info, query or fragment"
	}
	return ""
}
