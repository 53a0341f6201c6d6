package image

import (
	"errors"
	"fmt"
)

// Sentinel errors, always found wrapped inside a *FetchError; branch with
// errors.Is.
var (
	// ErrDigestMismatch: the bytes fetched (or a cached blob) do not hash
	// to the digest asked for.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrPathNotAllowed: a file URL or local path resolves outside every
	// allowed directory.
	ErrPathNotAllowed = errors.New("path not allowed")
	// ErrBadDigest: the digest is not 64 hex characters.
	ErrBadDigest = errors.New("malformed sha256")
	// ErrTooLarge: the source is larger than Options.MaxBytes.
	ErrTooLarge = errors.New("too large")
	// ErrNotCached: Verify was asked about a digest the cache does not hold.
	ErrNotCached = errors.New("not cached")
	// ErrDigestRequired: a plain http source came without a digest; nothing
	// else would authenticate its bytes.
	ErrDigestRequired = errors.New("sha256 digest required")
	// ErrLocalURL: an http(s) source, a redirect or a dial points at a
	// loopback, link-local or unspecified address and
	// Options.AllowLocalURLs is off.
	ErrLocalURL = errors.New("local address refused")
)

// Stages a FetchError names.
const (
	StageURL      = "url"      // the source is not a supported URL or path
	StagePath     = "path"     // a local path does not resolve under an allowed dir
	StageDownload = "download" // reading the source failed (HTTP status, I/O, size, cancellation)
	StageDigest   = "digest"   // the digest is malformed or does not match
	StageStore    = "store"    // writing, renaming or reading the cache failed
)

// FetchError is the error every Cache method returns. Source is the URL
// (credentials redacted) or path that was being fetched or checked.
type FetchError struct {
	Stage  string
	Source string
	Err    error
}

func (e *FetchError) Error() string {
	var m *mismatchError
	if e.Stage == StageDigest && errors.As(e.Err, &m) {
		return fmt.Sprintf("image: digest mismatch for %s: %s", e.Source, m.detail())
	}
	return fmt.Sprintf("image: %s %s: %v", e.Stage, e.Source, e.Err)
}

func (e *FetchError) Unwrap() error { return e.Err }

// mismatchError carries both digests of a mismatch; it is
// ErrDigestMismatch for errors.Is.
type mismatchError struct{ got, want string }

func (m *mismatchError) detail() string { return "got " + m.got + ", want " + m.want }

func (m *mismatchError) Error() string { return ErrDigestMismatch.Error() + ": " + m.detail() }

func (m *mismatchError) Is(target error) bool { return target == ErrDigestMismatch }
