package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Harness timings: short so the matrix stays within a few minutes.
const (
	heartbeat     = time.Second     // drover server --heartbeat-interval
	streamTimeout = 3 * time.Second // --terminal-node-stream-timeout (and dispatch, PTY)
	hopTimeout    = 3 * time.Second // drover preflight --timeout
)

// bins are the binaries under test, built once per matrix.
type bins struct{ drover, agent, agentARM64 string }

func buildBins(t *testing.T) bins {
	t.Helper()
	dir := t.TempDir()
	b := bins{drover: filepath.Join(dir, "drover"), agent: filepath.Join(dir, "drover-agent"),
		agentARM64: filepath.Join(dir, "drover-agent-arm64")}
	for _, c := range []struct{ out, pkg, arch string }{{b.drover, "../../cmd/drover", ""},
		{b.agent, "../../cmd/drover-agent", ""}, {b.agentARM64, "../../cmd/drover-agent", "arm64"}} {
		cmd := exec.Command("go", "build", "-o", c.out, c.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if c.arch != "" {
			cmd.Env = append(cmd.Env, "GOARCH="+c.arch, "GOOS=linux")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", c.pkg, err, out)
		}
	}
	return b
}

// proc is a child process whose output goes to a log file.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, logPath string, env []string, name string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(name, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	return p
}

// stop ends the process (SIGTERM, then SIGKILL) and waits for it.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// logHas says whether the process's log mentions s.
func (p *proc) logHas(s string) bool {
	b, _ := os.ReadFile(p.log)
	return bytes.Contains(b, []byte(s))
}

// freeAddr is an address on 127.0.0.1 nothing listens on now, below the
// ephemeral range (testutil.FreePort).
func freeAddr(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
}

// cluster is one scenario's control plane, agent and fault proxies.
type cluster struct {
	t        *testing.T
	bins     bins
	dir      string
	store    string // --store
	opURL    string
	token    string
	nodeAddr string         // the control plane's node listener
	api      *faultProxy    // the agent's NODE_AGENT_CONTROL_PLANE_URL
	term     *faultProxy    // the agent's NODE_AGENT_TERMINAL_URL
	pg       *pgtest.Server // the control plane's PostgreSQL (clusterOpts.postgres)
	cp       *proc
	agent    *proc
	hostID   string
	caHash   string
	// agentEnv is the agent's NODE_AGENT_* configuration; drover preflight
	// runs with it too, so --node-local's drover-agent preflight sees what
	// the agent sees.
	agentEnv map[string]string
	allocID  string
	users    []string // allocation users to remove when the scenario ends
	otherCA  *otherCA // gateway_rejects_node_cert: the CA the agent also trusts
}

// clusterOpts vary the control plane.
type clusterOpts struct {
	// postgres runs the control plane on a throw-away PostgreSQL (the
	// cluster's pg); otherwise SQLite in the scenario's directory.
	postgres bool
	certTTL  time.Duration
}

func startCluster(t *testing.T, b bins, o clusterOpts) *cluster {
	t.Helper()
	c := &cluster{t: t, bins: b, dir: t.TempDir(), hostID: "chaos-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()[len("TestChaosMatrix/"):]))}
	if len(c.hostID) > 40 {
		c.hostID = c.hostID[:40]
	}
	// Registered before any process starts, so it runs after they stopped
	// (cleanups run last in, first out): a user with a live shell cannot
	// be removed.
	t.Cleanup(c.removeUsers)
	c.store = "sqlite:" + filepath.Join(c.dir, "drover.db")
	if o.postgres {
		pg, err := pgtest.StartServer()
		if err != nil {
			pgtest.Skip(t, err)
		}
		t.Cleanup(pg.Stop)
		c.pg, c.store = pg, pg.NewDatabase(t)
	}
	out, err := exec.Command(b.drover, "token", "create", "chaos", "--store", c.store, "--insecure-plaintext-keys", "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("drover token create: %v\n%s", err, out)
	}
	var tok api.OperatorToken
	if err := json.Unmarshal(out[bytes.IndexByte(out, '{'):], &tok); err != nil || tok.Token == "" {
		t.Fatalf("token: %v: %s", err, out)
	}
	c.token = tok.Token
	ttl := o.certTTL
	if ttl == 0 {
		ttl = 24 * time.Hour
	}
	// A port picked by freeAddr may still be taken before the control
	// plane binds it (another test picked it too): retry.
	for attempt := 1; ; attempt++ {
		op := freeAddr(t)
		c.nodeAddr = freeAddr(t)
		c.api = newFaultProxy(t, c.nodeAddr)
		c.term = newFaultProxy(t, c.nodeAddr)
		c.opURL = "http://" + op
		c.cp = startProc(t, filepath.Join(c.dir, "drover.log"), os.Environ(), b.drover, "server", "--store", c.store,
			"--insecure-plaintext-keys", "--listen", op, "--node-listen", c.nodeAddr, "--node-url", "https://"+c.api.addr,
			"--heartbeat-interval", heartbeat.String(), "--terminal-node-stream-timeout", streamTimeout.String(),
			"--terminal-dispatch-timeout", streamTimeout.String(), "--terminal-pty-timeout", streamTimeout.String(),
			"--recording-dir", filepath.Join(c.dir, "recordings"), "--cert-ttl", ttl.String())
		err := c.poll(20*time.Second, func() error {
			resp, err := http.Get(c.opURL + "/healthz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("HTTP %d", resp.StatusCode)
			}
			return nil
		})
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("control plane not up: %v\n%s", err, c.cp.tail())
		}
		t.Logf("control plane did not start (attempt %d): %v\n%s", attempt, err, c.cp.tail())
		c.cp.stop()
	}
	var bt api.BootstrapToken
	c.call(http.MethodPost, "/api/v1/hosts", map[string]any{"host_id": c.hostID, "os_family": "linux",
		"api_url": "https://" + c.api.addr, "terminal_url": "https://" + c.term.addr}, &bt)
	c.caHash = bt.CAHash
	stateDir := filepath.Join(c.dir, "agent")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	c.agentEnv = map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://" + c.api.addr,
		"NODE_AGENT_TERMINAL_URL": "https://" + c.term.addr, "NODE_AGENT_HOST_ID": c.hostID,
		"NODE_AGENT_BOOTSTRAP_TOKEN": bt.Token, "NODE_AGENT_CA_HASH": bt.CAHash, "NODE_AGENT_STATE_DIR": stateDir,
		"NODE_AGENT_OS_FAMILY": "linux", "NODE_AGENT_RUNTIME": "none", "NODE_AGENT_LISTEN": freeAddr(t)}
	return c
}

