package docker

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Name is the adapter's registry name (NODE_AGENT_RUNTIME=docker, or
// NODE_AGENT_CONTAINER_RUNTIME=docker beside a VM runtime).
const Name = "docker"

// DefaultVolumeDir is where host-path volumes may come from by default.
const DefaultVolumeDir = "/var/lib/drover/volumes"

// Config is the docker runtime's own configuration: its
// NODE_AGENT_DOCKER_* settings (Settings), parsed by ParseConfig.
type Config struct {
	Host       string           // NODE_AGENT_DOCKER_HOST
	Network    string           // NODE_AGENT_DOCKER_NETWORK
	VolumeDirs []string         // NODE_AGENT_DOCKER_VOLUME_DIRS
	Ulimits    map[string]int64 // NODE_AGENT_DOCKER_ULIMIT_NOFILE, _NPROC
}

// Settings are the keys the docker runtime owns.
func Settings() []runtime.Setting {
	return []runtime.Setting{
		{Name: "HOST", Usage: "container engine API address, unix:///path or tcp://host:port (default DOCKER_HOST, else " + DefaultHost + ")"},
		{Name: "NETWORK", Usage: `network containers join: "" the engine's default bridge (ports published on 127.0.0.1), "host", or a network name`},
		{Name: "VOLUME_DIRS", Usage: "comma-separated host directories bind-mounted volumes must be under", Default: DefaultVolumeDir},
		{Name: "ULIMIT_NOFILE", Usage: "default nofile ulimit of a container (0: the engine's; Podman without CAP_SYS_RESOURCE needs <= 1024)"},
		{Name: "ULIMIT_NPROC", Usage: "default nproc ulimit of a container (0: the engine's)"},
	}
}

// ParseConfig builds the Config from the settings' values.
func ParseConfig(v runtime.Values) (Config, error) {
	c := Config{Host: v["HOST"], Network: v["NETWORK"], Ulimits: map[string]int64{}}
	for _, d := range strings.Split(v["VOLUME_DIRS"], ",") {
		if d = strings.TrimSpace(d); d != "" {
			c.VolumeDirs = append(c.VolumeDirs, d)
		}
	}
	for key, name := range map[string]string{"ULIMIT_NOFILE": "nofile", "ULIMIT_NPROC": "nproc"} {
		if v[key] == "" {
			continue
		}
		n, err := strconv.ParseInt(v[key], 10, 64)
		if err != nil || n < 0 {
			return Config{}, fmt.Errorf("%s %q: want a non-negative integer", runtime.EnvKey(Name, key), v[key])
		}
		c.Ulimits[name] = n
	}
	return c, nil
}

// Entry is the docker runtime's registration:
// runtime.Registry{docker.Name: docker.Entry()}.
func Entry() runtime.Entry {
	return runtime.WithConfig(ParseConfig, Factory, Settings()...)
}

// Factory builds the docker runtime from the agent's options and its own
// config; it fails when the engine does not answer.
func Factory(ctx context.Context, o runtime.Options, c Config) (runtime.Runtime, error) {
	r, err := New(ctx, Options{Host: c.Host, Root: o.Root, Network: c.Network, AllowedDirs: c.VolumeDirs,
		Ulimits: c.Ulimits, GPUs: o.GPUs, Log: o.Log})
	if err != nil {
		return nil, err
	}
	return r, nil
}
