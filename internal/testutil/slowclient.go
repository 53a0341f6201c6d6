package testutil

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// Trickle writes head on conn at once, then tail one byte every interval,
// and reads until the server closes the connection. It returns how long
// that took (from the first write) and what the server sent. It fails the
// test when the server still holds the connection after within: a server
// that cuts slow clients off must do so before. Write errors (the server
// closed first) end the trickle quietly.
func Trickle(t testing.TB, conn net.Conn, head, tail string, interval, within time.Duration) (time.Duration, []byte) {
	t.Helper()
	defer conn.Close()
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		if _, err := io.WriteString(conn, head); err != nil {
			return
		}
		for i := 0; i < len(tail); i++ {
			select {
			case <-stop:
				return
			case <-time.After(interval):
			}
			if _, err := conn.Write([]byte{tail[i]}); err != nil {
				return
			}
		}
	}()
	if err := conn.SetReadDeadline(start.Add(within)); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	_, err := io.Copy(&got, conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the server still held the connection after %s (it sent %q)", within, got.String())
	}
	// EOF (nil from io.Copy) or a reset: the server closed the connection.
	return time.Since(start), got.Bytes()
}
