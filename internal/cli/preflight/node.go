package preflight

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// noNodeSide is the detail of the node-side hops when they cannot run.
const noNodeSide = "node-side hops not run: pass --node-host (SSH) or --node-local, or run `drover-agent preflight` on the node"

// agentArgs are drover-agent preflight's arguments.
func (r *run) agentArgs() []string {
	args := []string{"preflight", "--json", "--timeout", r.cfg.Timeout.String()}
	for _, f := range [][2]string{{"--runtime-api-url", r.cfg.NodeRuntimeAPIURL},
		{"--runtime-resolve-address", r.cfg.NodeRuntimeResolveAddress},
		{"--terminal-url", r.cfg.NodeTerminalURL}, {"--terminal-resolve-address", r.cfg.NodeTerminalResolveAddress}} {
		if f[1] != "" {
			args = append(args, f[0], f[1])
		}
	}
	return args
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@,+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// nodeOpsAccess: the operator's SSH path to the node, which then runs
// drover-agent preflight there.
func (r *run) nodeOpsAccess(ctx context.Context, res *preflight.HopResult) {
	switch {
	case r.cfg.NodeLocal:
		res.Status, res.Detail = preflight.Skipped, "node-side hops run locally (--node-local)"
		return
	case r.cfg.NodeHost == "":
		res.Status, res.Detail = preflight.Skipped, noNodeSide
		return
	}
	addr := net.JoinHostPort(r.cfg.NodeHost, strconv.Itoa(r.cfg.SSHPort))
	res.Data = map[string]any{"address": addr, "user": r.cfg.NodeUser}
	client, err := r.sshDial(ctx, addr)
	if err != nil {
		res.Fail(sshSignal(err), r.sshDetail(addr, err))
		return
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		res.Fail(sshSignal(err), fmt.Sprintf("ssh %s@%s: open a session: %v", r.cfg.NodeUser, addr, err))
		return
	}
	defer sess.Close()
	words := []string{shellQuote(r.cfg.AgentBinary)}
	for _, a := range r.agentArgs() {
		words = append(words, shellQuote(a))
	}
	var stdout, stderr bytes.Buffer
	sess.Stdout, sess.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	go func() { done <- sess.Run(strings.Join(words, " ")) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		client.Close()
		res.Fail(signal.OpsAccessUnhealthy, fmt.Sprintf("ssh %s@%s: drover-agent preflight did not finish within the hop's timeout", r.cfg.NodeUser, addr))
		return
	}
	var exit *ssh.ExitError
	if err != nil && !errors.As(err, &exit) {
		res.Fail(sshSignal(err), fmt.Sprintf("ssh %s@%s: run drover-agent preflight: %v", r.cfg.NodeUser, addr, err))
		return
	}
	r.nodeRaw = stdout.Bytes()
	if exit != nil {
		r.nodeExit = exit.ExitStatus()
		r.nodeErr = fmt.Errorf("%s exited %d: %s", r.cfg.AgentBinary, exit.ExitStatus(), tail(stderr.String()))
	}
	res.Detail = fmt.Sprintf("ssh %s@%s works; ran %s preflight", r.cfg.NodeUser, addr, r.cfg.AgentBinary)
}

// sshDial connects with known_hosts checking and key or agent auth.
func (r *run) sshDial(ctx context.Context, addr string) (*ssh.Client, error) {
	known := expandHome(r.cfg.SSHKnownHosts)
	hostKeys, err := knownhosts.New(known)
	if err != nil {
		return nil, fmt.Errorf("known_hosts %s: %w", known, err)
	}
	var auth ssh.AuthMethod
	if r.cfg.SSHKey != "" {
		pem, err := os.ReadFile(expandHome(r.cfg.SSHKey))
		if err != nil {
			return nil, fmt.Errorf("--ssh-key: %w", err)
		}
		key, err := ssh.ParsePrivateKey(pem)
		if err != nil {
			return nil, fmt.Errorf("--ssh-key %s: %w", r.cfg.SSHKey, err)
		}
		auth = ssh.PublicKeys(key)
	} else {
		sock := os.Getenv("SSH_AUTH_SOCK")
		if sock == "" {
			return nil, errors.New("no --ssh-key and no SSH agent (SSH_AUTH_SOCK)")
		}
		conn, err := net.Dial("unix", sock)
		if err != nil {
			return nil, fmt.Errorf("SSH agent %s: %w", sock, err)
		}
		defer conn.Close()
		auth = ssh.PublicKeysCallback(agent.NewClient(conn).Signers)
	}
	cfg := &ssh.ClientConfig{User: r.cfg.NodeUser, Auth: []ssh.AuthMethod{auth}, HostKeyCallback: hostKeys,
		HostKeyAlgorithms: knownAlgorithms(hostKeys, addr), Timeout: r.cfg.Timeout}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// knownAlgorithms are the host key algorithms of the keys known_hosts has
// for addr, so the server is asked for a key that can match (as OpenSSH
// does); nil (the library's default order) when it knows none.
func knownAlgorithms(cb ssh.HostKeyCallback, addr string) []string {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil
	}
	probe, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil
	}
	tcp, _ := net.ResolveTCPAddr("tcp", addr)
	var ke *knownhosts.KeyError
	if err := cb(addr, tcp, probe.PublicKey()); !errors.As(err, &ke) {
		return nil
	}
	var algos []string
	for _, k := range ke.Want {
		switch t := k.Key.Type(); t {
		case ssh.KeyAlgoRSA:
			algos = append(algos, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		default:
			algos = append(algos, t)
		}
	}
	return algos
}

// sshDetail explains an SSH failure; a host key problem says which file.
func (r *run) sshDetail(addr string, err error) string {
	msg := fmt.Sprintf("ssh %s@%s: %v", r.cfg.NodeUser, addr, err)
	var ke *knownhosts.KeyError
	if errors.As(err, &ke) {
		if len(ke.Want) == 0 {
			return msg + fmt.Sprintf(" (the node's host key is not in %s: verify it and add it)", r.cfg.SSHKnownHosts)
		}
		return msg + fmt.Sprintf(" (the node's host key differs from the one in %s:%d: a rebuilt node or a wrong address)",
			ke.Want[0].Filename, ke.Want[0].Line)
	}
	return msg
}

// sshSignal tells a reset access path (node_ops_access_unhealthy) from an
// SSH path that refuses (node_ops_ssh_failed).
func sshSignal(err error) signal.Name {
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "connection reset") {
		return signal.OpsAccessUnhealthy
	}
	return signal.OpsSSHFailed
}

func expandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, strings.TrimPrefix(p, "~"))
		}
	}
	return p
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		s = "..." + s[len(s)-300:]
	}
	return s
}

// agentUsageExit is drover-agent's exit status for a usage or configuration
// error.
const agentUsageExit = 2

// runLocal runs drover-agent preflight on this machine (--node-local).
func (r *run) runLocal(ctx context.Context) {
	cmd := exec.CommandContext(ctx, r.cfg.AgentBinary, r.agentArgs()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r.nodeRaw = stdout.Bytes()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.nodeExit = exit.ExitCode()
		r.nodeErr = fmt.Errorf("%s exited %d: %s", r.cfg.AgentBinary, exit.ExitCode(), tail(stderr.String()))
	case errors.Is(err, syscall.ENOEXEC):
		r.nodeErr = fmt.Errorf("run %s: %v: the binary is not built for this host (architecture or OS)", r.cfg.AgentBinary, err)
	case err != nil:
		r.nodeErr = fmt.Errorf("run %s: %v", r.cfg.AgentBinary, err)
	}
}

// nodeReportOf parses drover-agent preflight's output once.
func (r *run) nodeReportOf(ctx context.Context) (*preflight.NodeReport, error) {
	if r.nodeReport != nil {
		return r.nodeReport, nil
	}
	if r.cfg.NodeLocal && r.nodeRaw == nil && r.nodeErr == nil {
		r.runLocal(ctx)
	}
	var nr preflight.NodeReport
	if err := json.Unmarshal(bytes.TrimSpace(r.nodeRaw), &nr); err != nil || len(nr.Hops) == 0 {
		why := "no JSON node report"
		if err != nil {
			why += " (" + err.Error() + ")"
		}
		if r.nodeErr != nil {
			why += "; " + r.nodeErr.Error()
		}
		return nil, errors.New(why)
	}
	r.nodeReport = &nr
	return r.nodeReport, nil
}

// nodeHopResult is the node's result for hop (nil when it has none).
func (r *run) nodeHopResult(h signal.Hop) *preflight.HopResult {
	if r.nodeReport == nil {
		return nil
	}
	for i := range r.nodeReport.Hops {
		if r.nodeReport.Hops[i].Hop == h {
			return &r.nodeReport.Hops[i]
		}
	}
	return nil
}

// nodeHop reports hop from drover-agent preflight's report.
func (r *run) nodeHop(h signal.Hop) hopFunc {
	return func(ctx context.Context, res *preflight.HopResult) {
		if !r.cfg.NodeLocal && r.cfg.NodeHost == "" {
			res.Status, res.Detail = preflight.Skipped, noNodeSide
			return
		}
		nr, err := r.nodeReportOf(ctx)
		if err != nil {
			// Exit 2 is the agent refusing its configuration (no control
			// plane URL, a bad env file): the agent cannot run as
			// configured, which is not a wrong binary.
			sig := signal.BinaryInvalid
			if r.nodeExit == agentUsageExit {
				sig = signal.ProcessDown
			}
			res.Fail(sig, fmt.Sprintf("%s preflight gave no report: %v", r.cfg.AgentBinary, err))
			return
		}
		got := r.nodeHopResult(h)
		if got == nil {
			res.Status, res.Detail = preflight.Skipped, fmt.Sprintf("the node's report (agent %s) has no %s hop", nr.AgentVersion, h)
			return
		}
		*res = *got
		res.Hop = h
		if res.Status == preflight.Failed {
			if res.Signal == "" {
				res.Signal = signal.ProcessDown
			}
			d := res.Detail
			res.Fail(res.Signal, d)
		}
		if res.Status == "" {
			res.Status = preflight.Skipped
		}
		if h == signal.HopNodeTerminalReachability {
			r.checkProfile(res)
		}
	}
}

// checkProfile fails node_terminal_reachability with
// terminal_env_profile_drift when the terminal URL the node dialled (its
// NODE_AGENT_TERMINAL_URL) is not the host's environment profile's: a node
// that reaches the wrong listener, or none, is fixed by its URL. An explicit
// --node-terminal-url is the operator's own choice and is not compared.
func (r *run) checkProfile(res *preflight.HopResult) {
	if r.host == nil || r.host.Profile.TerminalURL == "" || r.cfg.NodeTerminalURL != "" || res.Status == preflight.Skipped {
		return
	}
	dialled, _ := res.Data["url"].(string)
	want := r.host.Profile.TerminalURL
	if dialled == "" || strings.TrimRight(dialled, "/") == strings.TrimRight(want, "/") {
		return
	}
	detail := fmt.Sprintf("the node dials %s but host %s's profile says %s", dialled, r.host.ID, want)
	if res.Status == preflight.Failed {
		detail += fmt.Sprintf(" (and %s: %s)", res.Signal, res.Detail)
	}
	res.Fail(signal.EnvProfileDrift, detail)
}
