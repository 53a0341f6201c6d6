package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// enrolClone rotates the host's bootstrap token through the API and enrols
// a second drover-agent (fresh state dir) with it, then stops the clone:
// the running agent's certificate is superseded.
func (c *cluster) enrolClone() {
	c.t.Helper()
	before := c.host().CertNotAfter
	var bt api.BootstrapToken
	c.call(http.MethodPost, "/api/v1/hosts/"+c.hostID+"/rotate-token", nil, &bt)
	dir := filepath.Join(c.dir, "clone")
	if err := os.Mkdir(dir, 0o700); err != nil {
		c.t.Fatal(err)
	}
	env := c.env()
	env = append(env, "NODE_AGENT_STATE_DIR="+dir, "NODE_AGENT_BOOTSTRAP_TOKEN="+bt.Token, "NODE_AGENT_LISTEN="+freeAddr(c.t))
	clone := startProc(c.t, filepath.Join(c.dir, "clone.log"), env, c.bins.agent)
	c.waitFor("clone enrolled", 15*time.Second, func() error {
		if h := c.host(); h.CertNotAfter == nil || (before != nil && h.CertNotAfter.Equal(*before)) {
			return fmt.Errorf("certificate not replaced (not after %v)", h.CertNotAfter)
		}
		return nil
	})
	clone.stop()
}

// blockAfterClaim makes the agent claim a terminal.open whose node stream
// is slow (the terminal proxy delays it), then closes the API proxy while
// the task runs: its result post fails and is spooled. It returns the task.
func (c *cluster) blockAfterClaim() string {
	c.t.Helper()
	c.term.set(modeDelay, streamTimeout-time.Second, nil)
	var tok api.TerminalToken
	c.call(http.MethodPost, "/api/v1/allocations/"+c.allocID+"/terminal-token", api.TerminalTokenRequest{Cols: 80, Rows: 24}, &tok)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	u := strings.Replace(c.opURL, "http://", "ws://", 1) + "/api/v1/terminal?allocation_id=" + c.allocID
	ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		Subprotocols: []string{terminal.Subprotocol, terminal.TokenSubprotocolPrefix + tok.Token}})
	if err != nil {
		cancel()
		c.t.Fatalf("open a terminal: %v", err)
	}
	c.t.Cleanup(func() { ws.CloseNow(); cancel() })
	go func() { // keep reading so the session runs
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
		}
	}()
	var taskID string
	c.waitFor("terminal.open claimed", 5*time.Second, func() error {
		var s api.TerminalSession
		c.call(http.MethodGet, "/api/v1/terminal-sessions/"+tok.SessionID, nil, &s)
		if s.TaskID == "" {
			return fmt.Errorf("no task yet")
		}
		var t api.Task
		c.call(http.MethodGet, "/api/v1/tasks/"+s.TaskID, nil, &t)
		if t.State != api.TaskDispatched && t.State != api.TaskRunning {
			return fmt.Errorf("task %s is %s", t.ID, t.State)
		}
		taskID = t.ID
		return nil
	})
	c.api.set(modeRefuse, 0, nil)
	c.term.set(modePass, 0, nil)
	return taskID
}

// waitTask waits until the task reached a terminal state with a result
// posted by the agent (the spooled post after repair).
func (c *cluster) waitTask(id string) {
	c.t.Helper()
	c.waitFor("task "+id+" result posted", 20*time.Second, func() error {
		var t api.Task
		c.call(http.MethodGet, "/api/v1/tasks/"+id, nil, &t)
		if !t.State.Terminal() || t.Result == nil {
			return fmt.Errorf("task %s is %s", id, t.State)
		}
		return nil
	})
}

// preflightThroughRenewal runs preflight until the agent renewed its
// certificate at least once; every run must pass.
func (c *cluster) preflightThroughRenewal(s *state) {
	c.t.Helper()
	first := c.host().CertNotAfter
	deadline := time.Now().Add(15 * time.Second)
	for runs := 0; ; runs++ {
		r := c.preflight(s.agentBin)
		if cl := r.rep.Classification; !cl.OK {
			c.t.Fatalf("run %d failed during renewal: %s/%s: %s", runs, cl.Hop, cl.Signal, r.hopDetail())
		}
		if h := c.host(); h.CertNotAfter != nil && first != nil && h.CertNotAfter.After(*first) && runs >= 1 {
			c.t.Logf("certificate renewed (not after %s → %s) across %d passing runs", first, h.CertNotAfter, runs+1)
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no renewal within 15s (not after %v)", first)
		}
	}
}

// waitSpooled waits until the agent's own status (its local API's /healthz
// document) shows the result it could not post spooled, and its signal.
func (c *cluster) waitSpooled() string {
	c.t.Helper()
	var st struct {
		Signal  string `json:"signal"`
		Spooled int    `json:"spooled_results"`
	}
	c.waitFor("the agent spooled the result", 10*time.Second, func() error {
		resp, err := http.Get("http://" + c.agentEnv["NODE_AGENT_LISTEN"] + "/healthz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return err
		}
		if st.Spooled == 0 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	return fmt.Sprintf("agent status: %d spooled result(s), signal %s", st.Spooled, st.Signal)
}
