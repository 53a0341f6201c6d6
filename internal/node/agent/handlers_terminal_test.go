//go:build linux

package agent_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

// newTermGateway is the terminal gateway's node-facing stream route
// (terminaltest) on its own mTLS listener (NODE_AGENT_TERMINAL_URL differs
// from the control plane URL), trusting the fake control plane's CA.
func newTermGateway(t *testing.T, f *fakeCP, nonce string) *terminaltest.Gateway {
	t.Helper()
	cert, err := f.ca.ServerCertificate([]string{"127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return terminaltest.New(t, terminaltest.Options{Nonce: nonce, TLS: &tls.Config{MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: f.ca.Pool()}})
}

// startTerminalAgent runs an agent with its default handlers (terminal.open
// among them) and terminal streams going to terminalURL.
func startTerminalAgent(t *testing.T, f *fakeCP, terminalURL string) *runningAgent {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	})
	cfg := agent.Config{ControlPlaneURL: f.srv.URL, TerminalURL: terminalURL, HostID: testNodeID, BootstrapToken: testToken,
		CAHash: f.ca.Hash(), OSFamily: api.OSLinux, StateDir: t.TempDir(), ListenAddr: "127.0.0.1:0",
		HeartbeatInterval: 100 * time.Millisecond}
	a, err := agent.New(cfg, agent.WithAccelProbe(fixedAccel(accel.TCG)),
		agent.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{Agent: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = a.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { r.stop(t) })
	eventually(t, "the agent's first heartbeat", func() bool {
		if r.exited() {
			t.Fatalf("agent Run returned early: %v", r.err)
		}
		return len(f.heartbeatLog()) > 0
	})
	return r
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: terminal tests need root to start shells as other users")
		}
		t.Skip("needs root: starts shells as other users")
	}
}

// openTask signs and enqueues a terminal.open task and returns its id.
func openTask(t *testing.T, f *fakeCP, id string, p task.TerminalOpenParams) string {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	c := claims(id, task.TypeTerminalOpen)
	c.Params = raw
	f.enqueue(deliveryFor(c, sign(t, f.signer, c)))
	return id
}

func terminalParams(sessionID, nonce, username string) task.TerminalOpenParams {
	return task.TerminalOpenParams{SessionID: sessionID, AllocationID: "alloc-1", Nonce: nonce, Mode: task.TerminalModePTY,
		Username: username, Cols: 80, Rows: 24, MaxLifetime: api.Duration(time.Hour)}
}

const testNonce = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestTerminalOpenEndToEnd: a signed terminal.open makes the agent dial
// NODE_AGENT_TERMINAL_URL with its node certificate and the nonce, start
// the user's login shell, and report success with timings.
func TestTerminalOpenEndToEnd(t *testing.T) {
	needRoot(t)
	f := newFakeCP(t)
	g := newTermGateway(t, f, testNonce)
	startTerminalAgent(t, f, g.URL())
	// nobody's login shell is nologin: it says so and exits 1.
	id := openTask(t, f, "t-term-1", terminalParams("ts-1", testNonce, "nobody"))
	s := g.Stream(waitDeadline)
	if s.Node != testNodeID || s.Req.URL.Path != "/internal/v1/nodes/"+testNodeID+"/terminal/ts-1" ||
		s.Req.Header.Get(api.HeaderCorrelationID) != "cid-"+id {
		t.Errorf("stream from %q to %s, correlation id %q", s.Node, s.Req.URL.Path, s.Req.Header.Get(api.HeaderCorrelationID))
	}
	if c, out := s.UntilControl(waitDeadline); c.Type != terminal.TypeReady || c.SessionID != "ts-1" || out != "" {
		t.Fatalf("first control %+v after output %q, want ready first", c, out)
	}
	c, out := s.UntilControl(waitDeadline)
	if c.Type != terminal.TypeExit || c.ExitCode != 1 || !strings.Contains(out, "not available") {
		t.Fatalf("got %+v after %q, want nologin's message and exit 1", c, out)
	}
	res := f.waitAccepted(t, id, 1)[0].Result
	if res.Status != api.ResultSucceeded {
		t.Fatalf("result %+v", res)
	}
	var got termnode.Result
	if err := json.Unmarshal(res.Output, &got); err != nil || got.SessionID != "ts-1" || got.Mode != "pty" || got.PID <= 0 {
		t.Errorf("output %s (%v)", res.Output, err)
	}
	for _, k := range []string{"stream_connect_ms", "pty_start_ms", "total_ms"} {
		if _, ok := res.Timings[k]; !ok {
			t.Errorf("timings %v lack %s", res.Timings, k)
		}
	}
	var phases []string
	for _, ev := range f.eventsFor(id) {
		phases = append(phases, ev.Phase+":"+ev.Status)
	}
	if p := strings.Join(phases, ","); !strings.Contains(p, "stream_connect:succeeded,pty_start:succeeded") {
		t.Errorf("events %s", p)
	}
}