// env is os.Environ with the agent's configuration.
func (c *cluster) env() []string {
	env := os.Environ()
	for k, v := range c.agentEnv {
		env = append(env, k+"="+v)
	}
	return env
}

// startAgent starts drover-agent and waits until the host is healthy.
func (c *cluster) startAgent() {
	c.t.Helper()
	c.agent = startProc(c.t, filepath.Join(c.dir, "agent.log"), c.env(), c.bins.agent)
	c.waitHealthy(20 * time.Second)
}

func (c *cluster) host() api.Host {
	var h api.Host
	c.call(http.MethodGet, "/api/v1/hosts/"+c.hostID, nil, &h)
	return h
}

func (c *cluster) waitHealthy(d time.Duration) {
	c.t.Helper()
	c.waitFor("host healthy", d, func() error {
		if h := c.host(); h.Status != api.HostHealthy {
			return fmt.Errorf("status %s (%s)", h.Status, h.StatusReason)
		}
		return nil
	})
}

// createAllocation binds a fresh OS user on the agent's host and waits
// until it is active.
func (c *cluster) createAllocation(user string) string {
	c.t.Helper()
	var a api.Allocation
	c.users = append(c.users, user)
	c.call(http.MethodPost, "/api/v1/allocations", api.CreateAllocationRequest{Username: user, HostID: c.hostID}, &a)
	c.waitFor("allocation active", 60*time.Second, func() error {
		var got api.Allocation
		c.call(http.MethodGet, "/api/v1/allocations/"+a.ID, nil, &got)
		if got.State != api.AllocationActive {
			return fmt.Errorf("state %s (%s)", got.State, got.StateReason)
		}
		return nil
	})
	c.allocID = a.ID
	return a.ID
}

// removeUsers deletes the scenario's allocation users and their homes,
// retrying while a session's shell is still exiting.
func (c *cluster) removeUsers() {
	for _, u := range c.users {
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := exec.Command("userdel", "-r", u).CombinedOutput()
			var exit *exec.ExitError
			if err == nil || (errors.As(err, &exit) && exit.ExitCode() == 6) { // 6: no such user
				break
			}
			if time.Now().After(deadline) {
				c.t.Errorf("userdel -r %s: %v: %s", u, err, out)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func (c *cluster) waitFor(what string, d time.Duration, fn func() error) {
	c.t.Helper()
	if err := c.poll(d, fn); err != nil {
		c.t.Fatalf("%s: not within %s: %v\ncontrol plane log:\n%s\nagent log:\n%s", what, d, err, c.cp.tail(), c.agentTail())
	}
}

// poll calls fn until it succeeds or d passed (its last error), or the
// control plane exited.
func (c *cluster) poll(d time.Duration, fn func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-c.cp.done:
			return fmt.Errorf("the control plane exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) agentTail() string {
	if c.agent == nil {
		return ""
	}
	return c.agent.tail()
}

// do calls the operator API; it returns the HTTP status and the body.
func (c *cluster) do(method, path string, in any) (int, []byte) {
	c.t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			c.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.opURL+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// call is do that fails the test on an answer other than 2xx.
func (c *cluster) call(method, path string, in, out any) {
	c.t.Helper()
	st, raw := c.do(method, path, in)
	if st < 200 || st > 299 {
		c.t.Fatalf("%s %s: HTTP %d: %s", method, path, st, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
}
