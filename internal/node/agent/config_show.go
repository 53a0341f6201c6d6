package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"

	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
)

// ShownSetting is one row of `drover-agent config show`.
type ShownSetting struct {
	Key    string `json:"key"`    // the config file key, e.g. control_plane_url
	Env    string `json:"env"`    // the environment variable, e.g. NODE_AGENT_CONTROL_PLANE_URL
	Value  string `json:"value"`  // secrets redacted; "" when unset
	Source string `json:"source"` // default | env-file PATH:LINE | config PATH:LINE | env NODE_AGENT_X | flag -x
}

// ShownConfig is what `drover-agent config show --json` prints.
type ShownConfig struct {
	EnvFile       string         `json:"env_file,omitempty"`
	EnvFileAbsent bool           `json:"env_file_absent,omitempty"`
	ConfigFile    string         `json:"config_file,omitempty"`
	Settings      []ShownSetting `json:"settings"`
	// Invalid is why the agent would refuse this configuration; "" when
	// it would run with it.
	Invalid string `json:"invalid,omitempty"`
}

// redactedValue replaces a secret's value.
const redactedValue = "<redacted>"

// secretConfigKey reports whether a config key holds a secret: a token,
// password, secret, credential or key, unless it names where one is
// (…_dir, …_file, …_path, …_url) or is a public pin (…_hash).
func secretConfigKey(fileKey string) bool {
	words := strings.Split(fileKey, "_")
	switch words[len(words)-1] {
	case "dir", "file", "path", "url", "hash", "dirs":
		return false
	}
	for _, w := range words {
		switch w {
		case "token", "tokens", "secret", "secrets", "password", "passwd", "key", "credential", "credentials", "private":
			return true
		}
	}
	return false
}

// redactValue hides a secret key's value and the password of a URL.
func redactValue(fileKey, v string) string {
	if v == "" {
		return ""
	}
	if secretConfigKey(fileKey) {
		return redactedValue
	}
	if u, err := url.Parse(v); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "redacted")
			return u.String()
		}
	}
	return v
}

// value is key's value as text ("" when unset; a runtime setting nothing
// set is its runtime's default).
func (c Config) value(key string) string {
	if p := c.fields()[key]; p != nil {
		return *p
	}
	if rs, ok := c.runtimeKeys()[key]; ok {
		if v, ok := c.RuntimeSettings[key]; ok {
			return v
		}
		return rs.setting.Default
	}
	if v := c.presetValue(key); v != "" {
		return v
	}
	switch key {
	case "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS":
		return fmt.Sprint(c.ImageAllowLocalURLs)
	case "NODE_AGENT_SLICE_INSTALL_DEPENDENCIES":
		return fmt.Sprint(c.SliceInstallDependencies)
	case "NODE_AGENT_SLICE_TELEMETRY_INTERVAL":
		return durationText(c.SliceTelemetryInterval.String(), c.SliceTelemetryInterval == 0)
	case "NODE_AGENT_HEARTBEAT_INTERVAL":
		return durationText(c.HeartbeatInterval.String(), c.HeartbeatInterval == 0)
	case "NODE_AGENT_RECONCILE_INTERVAL":
		return durationText(c.ReconcileInterval.String(), c.ReconcileInterval == 0)
	case "NODE_AGENT_RESTART_BACKOFF":
		return durationText(c.RestartBackoff.String(), c.RestartBackoff == 0)
	case "NODE_AGENT_RESTART_BACKOFF_MAX":
		return durationText(c.RestartBackoffMax.String(), c.RestartBackoffMax == 0)
	case "NODE_AGENT_CRASH_LOOP_THRESHOLD":
		return fmt.Sprint(c.CrashLoopThreshold)
	case "NODE_AGENT_TASK_SLOTS":
		return fmt.Sprint(c.taskSlots())
	case "NODE_AGENT_RESERVED_VCPUS":
		return fmt.Sprint(c.ReservedVCPUs)
	case "NODE_AGENT_RESERVED_MEMORY_MIB":
		return fmt.Sprint(c.ReservedMemoryMiB)
	case "NODE_AGENT_DISK_PRESSURE_PERCENT":
		return fmt.Sprint(c.diskPressurePercent())
	case "NODE_AGENT_OCI_CACHE_MAX_GIB":
		return fmt.Sprint(c.OCICacheMaxBytes() >> 30)
	}
	return ""
}

