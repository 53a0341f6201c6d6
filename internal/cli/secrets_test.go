package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretsCommands: set from a file and from stdin, list (names and
// versions, never the value), delete refusing without --yes off a
// terminal, then deleting with it.
func TestSecretsCommands(t *testing.T) {
	apiURL, token := startServer(t)
	run := func(stdin string, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", apiURL, "--token", token),
			&Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	const value = "cli-s3cr3t\x00\xffbytes"
	f := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(f, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	check := func(wantCode int, wantOut string, stdin string, args ...string) {
		t.Helper()
		code, out, errOut := run(stdin, args...)
		all.WriteString(out + errOut)
		if code != wantCode || !strings.Contains(out+errOut, wantOut) {
			t.Fatalf("drover %s: exit %d\nstdout: %s\nstderr: %s\nwant exit %d and %q", strings.Join(args, " "),
				code, out, errOut, wantCode, wantOut)
		}
	}
	check(0, "secret db-password set (version 1)", "", "secrets", "set", "db-password", "--from-file", f)
	check(0, "secret db-password set (version 2)", "other-"+value, "secrets", "set", "db-password", "--from-stdin")
	check(1, "--from-file FILE or --from-stdin", "", "secrets", "set", "db-password")
	check(2, "can't be used together", "", "secrets", "set", "db-password", "--from-file", f, "--from-stdin")
	check(1, "invalid_payload", "", "secrets", "set", "Bad_Name", "--from-file", f)
	check(0, "db-password", "", "secrets", "list")
	if code, out, _ := run("", "secrets", "list"); code != 0 || !strings.Contains(out, "VERSION") ||
		!strings.Contains(out, "operator:cli-test") {
		t.Errorf("list: %s", out)
	}
	check(0, `"version": 2`, "", "secrets", "list", "--json")
	check(1, "--yes", "", "secrets", "delete", "db-password")
	check(0, "deleted secret db-password", "", "secrets", "delete", "db-password", "--yes")
	check(1, "secret_not_found", "", "secrets", "delete", "db-password", "--yes")
	if strings.Contains(all.String(), "cli-s3cr3t") {
		t.Error("a command printed the secret value")
	}
}
