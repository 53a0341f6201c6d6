package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cli/preflight"
	wirepf "github.com/drover-dev/drover/internal/wire/preflight"
)

// PreflightCmd walks the preflight hops (docs/runbooks/preflight.md).
type PreflightCmd struct {
	APIFlags
	APIBase                    string        `name:"api-base" help:"Operator API URL (overrides --api)."`
	TerminalBase               string        `name:"terminal-base" help:"Browser-facing terminal gateway URL (default: the API base)."`
	AllocationID               string        `name:"allocation-id" help:"Allocation to check (binding, token mint, terminal)."`
	NodeID                     string        `name:"node-id" help:"Host id (default: the allocation's host)."`
	NodeHost                   string        `name:"node-host" help:"Node address to run the node-side hops on over SSH."`
	NodeUser                   string        `name:"node-user" help:"SSH user on the node (default: the current user)."`
	NodeRuntimeAPIURL          string        `name:"node-runtime-api-url" help:"Node-facing control plane URL the node should reach (default: the agent's)."`
	NodeRuntimeResolveAddress  string        `name:"node-runtime-resolve-address" help:"Address to dial for --node-runtime-api-url instead of DNS."`
	NodeTerminalURL            string        `name:"node-terminal-url" help:"Node-facing terminal URL the node should reach (default: the agent's)."`
	NodeTerminalResolveAddress string        `name:"node-terminal-resolve-address" help:"Address to dial for --node-terminal-url instead of DNS."`
	RunWSSmoke                 bool          `name:"run-ws-smoke" help:"Open a real terminal session (mint, WebSocket, terminal.open, node stream, PTY) and close it."`
	Timeout                    time.Duration `name:"timeout" default:"15s" help:"Timeout of each hop."`
	SSHKey                     string        `name:"ssh-key" help:"SSH private key file (default: the SSH agent)."`
	SSHKnownHosts              string        `name:"ssh-known-hosts" default:"~/.ssh/known_hosts" help:"known_hosts file the node's host key is checked against."`
	SSHPort                    int           `name:"ssh-port" default:"22" help:"SSH port of the node."`
	AgentBinary                string        `name:"agent-binary" default:"drover-agent" help:"Path of drover-agent on the node."`
	NodeLocal                  bool          `name:"node-local" help:"Run the node-side hops with the local drover-agent instead of SSH (single-host setups, tests)."`
}

// exitError is an error with its own exit code.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// ExitCode is the process exit code for the error.
func (e *exitError) ExitCode() int { return e.code }

// Run implements the command: exit 0 when every hop passed, 1 at the first
// failed hop, 2 on a usage error.
func (c *PreflightCmd) Run(ctx context.Context, env *Env) error {
	base := c.API
	if c.APIBase != "" {
		base = c.APIBase
	}
	tok, err := c.token()
	if err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	cfg := preflight.Config{APIBase: base, Token: tok, TerminalBase: c.TerminalBase, AllocationID: c.AllocationID,
		NodeID: c.NodeID, NodeHost: c.NodeHost, NodeUser: c.NodeUser, NodeLocal: c.NodeLocal, AgentBinary: c.AgentBinary,
		SSHKey: c.SSHKey, SSHKnownHosts: c.SSHKnownHosts, SSHPort: c.SSHPort,
		NodeRuntimeAPIURL: c.NodeRuntimeAPIURL, NodeRuntimeResolveAddress: c.NodeRuntimeResolveAddress,
		NodeTerminalURL: c.NodeTerminalURL, NodeTerminalResolveAddress: c.NodeTerminalResolveAddress,
		RunWSSmoke: c.RunWSSmoke, Timeout: c.Timeout,
		Progress: func(h wirepf.HopResult) { fmt.Fprintln(env.Stderr, preflight.ProgressLine(h)) },
		Warn:     func(msg string) { fmt.Fprintln(env.Stderr, "warning:", msg) }}
	rep, err := preflight.Run(ctx, cfg)
	var ue *preflight.UsageError
	if errors.As(err, &ue) {
		return &exitError{code: 2, msg: ue.Msg}
	}
	if err != nil {
		return err
	}
	if c.JSON {
		err = printJSON(env.Stdout, rep)
	} else {
		err = preflight.WriteTable(env.Stdout, rep)
	}
	if err != nil {
		return err
	}
	if cl := rep.Classification; !cl.OK {
		return &exitError{code: 1, msg: fmt.Sprintf("preflight failed at hop %s: %s (owner: %s)", cl.Hop, cl.Signal,
			strings.ToLower(cl.Owner))}
	}
	return nil
}