func durationText(s string, zero bool) string {
	if zero {
		return ""
	}
	return s
}

// show lists every setting of l with its value and source.
func (l *loaded) show() ShownConfig {
	out := ShownConfig{EnvFile: l.envFile, EnvFileAbsent: l.envFileNote == "absent", ConfigFile: l.configFile}
	for _, key := range l.cfg.settableKeys() {
		fk := FileKey(key)
		src := l.src[key]
		if src == "" {
			src = srcDefault
			if key == "NODE_AGENT_TERMINAL_URL" && l.cfg.TerminalURL != "" {
				src = "default (the control plane URL)"
			}
		}
		out.Settings = append(out.Settings, ShownSetting{Key: fk, Env: key, Value: redactValue(fk, l.cfg.value(key)), Source: src})
	}
	if err := l.validate(); err != nil {
		out.Invalid = err.Error()
	}
	return out
}

// ConfigCommand is `drover-agent config show [--json] [agent flags]`: it
// loads the configuration as the agent would (same flags, environment and
// files) and prints each setting's effective value and its source, secrets
// redacted. Exit code 0 when the agent would run with it, 1 when it would
// refuse it (the reasons on stderr), 2 when it cannot be read (a bad
// file, flag or key). --help prints the usage and does nothing else.
func ConfigCommand(args []string, getenv func(string) string, runtimes noderuntime.Registry, stdout, stderr io.Writer, opts ...LoadOption) int {
	const use = `Usage: drover-agent config show [--json] [agent configuration flags, e.g. -config /etc/drover-agent/agent.toml]

Prints the configuration drover-agent would run with: each setting's value
and where it came from (default | env-file PATH:LINE | config PATH:LINE |
env NODE_AGENT_X | flag -x), highest first: flag, environment, config file,
env file, default. Secrets (the bootstrap token, anything token-, secret-
or key-like, URL passwords) are redacted. Exit code 1 when the agent would
refuse the configuration, 2 when it cannot be read.
`
	if wantsHelp(args) || len(args) == 0 || args[0] != "show" {
		if wantsHelp(args) {
			fmt.Fprint(stdout, use)
			return 0
		}
		fmt.Fprint(stderr, use)
		return 2
	}
	args = args[1:]
	asJSON := false
	var rest []string
	for _, a := range args {
		if a == "-json" || a == "--json" {
			asJSON = true
			continue
		}
		rest = append(rest, a)
	}
	l, err := load(rest, getenv, runtimes, opts)
	if err != nil {
		var help *HelpError
		if errors.As(err, &help) {
			fmt.Fprint(stdout, use)
			return 0
		}
		fmt.Fprintln(stderr, "drover-agent config show:", err)
		return 2
	}
	shown := l.show()
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(shown)
	} else {
		printShown(stdout, shown)
	}
	if shown.Invalid != "" {
		fmt.Fprintf(stderr, "drover-agent config show: the agent would refuse this configuration:\n%s\n", shown.Invalid)
		return 1
	}
	return 0
}

func printShown(w io.Writer, s ShownConfig) {
	switch {
	case s.EnvFile == "":
		fmt.Fprintln(w, "env file:    none")
	case s.EnvFileAbsent:
		fmt.Fprintf(w, "env file:    %s (absent)\n", s.EnvFile)
	default:
		fmt.Fprintf(w, "env file:    %s\n", s.EnvFile)
	}
	cf := s.ConfigFile
	if cf == "" {
		cf = "none"
	}
	fmt.Fprintf(w, "config file: %s\n\n", cf)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tSOURCE")
	for _, st := range s.Settings {
		v := st.Value
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", st.Key, v, st.Source)
	}
	_ = tw.Flush()
}
