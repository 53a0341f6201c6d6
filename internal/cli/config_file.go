package cli

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/drover-dev/drover/internal/configfile"
)

// ConfigFile is `drover server --config FILE` (and `drover dev --config`):
// a TOML, YAML or JSON file (by extension) whose keys are the command's
// long flag names, in snake_case (node_listen; node-listen is accepted
// too). A value applies where neither the flag nor its DROVER_* variable
// is given: flags > environment > config file > defaults. An unknown key,
// a key given twice or a value the flag would refuse is an error naming
// the file, line and key (docs/configuration.md).
type ConfigFile string

// BeforeResolve reads the file once kong knows the command, so that its
// keys can be checked against that command's flags, and adds its resolver.
func (ConfigFile) BeforeResolve(kctx *kong.Context, trace *kong.Path) error {
	path, _ := kctx.FlagValue(trace.Flag).(ConfigFile)
	if path == "" {
		return nil
	}
	r, err := newFileResolver(string(path), kctx.Flags())
	if err != nil {
		return err
	}
	kctx.AddResolver(r)
	return nil
}

// fileResolver is a kong.Resolver over a parsed config file.
type fileResolver struct {
	path   string
	byFlag map[string]configfile.Entry // by flag name (dashed)
}

// notFileKeys are flags a config file cannot set.
func notFileKey(name string) bool { return name == "help" || name == "config" }

func newFileResolver(path string, flags []*kong.Flag) (*fileResolver, error) {
	entries, err := configfile.Read(path)
	if err != nil {
		return nil, fmt.Errorf("config file %w", err)
	}
	known := map[string]bool{}
	var names []string
	for _, f := range flags {
		if !notFileKey(f.Name) && !f.Hidden {
			known[f.Name] = true
			names = append(names, strings.ReplaceAll(f.Name, "-", "_"))
		}
	}
	slices.Sort(names)
	r := &fileResolver{path: path, byFlag: map[string]configfile.Entry{}}
	for _, e := range entries {
		name := strings.ReplaceAll(e.Key, "_", "-")
		if !known[name] {
			return nil, fmt.Errorf("config file %w", &configfile.Error{Path: path, Line: e.Line,
				Err: fmt.Errorf("unknown key %q (the keys are this command's flags: %s)", e.Key, strings.Join(names, ", "))})
		}
		if first, dup := r.byFlag[name]; dup {
			return nil, fmt.Errorf("config file %w", &configfile.Error{Path: path, Line: e.Line, Key: e.Key,
				Err: fmt.Errorf("set again (as %s on line %d)", first.Key, first.Line)})
		}
		r.byFlag[name] = e
	}
	return r, nil
}

// Validate implements kong.Resolver: the keys were checked when the file
// was read.
func (r *fileResolver) Validate(*kong.Application) error { return nil }

// Resolve implements kong.Resolver: the file's value of flag, unless one
// of the flag's environment variables is set (the environment wins over
// the file; kong only asks for flags not given on the command line).
func (r *fileResolver) Resolve(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	e, ok := r.byFlag[flag.Name]
	if !ok {
		return nil, nil
	}
	for _, env := range flag.Envs {
		if _, set := os.LookupEnv(env); set {
			return nil, nil
		}
	}
	fail := func(err error) error {
		return fmt.Errorf("config file %w", &configfile.Error{Path: r.path, Line: e.Line, Key: e.Key, Err: err})
	}
	var v any
	if s, ok := configfile.Scalar(e.Value); ok {
		v = s
	} else if items, ok := e.Value.([]any); ok && flag.IsSlice() {
		strs := make([]any, len(items))
		for i, it := range items {
			s, ok := configfile.Scalar(it)
			if !ok {
				return nil, fail(fmt.Errorf("want a list of plain values, got a %s in it", configfile.TypeName(it)))
			}
			strs[i] = s
		}
		v = strs
	} else {
		return nil, fail(fmt.Errorf("want a plain value, got %s", configfile.TypeName(e.Value)))
	}
	// Decode into a scratch value so that a bad value names its line.
	scratch := reflect.New(flag.Target.Type()).Elem()
	if err := flag.Mapper.Decode(&kong.DecodeContext{Value: flag.Value, Scan: kong.Scan().PushTyped(v, kong.FlagValueToken)}, scratch); err != nil {
		return nil, fail(err)
	}
	if flag.Enum != "" {
		if s, ok := v.(string); ok && !flag.EnumMap()[s] {
			return nil, fail(fmt.Errorf("%q must be one of %s", s, strings.Join(flag.EnumSlice(), ", ")))
		}
	}
	return v, nil
}
