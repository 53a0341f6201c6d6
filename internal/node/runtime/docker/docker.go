// Package docker owns the container runtime adapter: it runs instances
// whose image is an OCI image as containers through the Docker Engine API,
// spoken with the moby client to Docker Engine or to Podman's compatible
// service, over a unix socket or DOCKER_HOST (NODE_AGENT_DOCKER_HOST).
//
// The engine is the adapter's only state: every container it makes is
// named drover-<id> and labelled drover.instance=<id>, drover.owner,
// drover.spec-hash and drover.spec (the spec's JSON, which holds no
// secret), so a fresh adapter (an agent restart) finds, re-adopts and
// reports them from the engine alone (Recover). What it keeps on disk is
// per instance under its Root: a tmpfs with the instance's secrets
// (secrets/<id>, bind-mounted read-only at /run/drover/secrets) and a
// marker saying the last exit was asked for (stopped/<id>), so an exit is
// told apart from a crash after a restart.
//
// It must not import another adapter nor the agent; it sees only the
// runtime port and the wire's types.
package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Labels the adapter sets on its containers.
const (
	LabelInstance = "drover.instance"
	LabelOwner    = "drover.owner"
	LabelSpecHash = "drover.spec-hash"
	LabelSpec     = "drover.spec"
)

// SecretsTarget is where a container finds its secrets, one file each.
const SecretsTarget = "/run/drover/secrets"

// DefaultHost is the engine's socket when neither the setting nor
// DOCKER_HOST names one.
const DefaultHost = "unix:///var/run/docker.sock"

// Engine is the engine behind the API, as detected at start.
type Engine struct {
	Name       string // "docker" or "podman"
	Version    string // the engine's version ("20.10.24+dfsg1")
	APIVersion string // the API version negotiated ("1.41")
}

// Options configure the adapter.
type Options struct {
	// Host is the engine's address (unix:///path, tcp://...); "" reads
	// DOCKER_HOST, then DefaultHost.
	Host string
	// Root holds the per-instance secrets tmpfs and stop markers.
	Root string
	// Network is the network containers join: "" the engine's default
	// (bridge; ports are published on 127.0.0.1), "host" the host's
	// (a forward's host port is its guest port), or a network's name.
	Network string
	// AllowedDirs are the host directories bind-mounted volumes must be
	// under; a host path elsewhere is refused.
	AllowedDirs []string
	// Ulimits are the defaults for the limits a spec does not set
	// (nofile, nproc; 0: the engine's).
	Ulimits map[string]int64
	// GPUs returns the host's discovered GPUs; nil: unknown, then GPU
	// requests are passed to the engine unchecked.
	GPUs func() []api.GPU
	Log  *slog.Logger
}

// Runtime is the container runtime. Use New.
type Runtime struct {
	cli    *client.Client
	opts   Options
	host   string
	engine Engine
	log    *slog.Logger

	mu    sync.Mutex
	ready map[string]*readyState // by id: readiness since the last start
	locks map[string]*sync.Mutex // one call at a time per id
	subs  map[chan runtime.Event]struct{}
}

var (
	_ runtime.Runtime        = (*Runtime)(nil)
	_ runtime.Releaser       = (*Runtime)(nil)
	_ runtime.EngineReporter = (*Runtime)(nil)
)

// New connects to the engine, detects which it is and its API version,
// and prepares Root. It fails with a clear error when the engine is not
// reachable (not installed, not running, socket missing).
func New(ctx context.Context, o Options) (*Runtime, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Root == "" {
		return nil, errors.New("docker runtime: no state directory (Root)")
	}
	host := o.Host
	if host == "" {
		host = os.Getenv("DOCKER_HOST")
	}
	if host == "" {
		host = DefaultHost
	}
	for _, d := range []string{"secrets", "stopped"} {
		if err := os.MkdirAll(filepath.Join(o.Root, d), 0o700); err != nil {
			return nil, fmt.Errorf("docker runtime: %w", err)
		}
	}
	cli, err := client.New(client.WithHost(host))
	if err != nil {
		return nil, fmt.Errorf("docker engine address %s: %w", host, err)
	}
	r := &Runtime{cli: cli, opts: o, host: host, log: o.Log,
		ready: map[string]*readyState{}, locks: map[string]*sync.Mutex{}, subs: map[chan runtime.Event]struct{}{}}
	if r.engine, err = r.detect(ctx); err != nil {
		cli.Close()
		return nil, err
	}
	o.Log.Info("container engine", "engine", r.engine.Name, "version", r.engine.Version,
		"api_version", r.engine.APIVersion, "host", host)
	return r, nil
}

// detect asks the engine for its version: Podman names itself in the
// platform or in a component; anything else is Docker.
func (r *Runtime) detect(ctx context.Context) (Engine, error) {
	v, err := r.cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return Engine{}, r.unreachable(err)
	}
	e := Engine{Name: "docker", Version: v.Version, APIVersion: r.cli.ClientVersion()}
	if strings.Contains(strings.ToLower(v.Platform.Name), "podman") {
		e.Name = "podman"
	}
	for _, c := range v.Components {
		if strings.EqualFold(c.Name, "podman engine") || strings.EqualFold(c.Name, "podman") {
			e.Name, e.Version = "podman", c.Version
		}
	}
	return e, nil
}

// unreachable explains an engine that does not answer (seed 003's "docker
// not found" and "Cannot connect to Docker daemon").
func (r *Runtime) unreachable(err error) error {
	if path, ok := strings.CutPrefix(r.host, "unix://"); ok {
		if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
			return fmt.Errorf("docker engine not reachable at %s: the socket does not exist (is docker.io or podman installed and its service started? see docs/runbooks/containers.md): %w", r.host, err)
		}
	}
	return fmt.Errorf("docker engine not reachable at %s (is the engine running, and may this user use its socket?): %w", r.host, err)
}

// Name is the adapter's registry name.
func (r *Runtime) Name() string { return Name }

// Engine is the engine detected at start.
func (r *Runtime) Engine() Engine { return r.engine }

// Close lets go of the engine connection; containers keep running.
func (r *Runtime) Close() error {
	r.mu.Lock()
	for _, rs := range r.ready {
		rs.cancel()
	}
	r.ready = map[string]*readyState{}
	r.mu.Unlock()
	return r.cli.Close()
}

// lock serialises calls on one id; the caller runs the returned unlock.
func (r *Runtime) lock(id string) func() {
	r.mu.Lock()
	l, ok := r.locks[id]
	if !ok {
		l = &sync.Mutex{}
		r.locks[id] = l
	}
	r.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// containerName is the engine's name of an instance's container.
func containerName(id string) string { return "drover-" + id }

// fail wraps an engine error with a reason; an unreachable engine says so.
func (r *Runtime) fail(reason api.ReasonCode, op, id string, err error) error {
	if client.IsErrConnectionFailed(err) {
		err = r.unreachable(err)
	}
	return &runtime.Error{Reason: reason, Op: op, ID: id, Err: err}
}

// notFound is the error of an id the engine has no container for.
func notFound(op, id string) error {
	return &runtime.Error{Reason: api.ReasonContainerStartFailed, Op: op, ID: id,
		Err: fmt.Errorf("%w: no container %s", runtime.ErrNotFound, containerName(id))}
}

// isNotFound reports whether the engine said no such object.
func isNotFound(err error) bool { return cerrdefs.IsNotFound(err) }

// ContainerEngine is the detected engine's name and version
// (runtime.EngineReporter, for the agent's capabilities).
func (r *Runtime) ContainerEngine() (string, string) { return r.engine.Name, r.engine.Version }
