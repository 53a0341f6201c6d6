// Package exepages hands back the resident pages of the agent's own
// executable that only start-up needed.
//
// A Go binary runs every package's init, and the agent enrols, probes
// accelerators and reads the host once at start: that touches code and
// read-only data all over the executable, and the kernel maps the page
// cache around each fault (fault-around), so an idle agent kept ≈ 16 MB of
// its binary mapped while its steady state (heartbeats, long-polls, GC)
// uses ≈ 2 MB of it. Trim unmaps the executable's read-only, never-written
// mappings (MADV_DONTNEED): the pages stay in the page cache, shared and
// clean, and a later access maps them again with a minor fault; what
// changes is that unused ones no longer count in the agent's RSS and are no
// longer held as mapped executable pages under memory pressure.
// docs/performance.md, "Agent idle RSS and CPU", has the figures.
//
// It owns only that; when to trim is the caller's choice.
package exepages

import "errors"

// Result says what one Trim did.
type Result struct {
	Mappings int   // read-only mappings of the executable that were unmapped
	Bytes    int64 // their resident bytes just before
	Skipped  int   // executable mappings left alone (writable, shared, or holding private copies)
}

// ErrUnsupported is returned where the platform offers no way to do it
// (everything but Linux).
var ErrUnsupported = errors.New("exepages: not supported on this platform")
