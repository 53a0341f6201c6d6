// Package cli is the drover command line: the control plane (`drover
// server`, `drover dev`) and the operator commands that talk to the operator
// API. It holds flag parsing and presentation only; behaviour lives in
// internal/cp/server and internal/node/agent.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/alecthomas/kong"
	"golang.org/x/term"

	"github.com/drover-dev/drover/internal/wire/version"
)

// Version is this build's version (internal/wire/version: build info, or
// -ldflags "-X github.com/drover-dev/drover/internal/wire/version.Version=v1.2.3").
var Version = version.Short()

// CLI is the root command.
type CLI struct {
	Dev         DevCmd         `cmd:"" help:"Run control plane, embedded SQLite and a local agent in one process."`
	Server      ServerCmd      `cmd:"" help:"Run a control plane replica."`
	Hosts       HostsCmd       `cmd:"" help:"Manage host records."`
	Tasks       TasksCmd       `cmd:"" help:"Queue and inspect signed tasks."`
	Instances   InstancesCmd   `cmd:"" help:"Declare, inspect and scale VM instances."`
	Allocations AllocationsCmd `cmd:"" help:"Bind users to hosts or instances; terminal tokens, sessions and recordings."`
	Secrets     SecretsCmd     `cmd:"" help:"Workload secrets instances name in spec.secrets (values go in, never out)."`
	Images      ImagesCmd      `cmd:"" help:"Container images on nodes: pre-pull with live phases."`
	Volumes     VolumesCmd     `cmd:"" help:"Named microVM volumes on a host: list, delete (kept otherwise across instance deletes)."`
	Token       TokenCmd       `cmd:"" help:"Manage operator tokens."`
	Keys        KeysCmd        `cmd:"" help:"Manage task-signing keys."`
	Audit       AuditCmd       `cmd:"" help:"Read the audit log."`
	Evidence    EvidenceCmd    `cmd:"" help:"Download the evidence bundle (tar.gz) of a correlation id."`
	Preflight   PreflightCmd   `cmd:"" help:"Walk the node and terminal chain hop by hop; name the first failed hop, its signal and owner."`
	Bench       BenchCmd       `cmd:"" help:"Load harnesses."`
	Version     VersionCmd     `cmd:"" help:"Print the version, commit, build date, Go version and platform."`
	Healthcheck HealthcheckCmd `cmd:"" help:"Exit 0 when a control plane's /healthz answers 200 (the container image's HEALTHCHECK)."`
}

// Env is what commands read from and write to.
type Env struct {
	Stdin  io.Reader // answers to confirmation prompts; nil reads nothing
	Stdout io.Writer
	Stderr io.Writer
	// Interactive reports whether Stdin is a terminal a person can answer
	// prompts on; without one, destructive commands need --yes.
	Interactive bool
}

// Main runs the CLI on the process's arguments and streams.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, &Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Interactive: isTerminal(os.Stdin)})
}

// isTerminal reports whether f is a terminal (not merely a character
// device: /dev/null is one, and a script's stdin often is it).
func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// exitRequest is how kong's exit hook (help, version) unwinds Parse: the
// command must not run after its usage was printed.
type exitRequest struct{ code int }

// newParser builds the command tree; exits panic with an exitRequest.
func newParser(root *CLI, env *Env) (*kong.Kong, error) {
	return kong.New(root, kong.Name("drover"),
		kong.Description("Drover: control plane and operator CLI for fleets of bare-metal, GPU and VM hosts."),
		kong.UsageOnError(), kong.Bind(env), devRuntimeVars(), kong.Writers(env.Stdout, env.Stderr),
		kong.Exit(func(code int) { panic(exitRequest{code}) }))
}

// Run runs the CLI with args and returns the exit code. --help (or -h) on
// any command prints its usage and returns 0 without running it.
func Run(ctx context.Context, args []string, env *Env) (code int) {
	var root CLI
	parser, err := newParser(&root, env)
	if err != nil {
		fmt.Fprintln(env.Stderr, err)
		return 2
	}
	defer func() {
		if r := recover(); r != nil {
			ex, ok := r.(exitRequest)
			if !ok {
				panic(r)
			}
			code = ex.code
		}
	}()
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintln(env.Stderr, "drover:", err)
		return 2
	}
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(); err != nil {
		fmt.Fprintln(env.Stderr, "drover:", err)
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			return ec.ExitCode()
		}
		return 1
	}
	return 0
}

// VersionCmd prints the version, commit, build date, Go version and
// platform.
type VersionCmd struct{}

// Run implements the command.
func (VersionCmd) Run(env *Env) error {
	fmt.Fprint(env.Stdout, version.Get().String("drover"))
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }
