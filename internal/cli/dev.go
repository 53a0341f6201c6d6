package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/alecthomas/kong"
	"golang.org/x/sync/errgroup"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/node/agent"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
	"github.com/drover-dev/drover/internal/wire/api"
)

// DevCmd runs the whole system in one process: the control plane on
// embedded SQLite, the built-in CA and an in-process agent enrolled as this
// host. State lives under --data-dir and survives restarts.
type DevCmd struct {
	ServerFlags
	DataDir                      string `name:"data-dir" default:".drover" help:"State directory."`
	AgentListen                  string `name:"agent-listen" default:"127.0.0.1:9000" help:"Local agent API address."`
	HostID                       string `name:"host-id" help:"Host id of the local agent (default: derived from the hostname)."`
	AllowUnknownHostRegistration bool   `name:"allow-unknown-host-registration" default:"true" negatable:"" help:"Let unknown hosts enrol (dev default: on)."`
	Runtime                      string `name:"runtime" default:"qemu" enum:"${dev_runtimes}" help:"Instance runtime of the local agent: one of ${enum} (mock runs nothing)."`
	ImageDirs                    string `name:"image-dirs" help:"Comma-separated dirs local images may come from (default <data-dir>/images)."`
}

// devRuntimes are the runtimes `drover dev`'s agent links in; --runtime
// accepts their names and none (devRuntimeVars). dev's agent can also run
// the mock (runs nothing: demos without a hypervisor); drover-agent links
// only qemu.
func devRuntimes() noderuntime.Registry {
	return noderuntime.Registry{qemu.Name: qemu.Entry(), mock.Name: mock.Entry()}
}

// devRuntimeVars gives kong the values --runtime accepts (${dev_runtimes}):
// the registered runtimes, sorted, then none. An unknown value fails with
// `--runtime must be one of ...` naming them, and --help lists them.
func devRuntimeVars() kong.Vars {
	return kong.Vars{"dev_runtimes": strings.Join(append(devRuntimes().Names(), agent.RuntimeNone), ",")}
}

var nonHostID = regexp.MustCompile(`[^a-z0-9._-]+`)

func defaultHostID() string {
	h, _ := os.Hostname()
	h = strings.Trim(nonHostID.ReplaceAllString(strings.ToLower(h), "-"), "-._")
	if h == "" {
		h = "localhost"
	}
	if len(h) > 63 {
		h = h[:63]
	}
	return h
}

// Run implements the command.
func (c *DevCmd) Run(ctx context.Context, env *Env) error {
	log := newLogger(c.LogLevel)
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	st, err := openStore(ctx, "sqlite:"+filepath.Join(c.DataDir, "drover.db"), log)
	if err != nil {
		return err
	}
	defer st.Close()
	if c.RecordingDir == "" {
		c.RecordingDir = filepath.Join(c.DataDir, "recordings")
	}
	c.setDevDefaults()
	cfg := c.config(c.AllowUnknownHostRegistration, log)
	kekPath := filepath.Join(c.DataDir, "kek")
	if cfg.KEK, err = devKEK(kekPath); err != nil {
		return err
	}
	// Bound first, so a port 0 is known to New (the node URL the local
	// agent uses) and to the banner.
	opLn, nodeLn, err := server.Listen(&cfg)
	if err != nil {
		return err
	}
	defer opLn.Close() // on a return before Serve (Serve closes them too)
	defer nodeLn.Close()
	c.Listen, c.NodeListen = cfg.OperatorAddr, cfg.NodeAddr
	srv, err := server.New(ctx, cfg, st)
	if err != nil {
		return fmt.Errorf("%w (drover dev keeps its key-encryption key in %s)", err, kekPath)
	}
	hostID := c.HostID
	if hostID == "" {
		hostID = defaultHostID()
	}
	tokenFile := filepath.Join(c.DataDir, "operator.token")
	newToken := ""
	if _, err := os.Stat(tokenFile); errors.Is(err, os.ErrNotExist) {
		tok, err := createDevToken(ctx, srv)
		if err != nil {
			return err
		}
		if err := os.WriteFile(tokenFile, []byte(tok.Token+"\n"), 0o600); err != nil {
			return fmt.Errorf("write operator token: %w", err)
		}
		newToken = tok.Token
	}
	// The local agent needs a bootstrap token only until it has enrolled;
	// a fresh one is issued when its stored identity is missing or expired.
	agentCfg := agent.Config{ControlPlaneURL: srv.NodeURL(), HostID: hostID, CAHash: srv.CAHash(),
		OSFamily: "linux", StateDir: filepath.Join(c.DataDir, "agent"), ListenAddr: c.AgentListen,
		Runtime: c.Runtime, ImageDirs: c.ImageDirs, Runtimes: devRuntimes()}
	if agentCfg.ImageDirs == "" {
		abs, err := filepath.Abs(filepath.Join(c.DataDir, "images"))
		if err != nil {
			return err
		}
		agentCfg.ImageDirs = abs
	}
	if agentCfg.OSFamily = api.OSFamilyOf(runtime.GOOS); !api.ValidOSFamily(agentCfg.OSFamily) {
		return fmt.Errorf("drover dev: unsupported OS %s", runtime.GOOS)
	}
	bt, err := srv.EnsureHost(ctx, hostID, agentCfg.OSFamily)
	if err != nil {
		return err
	}
	agentCfg.BootstrapToken = bt
	ag, err := agent.New(agentCfg, agent.WithLogger(log.With("component", "agent")))
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, opLn, nodeLn) })
	g.Go(func() error {
		select {
		case <-srv.Ready():
		case <-gctx.Done():
			return nil
		}
		return ag.Run(gctx)
	})
	g.Go(func() error {
		select {
		case <-srv.Ready():
		case <-gctx.Done():
			return nil
		}
		printDevBanner(env, c, srv.NodeURL(), hostID, newToken, tokenFile)
		return nil
	})
	err = g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// setDevDefaults fills what dev defaults differently from server: the node
