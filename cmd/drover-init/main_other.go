//go:build !linux

// Command drover-init is Drover's init for microVMs; it runs only in a
// Linux guest.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "drover-init: linux only")
	os.Exit(1)
}
