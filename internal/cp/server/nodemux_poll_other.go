//go:build !linux

package server

import (
	"errors"
	"syscall"
)

// muxPoller is epoll's (nodemux_poll_linux.go): elsewhere each framed
// connection has a reader goroutine of its own.
type muxPoller struct{}

func newMuxPoller() (*muxPoller, error)                { return nil, errors.ErrUnsupported }
func (*muxPoller) add(*muxConn, syscall.RawConn) error { return errors.ErrUnsupported }
func (*muxPoller) arm(*muxConn) error                  { return errors.ErrUnsupported }
func (*muxPoller) remove(*muxConn)                     {}
func (*muxPoller) close()                              {}

// pollReg is a connection's registration with the poller (none here).
type pollReg struct{}
