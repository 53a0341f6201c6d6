//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package termnode

import (
	"runtime"

	"github.com/drover-dev/drover/internal/wire/terminal"

	"github.com/drover-dev/drover/internal/wire/api"
)

// startPTY fails: this OS has no PTY and setuid process start that the
// agent supports.
func startPTY(username string, _ terminal.Size, _ string) (console, error) {
	return nil, &Error{api.CodedError{Code: CodePTYFailed, Message: "a shell for " + username + ": terminal PTYs are not supported on " + runtime.GOOS}}
}
