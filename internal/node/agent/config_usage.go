package agent

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"

	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
)

// HelpError is what LoadConfig returns for -h / -help / --help: not a
// failure, the usage text to print (on stdout, exit 0) instead of running.
type HelpError struct{ Usage string }

func (e *HelpError) Error() string { return "help requested" }

// flagAlias says whether a flag sets another flag's key rather than a key
// of its own, and which flag that is.
func flagAlias(name string) (string, bool) {
	switch name {
	case "node-id":
		return "host-id", true
	case "orchestrator":
		return "control-plane-url", true
	}
	return "", false
}

// envKeyOf is the NODE_AGENT_* key a flag overrides: the flag's name in
// upper case with dashes as underscores, after following an alias.
func envKeyOf(name string) string {
	if to, ok := flagAlias(name); ok {
		name = to
	}
	return "NODE_AGENT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// knownKey reports whether key is a configuration key LoadConfig reads
// with c's runtimes registered.
func (c Config) knownKey(key string) bool {
	_, ok := c.fields()[key]
	_, owned := c.runtimeKeys()[key]
	return ok || owned || slices.Contains(numericKeys(), key) || key == "NODE_AGENT_CONFIG" || key == "NODE_AGENT_ENV_FILE"
}

// flagDefault is the value a flag has when neither it, its environment
// variable nor the config file sets it.
func flagDefault(name string, d Config) string {
	switch name {
	case "os-family":
		return d.OSFamily
	case "state-dir":
		return d.StateDir
	case "listen":
		return d.ListenAddr
	case "runtime":
		return d.Runtime
	case "image-dirs":
		return d.ImageDirs
	case "env-file":
		return DefaultEnvFile(runtime.GOOS, os.Getenv)
	case "host-id", "node-id":
		return "generated and persisted in the state dir"
	case "terminal-url":
		return "the control plane URL"
	case "hostname":
		return "the system's hostname"
	case "heartbeat-interval":
		return "the server's (5s)"
	case "reconcile-interval":
		return "5s"
	case "restart-backoff":
		return "1s"
	case "restart-backoff-max":
		return "5m"
	case "crash-loop-threshold":
		return "5"
	case "task-slots":
		return "4"
	case "runtime-dir":
		return "<state dir>/runtime"
	case "reserved-vcpus", "reserved-memory-mib":
		return "0"
	case "disk-pressure-percent":
		return "90"
	case "oci-cache-max-gib":
		return "20"
	}
	return ""
}

// usage lists every flag with its environment variable and default.
func usage(fs *flag.FlagSet, d Config) string {
	var b strings.Builder
	b.WriteString(`Usage: drover-agent [flags]
       drover-agent config show [flags]
       drover-agent preflight|status [flags]
       drover-agent version

The Drover node agent. It enrols with the control plane, then heartbeats,
runs signed tasks and keeps this host's instances. Each setting comes from,
highest first: a flag, its NODE_AGENT_* environment variable, the -config
file (TOML, YAML or JSON with the keys in lower case without NODE_AGENT_,
e.g. control_plane_url; or KEY=VALUE lines), the env file (-env-file,
KEY=VALUE lines), the default. 'drover-agent config show' prints each
setting with its source (docs/configuration.md).

Flags:
`)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		env := envKeyOf(f.Name)
		if !d.knownKey(env) {
			env = "-"
		}
		line := f.Usage
		if def := flagDefault(f.Name, d); def != "" && !strings.Contains(line, "(default ") && !strings.Contains(line, "(default:") {
			line += " (default " + def + ")"
		}
		fmt.Fprintf(tw, "  -%s\t%s\t%s\n", f.Name, env, line)
	})
	_ = tw.Flush()
	return b.String()
}

// ConfigKey is one NODE_AGENT_* configuration key: the flag that overrides
// it and that flag's usage text.
type ConfigKey struct {
	Key   string // e.g. NODE_AGENT_STATE_DIR
	Flag  string // e.g. -state-dir; "" when no flag sets the key
	Usage string
}

// ConfigKeys returns every configuration key LoadConfig reads with
// runtimes registered (theirs included), sorted by key (docs/contract.md
// lists them).
func ConfigKeys(runtimes noderuntime.Registry) []ConfigKey {
	var f Config
	fs, _ := newFlagSet(&f, "", "", runtimes)
	flagOf := map[string]*flag.Flag{}
	fs.VisitAll(func(fl *flag.Flag) {
		if _, alias := flagAlias(fl.Name); !alias {
			flagOf[envKeyOf(fl.Name)] = fl
		}
	})
	keys := append([]string{"NODE_AGENT_CONFIG", "NODE_AGENT_ENV_FILE"}, numericKeys()...)
	for k := range f.fields() {
		keys = append(keys, k)
	}
	for k := range (Config{Runtimes: runtimes}).runtimeKeys() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]ConfigKey, 0, len(keys))
	for _, k := range keys {
		ck := ConfigKey{Key: k}
		if fl := flagOf[k]; fl != nil {
			ck.Flag, ck.Usage = "-"+fl.Name, fl.Usage
		}
		out = append(out, ck)
	}
	return out
}