// TestTerminalOpenFailures: each failure is a failed result with the code
// of the hop that failed.
func TestTerminalOpenFailures(t *testing.T) {
	needRoot(t)
	f := newFakeCP(t)
	g := newTermGateway(t, f, testNonce)
	startTerminalAgent(t, f, g.URL())
	serial := terminalParams("ts-serial", testNonce, "")
	serial.Mode, serial.InstanceID = task.TerminalModeSerial, "inst-1"
	bad := terminalParams("ts-bad", testNonce, "nobody")
	bad.Mode = "telnet"
	cases := []struct {
		name    string
		p       task.TerminalOpenParams
		stream  bool // the stream connects, so the gateway gets the error frame
		code    string
		message string
	}{
		{"invalid params", bad, false, "invalid_params", "mode"},
		{"unknown user", terminalParams("ts-nouser", testNonce, "nosuchuser42"), true,
			termnode.CodePTYFailed, `allocation user "nosuchuser42" does not exist on this node`},
		{"nonce mismatch", terminalParams("ts-nonce", strings.Repeat("f", 64), "nobody"), false,
			termnode.CodeSessionRejected, "terminal_nonce_mismatch"},
		{"serial without instances", serial, true, termnode.CodePTYFailed, "this host runs no instances"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := openTask(t, f, "t-fail-"+string(rune('a'+i)), tc.p)
			if tc.stream {
				s := g.Stream(waitDeadline)
				if c, _ := s.UntilControl(waitDeadline); c.Type != terminal.TypeError || c.Error != terminal.CodePTYFailed || !strings.Contains(c.Message, tc.message) {
					t.Errorf("gateway got %+v", c)
				}
				if code := s.CloseStatus(waitDeadline); int(code) != terminal.ClosePTYFailed {
					t.Errorf("close code %d, want %d", code, terminal.ClosePTYFailed)
				}
			}
			res := f.waitAccepted(t, id, 1)[0].Result
			if res.Status != api.ResultFailed || res.Error == nil || res.Error.Code != tc.code || !strings.Contains(res.Error.Message, tc.message) {
				t.Fatalf("result %+v (error %+v), want %s mentioning %q", res, res.Error, tc.code, tc.message)
			}
		})
	}
}

// TestTerminalSessionsEndWithAgent: stopping the agent ends its sessions
// with an error frame node_offline.
func TestTerminalSessionsEndWithAgent(t *testing.T) {
	needRoot(t)
	name := "dta" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	if out, err := exec.Command("useradd", "-m", "-s", "/bin/sh", name).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "true" && errors.Is(err, exec.ErrNotFound) {
			t.Skip("useradd is missing")
		}
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", "-r", name).Run() })
	f := newFakeCP(t)
	g := newTermGateway(t, f, testNonce)
	r := startTerminalAgent(t, f, g.URL())
	id := openTask(t, f, "t-term-live", terminalParams("ts-live", testNonce, name))
	s := g.Stream(waitDeadline)
	if c, _ := s.UntilControl(waitDeadline); c.Type != terminal.TypeReady {
		t.Fatalf("first control %+v", c)
	}
	if res := f.waitAccepted(t, id, 1)[0].Result; res.Status != api.ResultSucceeded {
		t.Fatalf("result %+v", res)
	}
	s.Stdin("echo me=$(id -un)\n")
	s.ReadUntil("me="+name, waitDeadline)
	// The stream's reader keeps reading while the agent stops, so its close
	// handshake completes.
	r.stop(t)
	if c, _ := s.UntilControl(waitDeadline); c.Type != terminal.TypeError || c.Error != terminal.CodeNodeOffline {
		t.Fatalf("after the agent stopped the gateway got %+v, want error node_offline", c)
	}
}
