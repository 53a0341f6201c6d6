package cli

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
)

// Yes is the flag irreversible commands take to run without asking.
type Yes struct {
	Yes bool `name:"yes" short:"y" help:"Do not ask for confirmation (needed when stdin is not a terminal)."`
}

// errNotConfirmed is returned when the person at the terminal did not type
// the confirmation answer.
var errNotConfirmed = errors.New("not confirmed; nothing was changed")

// confirm asks before an irreversible action: the person at the terminal
// must type answer back. --yes skips the question; without a terminal (a
// script, CI) the command refuses rather than guess.
func (y Yes) confirm(env *Env, action, answer string) error {
	if y.Yes {
		return nil
	}
	if !env.Interactive || env.Stdin == nil {
		return fmt.Errorf("%s cannot be undone: pass --yes to confirm (stdin is not a terminal, so nobody can be asked)", action)
	}
	fmt.Fprintf(env.Stderr, "%s cannot be undone. Type %q to confirm: ", action, answer)
	line, err := bufio.NewReader(env.Stdin).ReadString('\n')
	if strings.TrimSpace(line) != answer {
		if err != nil && line == "" {
			return fmt.Errorf("%w (%v)", errNotConfirmed, err)
		}
		return errNotConfirmed
	}
	return nil
}
