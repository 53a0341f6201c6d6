// Command printversion prints version.Get for TestLinkerOverride.
package main

import (
	"fmt"

	"github.com/drover-dev/drover/internal/wire/version"
)

func main() { fmt.Print(version.Get().String("x")) }
