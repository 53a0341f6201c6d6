// Package cli is the drover command line: the control plane (`drover
// server`, `drover dev`) and the operator commands that talk to the operator
// API. It holds flag parsing and presentation only; behaviour lives in
// internal/server and internal/agent.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/alecthomas/kong"
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=...".
var Version = "dev"

// CLI is the root command.
type CLI struct {
	Dev         DevCmd         `cmd:"" help:"Run control plane, embedded SQLite and a local agent in one process."`
	Server      ServerCmd      `cmd:"" help:"Run a control plane replica."`
	Hosts       HostsCmd       `cmd:"" help:"Manage host records."`
	Tasks       TasksCmd       `cmd:"" help:"Queue and inspect signed tasks."`
	Instances   InstancesCmd   `cmd:"" help:"Declare, inspect and scale VM instances."`
	Allocations AllocationsCmd `cmd:"" help:"Bind users to hosts or instances; terminal tokens, sessions and recordings."`
	Token       TokenCmd       `cmd:"" help:"Manage operator tokens."`
	Keys        KeysCmd        `cmd:"" help:"Manage task-signing keys."`
	Audit       AuditCmd       `cmd:"" help:"Read the audit log."`
	Bench       BenchCmd       `cmd:"" help:"Load harnesses."`
	Version     VersionCmd     `cmd:"" help:"Print the version."`
}

// Env is what commands write to.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
}

// Main runs the CLI on the process's arguments and streams.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, &Env{Stdout: os.Stdout, Stderr: os.Stderr})
}

// Run runs the CLI with args and returns the exit code.
func Run(ctx context.Context, args []string, env *Env) int {
	var root CLI
	parser, err := kong.New(&root, kong.Name("drover"),
		kong.Description("Drover: control plane and operator CLI for fleets of bare-metal, GPU and VM hosts."),
		kong.UsageOnError(), kong.Bind(env), kong.Writers(env.Stdout, env.Stderr),
		kong.Exit(func(int) {}))
	if err != nil {
		fmt.Fprintln(env.Stderr, err)
		return 2
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintln(env.Stderr, "drover:", err)
		return 2
	}
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(); err != nil {
		fmt.Fprintln(env.Stderr, "drover:", err)
		return 1
	}
	return 0
}

// VersionCmd prints the version.
type VersionCmd struct{}

// Run implements the command.
func (VersionCmd) Run(env *Env) error {
	fmt.Fprintln(env.Stdout, "drover", Version)
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }
