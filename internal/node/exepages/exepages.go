// Package exepages hands back the resident pages of the agent's own
// executable that its steady state does not use.
//
// A Go binary runs every package's init, and the agent enrols, probes
// accelerators and reads the host once at start: that touches code and
// read-only data all over the executable. The kernel maps the page cache
// around each fault (fault-around, 64 KB) and reads ahead around each
// miss, so an idle agent kept ≈ 16 MB of its binary mapped at start, and
// ≈ 9 MB within seconds of unmapping it, where its steady state
// (heartbeats, long-polls, GC) touches ≈ 5 MB page by page. Trim unmaps
// the executable's read-only, never-written mappings (MADV_DONTNEED),
// turns off read-around for them (MADV_RANDOM) and drops the unmapped
// pages from the page cache (POSIX_FADV_DONTNEED): later faults bring back
// only the pages used. That lowers both the agent's RSS and the page cache
// charged to its cgroup; the price is a disk read per page a later fault
// needs. docs/performance.md, "Agent idle RSS and CPU", has the figures.
//
// It owns only that; when to trim is the caller's choice.
package exepages

import "errors"

// Result says what one Trim did.
type Result struct {
	Mappings int   // read-only mappings of the executable that were unmapped
	Bytes    int64 // their resident bytes just before
	Skipped  int   // executable mappings left alone (writable, shared, or holding private copies)
	Evicted  bool  // the executable's unmapped pages were dropped from the page cache
}

// ErrUnsupported is returned where the platform offers no way to do it
// (everything but Linux).
var ErrUnsupported = errors.New("exepages: not supported on this platform")
