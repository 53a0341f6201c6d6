// Package configfile reads the flat TOML, YAML and JSON configuration files
// of drover-agent (-config) and the control plane (drover server --config):
// one top-level table of key = value, each entry with its line so that an
// unknown key or a bad value can be reported where it is.
//
// The format comes from the file's extension (.toml, .yaml/.yml, .json).
// Values are normalized across the formats: string, int64, float64, bool,
// []any, map[string]any, nil (YAML/JSON null) or, from TOML only, a date
// or time value.
package configfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
	"go.yaml.in/yaml/v3"
)

// Format is a configuration file's syntax.
type Format string

// The formats, by extension.
const (
	TOML Format = "toml"
	YAML Format = "yaml"
	JSON Format = "json"
)

// FormatOf is the format of path by its extension; false for any other
// extension (drover-agent reads those as KEY=VALUE env files).
func FormatOf(path string) (Format, bool) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".toml":
		return TOML, true
	case ".yaml", ".yml":
		return YAML, true
	case ".json":
		return JSON, true
	}
	return "", false
}

// Entry is one top-level key of a file.
type Entry struct {
	Key   string
	Value any
	Line  int // 1-based line of the key
}

// Error is a problem at one place of a file: Key is "" for a syntax
// error.
type Error struct {
	Path string
	Line int // 0 when unknown
	Key  string
	Err  error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Path)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		fmt.Fprintf(&b, "%s: ", e.Key)
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Read reads and parses path by its extension.
func Read(path string) ([]Entry, error) {
	f, ok := FormatOf(path)
	if !ok {
		return nil, fmt.Errorf("%s: not a .toml, .yaml, .yml or .json file", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, f, data)
}

// Parse parses data (the contents of path, which names it in errors) as
// format f. Entries come in the order of their lines; a key given twice
// is an error.
func Parse(path string, f Format, data []byte) ([]Entry, error) {
	var (
		out []Entry
		err error
	)
	switch f {
	case TOML:
		out, err = parseTOML(path, data)
	case YAML:
		out, err = parseYAML(path, data)
	case JSON:
		out, err = parseJSON(path, data)
	default:
		return nil, fmt.Errorf("%s: unknown format %q", path, f)
	}
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b Entry) int { return a.Line - b.Line })
	seen := map[string]int{}
	for _, e := range out {
		if first, dup := seen[e.Key]; dup {
			return nil, &Error{Path: path, Line: e.Line, Key: e.Key, Err: fmt.Errorf("set again (first on line %d)", first)}
		}
		seen[e.Key] = e.Line
	}
	return out, nil
}

func parseTOML(path string, data []byte) ([]Entry, error) {
	var m map[string]any
	if err := toml.Unmarshal(data, &m); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, _ := de.Position()
			return nil, &Error{Path: path, Line: row, Err: fmt.Errorf("toml: %w", err)}
		}
		return nil, &Error{Path: path, Err: fmt.Errorf("toml: %w", err)}
	}
	// The decoder gives the values, the parser the line of each top-level
	// name: a key, the first part of a dotted key, or a [table] header.
	lines := map[string]int{}
	p := unstable.Parser{}
	p.Reset(data)
	for p.NextExpression() {
		e := p.Expression()
		var key *unstable.Node
		switch e.Kind {
		case unstable.KeyValue, unstable.Table, unstable.ArrayTable:
			it := e.Key()
			if it.Next() {
				key = it.Node()
			}
		}
		if key == nil {
			continue
		}
		name := string(key.Data)
		if _, ok := lines[name]; !ok {
			lines[name] = p.Shape(key.Raw).Start.Line
		}
	}
	out := make([]Entry, 0, len(m))
	for k, v := range m {
		out = append(out, Entry{Key: k, Value: normalize(v), Line: lines[k]})
	}
	return out, nil
}

func parseYAML(path string, data []byte) ([]Entry, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{Path: path, Err: err} // yaml's message names the line
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil // empty document
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, &Error{Path: path, Line: root.Line, Err: errors.New("want a mapping of key: value at the top level")}
	}
	var out []Entry
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, &Error{Path: path, Line: k.Line, Err: errors.New("a key must be a plain string")}
		}
		var val any
		if err := v.Decode(&val); err != nil {
			return nil, &Error{Path: path, Line: v.Line, Key: k.Value, Err: err}
		}
		out = append(out, Entry{Key: k.Value, Value: normalize(val), Line: k.Line})
	}
	return out, nil
}

func parseJSON(path string, data []byte) ([]Entry, error) {
	lineAt := func(off int64) int { return 1 + bytes.Count(data[:min(int(off), len(data))], []byte("\n")) }
	wrap := func(err error, off int64) error {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			off = se.Offset
		case errors.As(err, &te):
			off = te.Offset
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			err, off = errors.New("unexpected end of JSON input"), int64(len(data))
		}
		return &Error{Path: path, Line: lineAt(off), Err: fmt.Errorf("json: %w", err)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, wrap(err, dec.InputOffset())
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, &Error{Path: path, Line: lineAt(dec.InputOffset()), Err: errors.New("json: want an object of \"key\": value at the top level")}
	}
	var out []Entry
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, wrap(err, dec.InputOffset())
		}
		key, _ := tok.(string)
		line := lineAt(dec.InputOffset())
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, wrap(err, dec.InputOffset())
		}
		out = append(out, Entry{Key: key, Value: normalize(v), Line: line})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, wrap(err, dec.InputOffset())
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &Error{Path: path, Line: lineAt(dec.InputOffset()), Err: errors.New("json: data after the top-level object")}
	}
	return out, nil
}

// normalize maps the decoders' types onto the package's.
func normalize(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case uint64:
		return float64(x)
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	}
	return v
}

// TypeName names v's type for an error message.
func TypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case int64:
		return "integer"
	case float64:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "list"
	case map[string]any:
		return "table"
	case time.Time, toml.LocalDate, toml.LocalDateTime, toml.LocalTime:
		return "date/time"
	}
	return fmt.Sprintf("%T", v)
}

// Scalar renders a string, integer, whole float, boolean as the text a
// flag would take; false for anything else (lists, tables, null, dates).
func Scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case int64:
		return fmt.Sprint(x), true
	case float64:
		return fmt.Sprint(x), true
	case bool:
		return fmt.Sprint(x), true
	}
	return "", false
}
