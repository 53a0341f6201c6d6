package runtime

import (
	"context"
	"errors"
	"strings"
)

// Setting is one configuration key a runtime owns. The agent reads it as
// NODE_AGENT_<RUNTIME>_<NAME> (environment and config file) and
// -<runtime>-<name> (flag), both derived from the registry name, so every
// runtime's keys carry its prefix and two runtimes cannot collide.
type Setting struct {
	Name  string // upper case, underscores: BINARY is NODE_AGENT_QEMU_BINARY and -qemu-binary
	Usage string // the flag's help text (also docs/contract.md)
	// Default is the value the runtime's config is parsed with when
	// nothing sets the key ("" for none).
	Default string
}

// EnvKey is the environment and config-file key of a runtime's setting.
func EnvKey(runtime, name string) string {
	return "NODE_AGENT_" + strings.ToUpper(runtime) + "_" + strings.ToUpper(name)
}

// FlagName is the flag (without its dash) of a runtime's setting.
func FlagName(runtime, name string) string {
	return strings.ToLower(strings.ReplaceAll(runtime+"_"+name, "_", "-"))
}

// Values are a runtime's settings by Setting.Name, defaults applied.
type Values map[string]string

// Entry is what a binary registers for one runtime: its settings and how
// to build it. Make one with Plain or WithConfig.
type Entry struct {
	// Settings are the keys the runtime owns; the agent adds them to its
	// flags, environment and config file.
	Settings []Setting
	parse    func(Values) (any, error)
	build    func(context.Context, Options, any) (Runtime, error)
}

// Plain is the entry of a runtime with no settings of its own.
func Plain(f Factory) Entry {
	return Entry{
		parse: func(Values) (any, error) { return nil, nil },
		build: func(ctx context.Context, o Options, _ any) (Runtime, error) { return f(ctx, o) },
	}
}

// WithConfig is the entry of a runtime with settings: parse turns their
// values into the runtime's own typed config C (naming the key of a bad
// value), and build gets it beside the agent's Options.
func WithConfig[C any](parse func(Values) (C, error), build func(context.Context, Options, C) (Runtime, error), settings ...Setting) Entry {
	return Entry{
		Settings: settings,
		parse:    func(v Values) (any, error) { return parse(v) },
		build:    func(ctx context.Context, o Options, c any) (Runtime, error) { return build(ctx, o, c.(C)) },
	}
}

// values are the entry's settings from set (by Setting.Name; unset or
// empty ones take their default).
func (e Entry) values(set Values) Values {
	v := Values{}
	for _, s := range e.Settings {
		v[s.Name] = s.Default
		if x := set[s.Name]; x != "" {
			v[s.Name] = x
		}
	}
	return v
}

// Check parses the settings without building anything (configuration
// validation).
func (e Entry) Check(set Values) error {
	if e.parse == nil {
		return nil
	}
	_, err := e.parse(e.values(set))
	return err
}

// Build parses the settings and builds the runtime.
func (e Entry) Build(ctx context.Context, o Options, set Values) (Runtime, error) {
	if e.build == nil {
		return nil, errors.New("runtime entry has no factory (make it with Plain or WithConfig)")
	}
	c, err := e.parse(e.values(set))
	if err != nil {
		return nil, err
	}
	return e.build(ctx, o, c)
}
