// Command drover is the Drover control plane and operator CLI.
package main

import (
	"os"

	"github.com/drover-dev/drover/internal/cli"
	"github.com/drover-dev/drover/internal/node/accel"
)

func main() {
	accel.MaybeRunChild() // `drover dev` runs an agent whose KVM probe re-executes this binary
	os.Exit(cli.Main(os.Args[1:]))
}
