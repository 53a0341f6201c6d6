package runtime

import (
	"context"
	"io"
	"time"
)

// LogReader is the optional port through which the agent reads a
// workload's logs (logs.open, `drover instances logs`). An adapter that
// implements it on its Runtime serves logs; the agent refuses logs.open
// with logs_unsupported for one that does not.
//
// Contract:
//   - id is a runtime instance id; the adapter finds the log from its own
//     state (never from a caller-supplied path). An unknown id is an error
//     wrapping ErrNotFound.
//   - The reader yields records, one per line, each "<stream> <line>\n",
//     where <stream> is "stdout", "stderr" (a container's two streams,
//     demultiplexed) or "serial" (a VM's serial console log), followed by
//     one space and the workload's line with its newline. A line the
//     workload has not ended yet (the end of a log without a final
//     newline) may end the reader without a newline. Lines of any length
//     are allowed; the agent splits long ones for the wire.
//   - Without Follow the reader ends (io.EOF) at the end of the log as it
//     is now. With Follow it keeps returning new lines until ctx ends or
//     Close is called, both of which make a pending Read return promptly
//     (io.EOF or an error).
//   - Since and Tail select past lines: only lines written at or after
//     Since (zero: all), then only the last Tail of those (0: all). An
//     adapter whose log carries no per-line times applies Since as well as
//     it can and documents how (qemu: by the log file's modification time).
//   - Close releases everything (files, connections, goroutines); it may be
//     called more than once and concurrently with Read.
type LogReader interface {
	Logs(ctx context.Context, id string, opts LogOptions) (io.ReadCloser, error)
}

// LogOptions select what Logs returns.
type LogOptions struct {
	// Follow keeps the reader open for new lines.
	Follow bool
	// Since keeps only lines written at or after it; zero means all.
	Since time.Time
	// Tail keeps only the last Tail past lines; 0 means all.
	Tail int
}

// Log stream names used as record prefixes by LogReader.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
	LogSerial = "serial"
)
