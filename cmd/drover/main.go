// Command drover is the Drover control plane and operator CLI.
package main

import (
	"os"

	"github.com/drover-dev/drover/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
