package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/postgres"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Modes of a run.
const (
	ModeInProcess     = "in-process"
	ModeServerProcess = "server-process"
	ModeExternal      = "external"
)

// target is the control plane under test.
type target struct {
	mode    string
	opURL   string
	nodeURL string
	token   string
	caHash  string
	pid     int // server-process mode
	stop    func() error
	// restart (server-process mode only) SIGKILLs the server, calls killed,
	// and starts it again on the same store and addresses.
	restart func(ctx context.Context, killed func()) error
}

// isLoopbackURL reports whether raw names a loopback host.
func isLoopbackURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func quietLogger(w io.Writer) *slog.Logger {
	if w == nil {
		w = io.Discard
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// storeSpec resolves "sqlite:" (empty path) to a file in dir.
func storeSpec(spec, dir string) (string, error) {
	switch {
	case spec == "" || spec == "sqlite:":
		return "sqlite:" + filepath.Join(dir, "drover.db"), nil
	case strings.HasPrefix(spec, "sqlite:"), strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return spec, nil
	}
	return "", fmt.Errorf("--store %q: want sqlite:[PATH] or a postgres:// URL", spec)
}

func openStore(ctx context.Context, spec string) (store.Store, error) {
	if p, ok := strings.CutPrefix(spec, "sqlite:"); ok {
		return sqlite.Open(ctx, p)
	}
	return postgres.Open(ctx, spec)
}

// kekFile is the key-encryption key of the run's store: cfg.KEKFile, or a
// new one in dir.
func kekFile(cfg *Config, dir string) (string, *kek.Ring, error) {
	path := cfg.KEKFile
	if path == "" {
		path = filepath.Join(dir, "kek")
		if err := kek.CreateFile(path); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", nil, err
		}
	}
	k, _, err := kek.LoadFile(path)
	if err != nil {
		return "", nil, err
	}
	return path, kek.NewRing(k), nil
}

// startInProcess runs a control plane in this process on loopback.
func startInProcess(ctx context.Context, cfg *Config, dir string) (*target, error) {
	spec, err := storeSpec(cfg.Store, dir)
	if err != nil {
		return nil, err
	}
	_, ring, err := kekFile(cfg, dir)
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, spec)
	if err != nil {
		return nil, err
	}
	opLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		st.Close()
		return nil, err
	}
	nodeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		opLn.Close()
		st.Close()
		return nil, err
	}
	nodeURL := "https://" + nodeLn.Addr().String()
	scfg := server.Config{OperatorAddr: opLn.Addr().String(), NodeAddr: nodeLn.Addr().String(), NodeURL: nodeURL,
		// Every simulated agent enrols from loopback: lift the per-IP limit.
		RegisterRate: rate.Inf, RegisterBurst: 1 << 20, Logger: quietLogger(cfg.Log), KEK: ring}
	srvCtx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(srvCtx, scfg, st)
	if err != nil {
		cancel()
		opLn.Close()
		nodeLn.Close()
		st.Close()
		return nil, err
	}
	tok, err := srv.CreateOperatorToken(ctx, benchToken())
	if err != nil {
		cancel()
		opLn.Close()
		nodeLn.Close()
		st.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(srvCtx, opLn, nodeLn) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		cancel()
		st.Close()
		return nil, fmt.Errorf("in-process control plane: %w", err)
	}
	return &target{mode: ModeInProcess, opURL: "http://" + opLn.Addr().String(), nodeURL: nodeURL,
		token: tok.Token, caHash: srv.CAHash(),
		stop: func() error {
			cancel()
			err := <-done
			return errors.Join(err, st.Close())
		}}, nil
}

// benchToken is the admin token a run mints. Token names are unique and a
// --store may be reused across runs, so the name carries the start time.
func benchToken() server.OperatorTokenSpec {
	return server.OperatorTokenSpec{Name: fmt.Sprintf("bench-%d", time.Now().UnixNano()), Role: api.RoleAdmin}
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startProcess runs `drover server` as a child process so that its memory
// and CPU can be read apart from the simulated agents'.
func startProcess(ctx context.Context, cfg *Config, dir string) (*target, error) {
	spec, err := storeSpec(cfg.Store, dir)
	if err != nil {
		return nil, err
	}
	kekPath, ring, err := kekFile(cfg, dir)
	if err != nil {
		return nil, err
	}
	// Mint the operator token directly in the store (as `drover token
	// create --store` does); this also creates the CA and signing keys.
	st, err := openStore(ctx, spec)
	if err != nil {
		return nil, err
	}
	srv, err := server.New(ctx, server.Config{Logger: quietLogger(nil), KEK: ring}, st)
	if err != nil {
		st.Close()
		return nil, err
	}
	tok, err := srv.CreateOperatorToken(ctx, benchToken())
	st.Close()
	if err != nil {
		return nil, err
	}
	opAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	nodeAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	exe := cfg.ServerBin
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find the drover executable: %w", err)
		}
	}
	logPath := filepath.Join(dir, "server.log")
	args := []string{"server", "--store", spec, "--listen", opAddr, "--node-listen", nodeAddr,
		"--kek-file", kekPath, "--log-level", "warn"}
	t := &target{mode: ModeServerProcess, opURL: "http://" + opAddr, nodeURL: "https://" + nodeAddr,
		token: tok.Token, caHash: srv.CAHash()}
	var ch *child
	t.stop = func() error {
		if ch != nil {
			ch.stop()
		}
		return nil
	}
	// restart SIGKILLs the child and starts a new one on the same store and
	// addresses (the reconnect storm).
	t.restart = func(ctx context.Context, killed func()) error {
		ch.kill()
		killed()
		var err error
		if ch, err = startChild(ctx, cfg, exe, args, logPath, t.opURL); err != nil {
			return err
		}
		t.pid = ch.pid
		return nil
	}
	if ch, err = startChild(ctx, cfg, exe, args, logPath, t.opURL); err != nil {
		return nil, err
	}
	t.pid = ch.pid
	return t, nil
}

// child is a running `drover server` process.
type child struct {
	cmd    *exec.Cmd
	pid    int
	exited chan error
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		c.kill()
	}
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
	c.exited <- errors.New("killed") // later waits return at once
}

// startChild starts `exe args...` (appending to logPath) and waits until
// opURL/readyz answers 200.
func startChild(ctx context.Context, cfg *Config, exe string, args []string, logPath, opURL string) (*child, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = os.Environ()
	if cfg.ServerGOMAXPROCS > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(cfg.ServerGOMAXPROCS))
	}
	if cfg.ServerGOGC != "" {
		cmd.Env = append(cmd.Env, "GOGC="+cfg.ServerGOGC)
	}
	childAttrs(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s server: %w", exe, err)
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait(); logf.Close() }()
	// Wait for readiness.
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-c.exited:
			c.exited <- err
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("control plane child exited: %v\n%s", err, log)
		default:
		}
		resp, err := http.Get(opURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.stop()
			return nil, fmt.Errorf("control plane child not ready after 60s (log: %s)", logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// opClient calls the operator API.
type opClient struct {
	base  string
	token string
	hc    *http.Client
}

func newOpClient(base, token string) *opClient {
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second,
		DialContext: (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext}
	return &opClient{base: strings.TrimRight(base, "/"), token: token, hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

func (c *opClient) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var eb api.ErrorBody
		_ = json.Unmarshal(raw, &eb)
		return fmt.Errorf("%s %s: HTTP %d %s: %s", method, path, resp.StatusCode, eb.Error.Code, eb.Error.Message)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}
