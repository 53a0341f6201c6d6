//go:build !linux

package slicedhcp

import "context"

// Server is not available outside Linux; NewServer refuses to build one.
type Server struct{}

// NewServer fails: the server binds to the slice bridge, which only a
// Linux host has.
func NewServer(Config, *Store) (*Server, error) { return nil, ErrUnsupported }

// Start fails outside Linux.
func (s *Server) Start(context.Context) (<-chan error, error) { return nil, ErrUnsupported }
