package agent

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/drover-dev/drover/internal/configfile"
	"github.com/drover-dev/drover/internal/node/netsetup"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// LoadOption changes where LoadConfig looks for its files.
type LoadOption func(*loadOptions)

type loadOptions struct {
	envFile string // the env file read when nothing names one; "" for none
}

// WithDefaultEnvFile sets the env file LoadConfig reads when neither
// -env-file nor NODE_AGENT_ENV_FILE names one ("" reads none). Without
// it, that is DefaultEnvFile.
func WithDefaultEnvFile(path string) LoadOption {
	return func(o *loadOptions) { o.envFile = path }
}

// DefaultEnvFile is the env file the agent reads when nothing names one:
// /etc/drover-agent/env, on Windows %ProgramData%\drover-agent\env.
func DefaultEnvFile(goos string, getenv func(string) string) string {
	if goos == "windows" {
		dir := getenv("ProgramData")
		if dir == "" {
			dir = `C:\ProgramData`
		}
		return strings.TrimRight(dir, `\`) + `\drover-agent\env`
	}
	return "/etc/drover-agent/env"
}

// Sources of a value, as `drover-agent config show` prints them.
const (
	srcDefault = "default"
)

// loaded is a configuration with where each of its keys came from.
type loaded struct {
	cfg Config
	// src is the source of every key that is not at its default:
	// "env-file PATH:LINE", "config PATH:LINE", "env NODE_AGENT_X" or
	// "flag -x".
	src map[string]string
	// envFile and configFile are the files read ("" for none); envFileNote
	// says "absent" when the default env file does not exist.
	envFile, envFileNote, configFile string
}

// load reads the configuration from its layers, lowest first: defaults,
// env file, config file, environment, flags. It does not validate.
func load(args []string, getenv func(string) string, runtimes noderuntime.Registry, opts []LoadOption) (*loaded, error) {
	o := loadOptions{envFile: DefaultEnvFile(runtime.GOOS, getenv)}
	for _, opt := range opts {
		opt(&o)
	}
	l := &loaded{src: map[string]string{}, cfg: Config{OSFamily: api.OSFamilyOf(runtime.GOOS), StateDir: defaultStateDir(),
		ListenAddr: "127.0.0.1:9000", Runtime: DefaultRuntime, ImageDirs: DefaultImageDir, Runtimes: runtimes,
		MicroVMBridge: netsetup.DefaultBridge, MicroVMCIDR: netsetup.DefaultCIDR, MicroVMDNS: netsetup.DefaultDNS,
		SliceBridge: task.DefaultOVSBridge, Local: DefaultLocalWorkloads()}}
	envFileDefault, envFileExplicit := o.envFile, false
	if v := getenv("NODE_AGENT_ENV_FILE"); v != "" {
		envFileDefault, envFileExplicit = v, true
	}
	var f Config
	fs, meta := newFlagSet(&f, getenv("NODE_AGENT_CONFIG"), envFileDefault, runtimes)
	fs.Lookup("runtime").Usage = "instance runtime: " + strings.Join(l.cfg.runtimeNames(), " | ")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, &HelpError{Usage: usage(fs, l.cfg)}
		}
		return nil, fmt.Errorf("flags: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	visited := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { visited[fl.Name] = true })

	if path := *meta.envFile; path != "" {
		if err := l.loadEnvFile(path, envFileExplicit || visited["env-file"]); err != nil {
			return nil, err
		}
	}
	if path := *meta.config; path != "" {
		if err := l.loadConfigFile(path); err != nil {
			return nil, err
		}
	}
	for _, key := range l.cfg.settableKeys() {
		if v := getenv(key); v != "" {
			if err := l.set(key, v, "env "+key); err != nil {
				return nil, fmt.Errorf("environment: %w", err)
			}
		}
	}
	var errs []error
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "config" || fl.Name == "env-file" || fl.Name == "orchestrator" {
			return
		}
		key, v := envKeyOf(fl.Name), fl.Value.String()
		if v == "" && l.cfg.kindOf(key) == kindString {
			return // an empty string flag overrides nothing, like an empty variable
		}
		if err := l.set(key, v, "flag -"+fl.Name); err != nil {
			errs = append(errs, fmt.Errorf("flag -%s: %w", fl.Name, err))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if visited["orchestrator"] {
		if visited["control-plane-url"] {
			return nil, errors.New("flags: -orchestrator is an alias of -control-plane-url: give one of them")
		}
		l.cfg.ControlPlaneURL, l.src["NODE_AGENT_CONTROL_PLANE_URL"] = OrchestratorURL(*meta.orchestrator), "flag -orchestrator"
	}
	if l.cfg.TerminalURL == "" {
		l.cfg.TerminalURL = l.cfg.ControlPlaneURL
	}
	return l, nil
}

// OrchestratorURL is the control plane URL -orchestrator means (seed 003's
// flag): host:port is https://host:port; a URL is taken as it is.
func OrchestratorURL(v string) string {
	if v == "" || strings.Contains(v, "://") {
		return v
	}
	return "https://" + v
}

// set sets key to val, parsed, and records its source.
func (l *loaded) set(key, val, src string) error {
	c := &l.cfg
	_, runtimeKey := c.runtimeKeys()[key]
	switch {
	case c.fields()[key] != nil:
		*c.fields()[key] = val
	case runtimeKey:
		c.setRuntimeKey(key, val)
	case slices.Contains(numericKeys(), key):
		if err := c.setNumeric(key, val); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown key %q", key)
	}
	l.src[key] = src
	return nil
}

// settableKeys are the NODE_AGENT_* keys the layers set, sorted (not
// NODE_AGENT_CONFIG or NODE_AGENT_ENV_FILE, which name the files).
func (c Config) settableKeys() []string {
	keys := numericKeys()
	for k := range c.fields() {
		keys = append(keys, k)
	}
	for k := range c.runtimeKeys() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Value kinds of the keys, for the typed config files.
const (
	kindString   = "string"
	kindBool     = "bool"
	kindDuration = "duration"
	kindInt      = "int"
	kindList     = "list" // a string of comma-separated items; a file may give a list
)

func (c Config) kindOf(key string) string {
	if k := c.presetKind(key); k != "" {
		return k
	}
	switch key {
	case "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS", "NODE_AGENT_SLICE_INSTALL_DEPENDENCIES":
		return kindBool
	case "NODE_AGENT_HEARTBEAT_INTERVAL", "NODE_AGENT_RECONCILE_INTERVAL", "NODE_AGENT_RESTART_BACKOFF",
		"NODE_AGENT_RESTART_BACKOFF_MAX", "NODE_AGENT_SLICE_TELEMETRY_INTERVAL":
		return kindDuration
	case "NODE_AGENT_RESERVED_VCPUS", "NODE_AGENT_RESERVED_MEMORY_MIB", "NODE_AGENT_DISK_PRESSURE_PERCENT",
		"NODE_AGENT_OCI_CACHE_MAX_GIB", "NODE_AGENT_CRASH_LOOP_THRESHOLD", "NODE_AGENT_TASK_SLOTS":
		return kindInt
	case "NODE_AGENT_IMAGE_DIRS":
		return kindList
	}
	return kindString
}

// FileKey is a key's name in a TOML, YAML or JSON config file: the
// NODE_AGENT_* key in lower case without the prefix (NODE_AGENT_QEMU_BINARY
// is qemu_binary).
func FileKey(envKey string) string {
	return strings.ToLower(strings.TrimPrefix(envKey, "NODE_AGENT_"))
}

// envLine is one KEY=VALUE line of an env file.
type envLine struct {
	key, val string
	line     int
}

// readEnvLines reads KEY=VALUE lines: blank lines and # comments are
// skipped, "export " and quotes around the value are allowed.
func readEnvLines(path string) ([]envLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []envLine
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			return nil, fmt.Errorf("%s:%d: want KEY=VALUE", path, n)
		}
		out = append(out, envLine{key, strings.Trim(strings.TrimSpace(val), `"'`), n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// loadEnvFile applies the env file at path. A missing file is fine unless
// it was named (explicit). Variables without the NODE_AGENT_ prefix are
// left to the process's environment (systemd's EnvironmentFile= passes
// them, e.g. HTTPS_PROXY); an unknown NODE_AGENT_* key is an error.
func (l *loaded) loadEnvFile(path string, explicit bool) error {
	lines, err := readEnvLines(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		l.envFile, l.envFileNote = path, "absent"
		return nil
	}
	if err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	l.envFile = path
	for _, ln := range lines {
		if !strings.HasPrefix(ln.key, "NODE_AGENT_") {
			continue
		}
		if ln.key == "NODE_AGENT_CONFIG" || ln.key == "NODE_AGENT_ENV_FILE" {
			return fmt.Errorf("env file %s:%d: %s names a file: set it in the environment or with its flag", path, ln.line, ln.key)
		}
		if err := l.set(ln.key, ln.val, fmt.Sprintf("env-file %s:%d", path, ln.line)); err != nil {
			return fmt.Errorf("env file %s:%d: %w", path, ln.line, err)
		}
	}
	return nil
}

// loadConfigFile applies -config: TOML, YAML or JSON by its extension,
// otherwise KEY=VALUE lines (the agent's older env-style config file,
// whose every key must be known).
func (l *loaded) loadConfigFile(path string) error {
	l.configFile = path
	format, typed := configfile.FormatOf(path)
	if !typed {
		lines, err := readEnvLines(path)
		if err != nil {
			return fmt.Errorf("config file %w", err)
		}
		for _, ln := range lines {
			if err := l.set(ln.key, ln.val, fmt.Sprintf("config %s:%d", path, ln.line)); err != nil {
				return fmt.Errorf("config file %s:%d: %w", path, ln.line, err)
			}
		}
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	entries, err := configfile.Parse(path, format, data)
	if err != nil {
		return fmt.Errorf("config file %w", err)
	}
	byName := map[string]string{}
	for _, k := range l.cfg.settableKeys() {
		byName[FileKey(k)] = k
	}
	for _, e := range entries {
		key, ok := byName[e.Key]
		if !ok {
			msg := fmt.Sprintf("unknown key %q", e.Key)
			if k, ok := byName[FileKey(strings.ToUpper(strings.ReplaceAll(e.Key, "-", "_")))]; ok {
				msg += fmt.Sprintf(" (did you mean %s? keys are the NODE_AGENT_* names in lower case without the prefix)", FileKey(k))
			}
			return fmt.Errorf("config file %w", &configfile.Error{Path: path, Line: e.Line, Err: errors.New(msg)})
		}
		val, err := l.cfg.fileValue(key, e.Value)
		if err == nil {
			err = l.set(key, val, fmt.Sprintf("config %s:%d", path, e.Line))
		}
		if err != nil {
			return fmt.Errorf("config file %w", &configfile.Error{Path: path, Line: e.Line, Key: e.Key, Err: err})
		}
	}
	return nil
}

// fileValue is the text of a typed file's value v for key: the type must
// fit the key's kind.
func (c Config) fileValue(key string, v any) (string, error) {
	got := func() string {
		if s, ok := configfile.Scalar(v); ok {
			return fmt.Sprintf("%s %q", configfile.TypeName(v), s)
		}
		return configfile.TypeName(v)
	}
	switch c.kindOf(key) {
	case kindBool:
		if b, ok := v.(bool); ok {
			return fmt.Sprint(b), nil
		}
		return "", fmt.Errorf("want true or false, got %s", got())
	case kindDuration:
		if s, ok := v.(string); ok {
			return s, nil
		}
		return "", fmt.Errorf(`want a duration string such as "5s", got %s`, got())
	case kindInt:
		if n, ok := v.(int64); ok {
			return fmt.Sprint(n), nil
		}
		return "", fmt.Errorf("want a whole number, got %s", got())
	case kindList:
		if items, ok := v.([]any); ok {
			var out []string
			for _, it := range items {
				s, ok := it.(string)
				if !ok {
					return "", fmt.Errorf("want a list of strings, got a %s in it", configfile.TypeName(it))
				}
				out = append(out, s)
			}
			return strings.Join(out, ","), nil
		}
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	return "", fmt.Errorf("want a string, got %s", got())
}

// validate is Config.Validate with each error that names a key set
// somewhere other than its default followed by where it was set.
func (l *loaded) validate() error {
	err := l.cfg.Validate()
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
		best, at := "", -1
		for key := range l.src {
			// The first key the message names; of keys at the same place
			// (NODE_AGENT_RUNTIME, NODE_AGENT_RUNTIME_DIR), the longest.
			if j := strings.Index(e.Error(), key); j >= 0 && (at < 0 || j < at || (j == at && len(key) > len(best))) {
				best, at = key, j
			}
		}
		if best != "" {
			out[i] = fmt.Errorf("%w (set by %s)", e, l.src[best])
		}
	}
	return errors.Join(out...)
}