// listener is on loopback unless --node-listen (or DROVER_NODE_LISTEN) says
// otherwise, since with unknown-host registration on anyone who reaches it
// could enrol a host.
func (c *DevCmd) setDevDefaults() {
	if c.NodeListen == "" {
		c.NodeListen = "127.0.0.1:8443"
	}
}

// devKEK loads the key-encryption key of dev's store, kept beside it and
// created on the first start (32 random bytes, mode 0600).
func devKEK(path string) (*kek.Ring, error) {
	key, err := kek.EnsureFile(path)
	if err != nil {
		return nil, err
	}
	return kek.NewRing(key), nil
}

// createDevToken mints the admin token `drover dev` prints, named "dev". The
// token file may have been deleted while the database kept "dev" (names are
// unique), so a taken name is followed by "dev-2", "dev-3", ...
func createDevToken(ctx context.Context, srv *server.Server) (api.OperatorToken, error) {
	for i := 1; ; i++ {
		name := "dev"
		if i > 1 {
			name = fmt.Sprintf("dev-%d", i)
		}
		tok, err := srv.CreateOperatorToken(ctx, server.OperatorTokenSpec{Name: name, Role: api.RoleAdmin})
		if errors.Is(err, store.ErrConflict) && i < 100 {
			continue
		}
		if err != nil {
			return api.OperatorToken{}, fmt.Errorf("dev operator token: %w", err)
		}
		return tok, nil
	}
}

func printDevBanner(env *Env, c *DevCmd, nodeURL, hostID, newToken, tokenFile string) {
	w := env.Stdout
	fmt.Fprintf(w, "\nDrover dev is running (state in %s)\n\n", c.DataDir)
	fmt.Fprintf(w, "  operator API   http://%s\n", c.Listen)
	fmt.Fprintf(w, "  dashboard      http://%s/ui/fleet  (log in with the operator token)\n", c.Listen)
	fmt.Fprintf(w, "  node API       %s (mTLS, listening on %s)\n", nodeURL, c.NodeListen)
	fmt.Fprintf(w, "  local agent    http://%s/healthz  (host %s)\n", c.AgentListen, hostID)
	fmt.Fprintf(w, "  metrics        http://%s/metrics\n\n", c.Listen)
	if newToken != "" {
		fmt.Fprintf(w, "Operator token, role admin (shown once, also saved to %s):\n  %s\n\n", tokenFile, newToken)
	} else {
		fmt.Fprintf(w, "Operator token: in %s (create more with `drover token create NAME --role viewer|operator|admin`)\n\n", tokenFile)
	}
	fmt.Fprintf(w, "Try:\n  go run ./cmd/drover hosts list\n  go run ./cmd/drover tasks run --node %s --type diag.health_probe --wait\n\n", hostID)
}
