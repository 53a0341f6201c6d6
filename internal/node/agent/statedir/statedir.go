// Package statedir owns the node agent's on-disk state: the node id, the
// enrolled identity (key, certificate, CA bundle, JWKS and control-plane
// metadata), and the task records that serve as replay cache and result
// spool.
//
// Every write is crash-safe (temporary file, fsync, rename, fsync of the
// directory), files are 0600 and directories 0700. Task ids come from the
// network and are validated before they name a file. The package does no
// network I/O, no logging and no cryptography beyond generating a random
// node id; it stores key material but never parses or uses it.
package statedir

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"

	"github.com/drover-dev/drover/internal/wire/api"
)

// File and directory modes of everything this package writes.
const (
	FileMode fs.FileMode = 0o600
	DirMode  fs.FileMode = 0o700
)

const (
	nodeIDFile   = "node_id"
	identityFile = "identity.json"
	tasksDir     = "tasks"
	tmpSuffix    = atomicfile.TempSuffix
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrSeen: Begin found a record for the task id.
	ErrSeen = errors.New("statedir: task already seen")
	// ErrNotFound: no record exists for the task id.
	ErrNotFound = errors.New("statedir: task record not found")
	// ErrInvalidID: a task or node id is unsafe to use as a file name.
	ErrInvalidID = errors.New("statedir: invalid id")
	// ErrInsecure: the state directory is writable by group or others.
	ErrInsecure = errors.New("statedir: insecure permissions")
)

// Dir is an opened state directory. Its methods are safe for concurrent use
// within one process; one agent process owns a directory at a time.
type Dir struct {
	path string
	mu   sync.Mutex
}

// Open opens the state directory at path, creating it (and tasks/) with
// mode 0700 when missing. It refuses a directory that is group- or
// world-writable on unix, and removes temporary files a crash left behind.
func Open(path string) (*Dir, error) {
	if path == "" {
		return nil, errors.New("statedir: empty path")
	}
	path = filepath.Clean(path)
	if err := ensureDir(path); err != nil {
		return nil, err
	}
	d := &Dir{path: path}
	if err := ensureDir(d.tasksPath()); err != nil {
		return nil, err
	}
	for _, dir := range []string{path, d.tasksPath()} {
		if err := removeTemps(dir); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

func (d *Dir) tasksPath() string { return filepath.Join(d.path, tasksDir) }

func ensureDir(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(path, DirMode); err != nil {
			return fmt.Errorf("statedir: create %s: %w", path, err)
		}
		// MkdirAll's mode is filtered by the umask; make it exact.
		if err := os.Chmod(path, DirMode); err != nil {
			return fmt.Errorf("statedir: chmod %s: %w", path, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("statedir: stat %s: %w", path, err)
	case !fi.IsDir():
		return fmt.Errorf("statedir: %s is not a directory", path)
	}
	return checkDirPerm(path, fi)
}

// removeTemps deletes leftovers of interrupted atomic writes.
func removeTemps(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("statedir: list %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), tmpSuffix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("statedir: remove leftover %s: %w", e.Name(), err)
			}
		}
	}
	return nil
}

// writeAtomic replaces dir/name with data so that a crash leaves either the
// old or the new content: write a temporary file, fsync it, rename it over
// name, fsync the directory.
func writeAtomic(dir, name string, data []byte) error {
	if err := atomicfile.Write(filepath.Join(dir, name), data, FileMode); err != nil {
		return fmt.Errorf("statedir: %w", err)
	}
	return nil
}

// readFile reads dir/name; ok is false when it does not exist.
func readFile(dir, name string) (b []byte, ok bool, err error) {
	b, err = os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("statedir: read %s: %w", name, err)
	}
	return b, true, nil
}

