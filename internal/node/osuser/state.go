package osuser

// The state file: which users Drover created, for which allocation.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"
)

const stateVersion = 1

// record is one user Drover created.
type record struct {
	AllocationID string `json:"allocation_id"`
	// Pending: written just before useradd ran; the uid is not known yet,
	// and the user is Drover's only if its comment names the allocation.
	Pending   bool      `json:"pending,omitempty"`
	UID       string    `json:"uid,omitempty"`
	Home      string    `json:"home,omitempty"`
	Sudo      bool      `json:"sudo,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

type state struct {
	Version int               `json:"version"`
	Users   map[string]record `json:"users"`
}

func (m *Manager) statePath() string { return filepath.Join(m.opts.StateDir, StateFileName) }

// loadState reads the state file; a missing file is an empty state.
func (m *Manager) loadState() (state, error) {
	st := state{Version: stateVersion, Users: map[string]record{}}
	b, err := os.ReadFile(m.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse state %s: %w", m.statePath(), err)
	}
	if st.Version != stateVersion {
		return st, fmt.Errorf("state %s has version %d, want %d", m.statePath(), st.Version, stateVersion)
	}
	if st.Users == nil {
		st.Users = map[string]record{}
	}
	return st, nil
}

// saveState replaces the state file atomically.
func (m *Manager) saveState(st state) error {
	if err := os.MkdirAll(m.opts.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	return atomicfile.Write(filepath.Join(m.opts.StateDir, StateFileName), append(b, '\n'), 0o600)
}
