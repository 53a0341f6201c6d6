package integration

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/testutil"
)

var updateContract = flag.Bool("update", false, "rewrite the generated sections of docs/contract.md")

// contractPath is the document TestContractDoc keeps in step with the code.
const contractPath = "../../docs/contract.md"

// TestContractDoc renders the code's tables (routes, task types, phases,
// reason codes, statuses, states, terminal codes, slice VM phases,
// configuration keys) into the generated sections of docs/contract.md and
// fails when the file differs; go test -run TestContractDoc -update
// rewrites those sections and leaves the prose between them alone.
func TestContractDoc(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	sections := contractSections(t, e.srv.OperatorRouteTable())
	raw, err := os.ReadFile(contractPath)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fillSections(string(raw), sections)
	if err != nil {
		t.Fatal(err)
	}
	if *updateContract {
		testutil.CheckGolden(t, contractPath, []byte(got), true)
		return
	}
	if got != string(raw) {
		t.Errorf("docs/contract.md is not what the code says (go test ./internal/integration -run TestContractDoc -update rewrites it):\n%s",
			testutil.LineDiff(string(raw), got))
	}
}

// fillSections replaces the body of every generated section of doc with
// sections[name]. A section is the lines between "<!-- generated:NAME -->"
// and "<!-- end generated:NAME -->"; every name must appear exactly once
// and the document may hold no section the code does not render.
func fillSections(doc string, sections map[string]string) (string, error) {
	re := regexp.MustCompile(`<!-- generated:([a-z0-9-]+) -->\n`)
	var b strings.Builder
	seen := map[string]bool{}
	for {
		loc := re.FindStringSubmatchIndex(doc)
		if loc == nil {
			b.WriteString(doc)
			break
		}
		name := doc[loc[2]:loc[3]]
		body, ok := sections[name]
		if !ok {
			return "", fmt.Errorf("docs/contract.md has a generated section %q the test does not render", name)
		}
		if seen[name] {
			return "", fmt.Errorf("docs/contract.md has generated section %q twice", name)
		}
		seen[name] = true
		end := "<!-- end generated:" + name + " -->"
		rest := doc[loc[1]:]
		i := strings.Index(rest, end)
		if i < 0 {
			return "", fmt.Errorf("docs/contract.md: section %q has no %q", name, end)
		}
		b.WriteString(doc[:loc[1]])
		b.WriteString(body)
		doc = rest[i:]
	}
	for name := range sections {
		if !seen[name] {
			return "", fmt.Errorf("docs/contract.md lacks <!-- generated:%s --> ... <!-- end generated:%s -->", name, name)
		}
	}
	return b.String(), nil
}

// mdTable renders a Markdown table. A "|" in a cell is escaped, and so
// are "<" and ">" outside code spans, so "<arch>" is not read as HTML.
func mdTable(header []string, rows [][]string) string {
	var b strings.Builder
	html := strings.NewReplacer("<", "&lt;", ">", "&gt;")
	line := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			parts := strings.Split(c, "`")
			for i := 0; i < len(parts); i += 2 {
				parts[i] = html.Replace(parts[i])
			}
			b.WriteString(" " + strings.ReplaceAll(strings.Join(parts, "`"), "|", `\|`) + " |")
		}
		b.WriteString("\n")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

// code wraps s in backticks.
func code(s string) string { return "`" + s + "`" }

// constsOfType returns the values of the string constants of type typ
// declared in the Go package in dir, in declaration order (files by name).
// It reads the source, so a constant cannot be added without the
// contract noticing.
func constsOfType(t *testing.T, dir, typ string) []string {
	t.Helper()
	return constsWhere(t, dir, func(name string, typeName string) bool { return typeName == typ })
}

// constsWhere returns the values of the string constants in dir for which
// keep(name, type) holds ("" for an untyped constant).
func constsWhere(t *testing.T, dir string, keep func(name, typ string) bool) []string {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	var out []string
	for _, fn := range names {
		if strings.HasSuffix(fn, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, fn, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				typ := ""
				if id, ok := vs.Type.(*ast.Ident); ok {
					typ = id.Name
				}
				for i, n := range vs.Names {
					if i >= len(vs.Values) || !keep(n.Name, typ) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// describe renders name | meaning rows for names, in their order, and
// fails when a name has no meaning or a meaning names nothing in names.
func describe(t *testing.T, what string, names []string, meaning map[string]string) [][]string {
	t.Helper()
	var rows [][]string
	for _, n := range names {
		m, ok := meaning[n]
		if !ok {
			t.Errorf("%s %q has no meaning in contract_tables_test.go", what, n)
		}
		rows = append(rows, []string{code(n), m})
	}
	for n := range meaning {
		if !slices.Contains(names, n) {
			t.Errorf("contract_tables_test.go describes %s %q, which the code does not have", what, n)
		}
	}
	return rows
}
