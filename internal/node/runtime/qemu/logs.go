package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/logfile"
)

var _ runtime.LogReader = (*Runtime)(nil)

// Logs reads the instance's serial console log (serial.log in its own
// directory, never a path from the caller), every line as a "serial"
// record. The serial log has no per-line times: Since is applied by the
// file's modification time (see logfile), and Tail counts lines. Follow
// polls the file and starts over when a restart rotates it.
func (r *Runtime) Logs(ctx context.Context, id string, opts runtime.LogOptions) (io.ReadCloser, error) {
	in := r.get(id)
	if in == nil {
		return nil, notFound("logs", id)
	}
	path := in.path(serialLogName)
	rc, err := logfile.Open(ctx, path, logfile.Options{LogOptions: opts, Prefix: runtime.LogSerial})
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(path); errors.Is(serr, fs.ErrNotExist) && !opts.Follow {
			// Never started: an empty log.
			return io.NopCloser(strings.NewReader("")), nil
		}
		return nil, fmt.Errorf("logs %s: the instance has no serial log yet (it was never started): %w", id, err)
	}
	return rc, err
}
