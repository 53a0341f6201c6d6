//go:build !linux

package netsetup

import (
	"context"
	"fmt"
)

// Manager is not available outside Linux; New refuses to build one.
type Manager struct{}

// New fails: taps, bridges and nftables are Linux-only.
func New(Config) (*Manager, error) { return nil, fail("", "setup", ErrUnsupported) }

// Close does nothing.
func (m *Manager) Close() error { return nil }

// Attach fails outside Linux.
func (m *Manager) Attach(_ context.Context, id string, _ []Forward) (Lease, error) {
	return Lease{}, fail(id, "attach", ErrUnsupported)
}

// EnsureNetwork fails outside Linux.
func (m *Manager) EnsureNetwork(context.Context) error {
	return fail("", "ensure network", ErrUnsupported)
}

// Lease finds nothing outside Linux.
func (m *Manager) Lease(string) (Lease, bool, error) { return Lease{}, false, nil }

// Leases is empty outside Linux.
func (m *Manager) Leases() ([]Lease, error) { return nil, nil }

// Release fails outside Linux.
func (m *Manager) Release(_ context.Context, id string) error {
	return fail(id, "release", ErrUnsupported)
}

// Reconcile fails outside Linux.
func (m *Manager) Reconcile(context.Context, []string) (ReconcileReport, error) {
	return ReconcileReport{}, fail("", "reconcile", ErrUnsupported)
}

// RuleTags fails outside Linux.
func (m *Manager) RuleTags() ([]string, error) {
	return nil, fmt.Errorf("rule tags: %w", ErrUnsupported)
}
