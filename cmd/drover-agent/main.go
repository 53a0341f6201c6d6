// Command drover-agent is the Drover node agent.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker"
	"github.com/drover-dev/drover/internal/node/runtime/firecracker"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
	"github.com/drover-dev/drover/internal/wire/version"
)

func main() {
	accel.MaybeRunChild() // the KVM probe re-executes this binary; must come first
	if len(os.Args) > 1 && (os.Args[1] == "version" || os.Args[1] == "-version" || os.Args[1] == "--version") {
		fmt.Print(version.Get().String("drover-agent"))
		return
	}
	// The instance runtimes this binary links in (NODE_AGENT_RUNTIME; none
	// is built in). A new runtime is one package and one entry here.
	runtimes := runtime.Registry{qemu.Name: qemu.Entry(), docker.Name: docker.Entry(), firecracker.Name: firecracker.Entry()}
	// NODE_AGENT_BOOTSTRAP_TOKEN may come from the systemd credential
	// drover-agent-bootstrap-token (LoadCredential=).
	getenv, err := agent.WithCredentials(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent:", err)
		os.Exit(2)
	}
	// Started by the Windows service control manager: run under it (the
	// flags are those `drover-agent service install` recorded).
	if code, ran := agent.RunAsWindowsService(os.Args[1:], getenv, runtimes); ran {
		os.Exit(code)
	}
	if len(os.Args) > 1 && os.Args[1] == "service" {
		// service install|uninstall|start|stop|status (Windows).
		os.Exit(agent.ServiceCommand(os.Args[2:], getenv, runtimes, os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "config" {
		// config show: the effective configuration, each value's source.
		os.Exit(agent.ConfigCommand(os.Args[2:], os.Getenv, runtimes, os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && (os.Args[1] == "preflight" || os.Args[1] == "status") {
		// Subcommands: preflight runs the node-side hops; status asks the
		// running agent. Both read the agent's configuration.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		cmd := agent.PreflightCommand
		if os.Args[1] == "status" {
			cmd = agent.StatusCommand
		}
		code := cmd(ctx, os.Args[2:], getenv, runtimes, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	cfg, err := agent.LoadConfig(os.Args[1:], getenv, runtimes)
	var help *agent.HelpError
	if errors.As(err, &help) {
		fmt.Print(help.Usage)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent: configuration:", err)
		os.Exit(2)
	}
	log, err := agent.NewLogger(os.Stderr, getenv) // DROVER_LOG_FORMAT=json for journald
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent: configuration:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := agent.New(cfg, agent.WithLogger(log), agent.WithMemoryRelease(agent.ReleaseMemory))
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent:", err)
		os.Exit(1)
	}
	if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}
