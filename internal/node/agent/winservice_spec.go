package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// serviceSpec is what `service install` creates.
type serviceSpec struct {
	Name, DisplayName, Description string
	Exe                            string   // absolute path of this binary
	Args                           []string // the agent flags the service runs with
	AutoStart, DelayedAutoStart    bool
	Restarts                       []time.Duration // recovery: restart after each delay, in order
	ResetAfter                     time.Duration   // the failure count resets after this long without one
}

// newServiceSpec is the drover-agent service: automatic (delayed) start,
// restarted 5s, 30s then 60s after a failure, the count reset after a day.
func newServiceSpec(exe string, args []string) serviceSpec {
	return serviceSpec{Name: ServiceName, DisplayName: serviceDisplayName, Description: serviceDescription,
		Exe: exe, Args: args, AutoStart: true, DelayedAutoStart: true,
		Restarts:   []time.Duration{5 * time.Second, 30 * time.Second, 60 * time.Second},
		ResetAfter: 24 * time.Hour}
}

// absoluteServicePaths refuses relative paths among the agent's path
// flags: the SCM starts the service in %SystemRoot%\System32.
func absoluteServicePaths(args []string) error {
	fs := flag.NewFlagSet("drover-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	names := []string{"config", "env-file", "state-dir", "runtime-dir", "secrets-dir", "ca-file", "image-dirs"}
	for _, n := range names {
		fs.String(n, "", "")
	}
	own, _ := splitArgs(fs, args)
	if err := fs.Parse(own); err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		for _, p := range strings.Split(f.Value.String(), ",") {
			if p != "" && !windowsAbs(p) {
				errs = append(errs, fmt.Errorf("-%s %q: give an absolute path (the service runs in %%SystemRoot%%\\System32)", f.Name, p))
			}
		}
	})
	return errors.Join(errs...)
}

// windowsAbs reports whether p is an absolute Windows path: C:\x, C:/x or
// \\server\share.
func windowsAbs(p string) bool {
	if strings.HasPrefix(p, `\\`) {
		return true
	}
	return len(p) >= 3 && p[1] == ':' && (p[2] == '\\' || p[2] == '/') &&
		('a' <= p[0]|0x20 && p[0]|0x20 <= 'z')
}
