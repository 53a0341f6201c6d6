//go:build !linux

package qemu

import (
	"errors"
	"os"
)

// memSeeds is false: without memfd the seeds stay 0600 files in the
// instance's 0700 directory (docs/secrets.md).
const memSeeds = false

var errNoMemSeeds = errors.New("in-memory seeds need Linux (memfd)")

func newMemFile(string) (*os.File, error) { return nil, errNoMemSeeds }

func sealMemFile(*os.File) error { return errNoMemSeeds }

func reopenReadOnly(*os.File) (*os.File, error) { return nil, errNoMemSeeds }

func tmpfsWorkspace() (string, func(), error) { return "", nil, errNoMemSeeds }