// NodeID returns the node id. A non-empty configured id wins: it is
// persisted (replacing any different persisted id) and returned. Otherwise
// the persisted id is returned, or a new one ("node-" + 12 lowercase hex)
// is generated and persisted.
func (d *Dir) NodeID(configured string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if configured != "" {
		if !ValidNodeID(configured) {
			return "", fmt.Errorf("statedir: node id %q: %w", configured, ErrInvalidID)
		}
		b, ok, err := readFile(d.path, nodeIDFile)
		if err != nil {
			return "", err
		}
		if !ok || strings.TrimSpace(string(b)) != configured {
			if err := writeAtomic(d.path, nodeIDFile, []byte(configured+"\n")); err != nil {
				return "", err
			}
		}
		return configured, nil
	}
	b, ok, err := readFile(d.path, nodeIDFile)
	if err != nil {
		return "", err
	}
	if ok {
		id := strings.TrimSpace(string(b))
		if !ValidNodeID(id) {
			return "", fmt.Errorf("statedir: persisted node id %q is corrupt: %w", id, ErrInvalidID)
		}
		return id, nil
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", fmt.Errorf("statedir: generate node id: %w", err)
	}
	id := "node-" + hex.EncodeToString(r[:])
	if err := writeAtomic(d.path, nodeIDFile, []byte(id+"\n")); err != nil {
		return "", err
	}
	return id, nil
}

// Identity is what the agent keeps after enrolment or renewal.
type Identity struct {
	NodeID            string
	KeyPEM            []byte
	CertPEM           []byte
	CAPEM             []byte
	NotAfter          time.Time
	JWKS              api.JWKS
	ControlPlaneURL   string
	HeartbeatInterval time.Duration
	TerminalURL       string
}

// identityV1 is the on-disk form: one JSON document, so that key,
// certificate and CA bundle are always replaced together.
type identityV1 struct {
	Version           int          `json:"version"`
	NodeID            string       `json:"node_id"`
	KeyPEM            string       `json:"key_pem"`
	CertPEM           string       `json:"cert_pem"`
	CAPEM             string       `json:"ca_pem"`
	NotAfter          time.Time    `json:"not_after"`
	JWKS              api.JWKS     `json:"jwks"`
	ControlPlaneURL   string       `json:"control_plane_url"`
	HeartbeatInterval api.Duration `json:"heartbeat_interval"`
	TerminalURL       string       `json:"terminal_url,omitempty"`
}

// LoadIdentity returns the saved identity; ok is false when there is none.
func (d *Dir) LoadIdentity() (Identity, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok, err := readFile(d.path, identityFile)
	if err != nil || !ok {
		return Identity{}, false, err
	}
	var v identityV1
	if err := json.Unmarshal(b, &v); err != nil {
		return Identity{}, false, fmt.Errorf("statedir: decode %s: %w", identityFile, err)
	}
	if v.Version != 1 {
		return Identity{}, false, fmt.Errorf("statedir: %s has unsupported version %d", identityFile, v.Version)
	}
	return Identity{
		NodeID:            v.NodeID,
		KeyPEM:            []byte(v.KeyPEM),
		CertPEM:           []byte(v.CertPEM),
		CAPEM:             []byte(v.CAPEM),
		NotAfter:          v.NotAfter,
		JWKS:              v.JWKS,
		ControlPlaneURL:   v.ControlPlaneURL,
		HeartbeatInterval: time.Duration(v.HeartbeatInterval),
		TerminalURL:       v.TerminalURL,
	}, true, nil
}

// SaveIdentity atomically replaces the saved identity. NodeID, KeyPEM and
// CertPEM are required.
func (d *Dir) SaveIdentity(id Identity) error {
	switch {
	case id.NodeID == "":
		return errors.New("statedir: identity without node id")
	case len(id.KeyPEM) == 0:
		return errors.New("statedir: identity without key")
	case len(id.CertPEM) == 0:
		return errors.New("statedir: identity without certificate")
	}
	b, err := json.MarshalIndent(identityV1{
		Version:           1,
		NodeID:            id.NodeID,
		KeyPEM:            string(id.KeyPEM),
		CertPEM:           string(id.CertPEM),
		CAPEM:             string(id.CAPEM),
		NotAfter:          id.NotAfter,
		JWKS:              id.JWKS,
		ControlPlaneURL:   id.ControlPlaneURL,
		HeartbeatInterval: api.Duration(id.HeartbeatInterval),
		TerminalURL:       id.TerminalURL,
	}, "", "  ")
	if err != nil {
		return fmt.Errorf("statedir: encode identity: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return writeAtomic(d.path, identityFile, b)
}
