// Command drover-agent is the Drover node agent.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
)

func main() {
	accel.MaybeRunChild() // the KVM probe re-executes this binary; must come first
	if len(os.Args) > 1 && (os.Args[1] == "version" || os.Args[1] == "-version" || os.Args[1] == "--version") {
		fmt.Println("drover-agent", agent.Version)
		return
	}
	// The instance runtimes this binary links in (NODE_AGENT_RUNTIME; none
	// is built in). A new runtime is one package and one entry here.
	runtimes := runtime.Registry{qemu.Name: qemu.Entry()}
	if len(os.Args) > 1 && (os.Args[1] == "preflight" || os.Args[1] == "status") {
		// Subcommands: preflight runs the node-side hops; status asks the
		// running agent. Both read the agent's configuration.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		cmd := agent.PreflightCommand
		if os.Args[1] == "status" {
			cmd = agent.StatusCommand
		}
		code := cmd(ctx, os.Args[2:], os.Getenv, runtimes, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	cfg, err := agent.LoadConfig(os.Args[1:], os.Getenv, runtimes)
	var help *agent.HelpError
	if errors.As(err, &help) {
		fmt.Print(help.Usage)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent: configuration:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := agent.New(cfg, agent.WithLogger(log))
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent:", err)
		os.Exit(1)
	}
	if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}
