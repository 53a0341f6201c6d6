package periodic

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log sink the loop's goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		wantLog string // "" when nothing is logged
	}{
		{name: "success logs nothing"},
		{name: "failure is logged and the loop goes on", err: errors.New("store down"), wantLog: `msg="sweep things" err="store down"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out syncBuffer
			log := slog.New(slog.NewTextHandler(&out, nil))
			ctx, cancel := context.WithCancel(t.Context())
			calls := make(chan struct{}, 10)
			done := make(chan struct{})
			go func() {
				defer close(done)
				Run(ctx, time.Millisecond, log, "sweep things", func(context.Context) error {
					calls <- struct{}{}
					return tc.err
				})
			}()
			for range 3 { // a failure does not stop it
				select {
				case <-calls:
				case <-time.After(5 * time.Second):
					t.Fatal("fn was not called again")
				}
			}
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return when its context ended")
			}
			got := out.String()
			if tc.wantLog == "" && got != "" || tc.wantLog != "" && !strings.Contains(got, tc.wantLog) {
				t.Errorf("log %q, want %q", got, tc.wantLog)
			}
		})
	}
}

// TestRunQuietAfterCancel: an error of a call that its context's end cut
// short is not logged.
func TestRunQuietAfterCancel(t *testing.T) {
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	ctx, cancel := context.WithCancel(t.Context())
	Run(ctx, time.Millisecond, log, "sweep things", func(ctx context.Context) error {
		cancel()
		return ctx.Err()
	})
	if got := out.String(); got != "" {
		t.Errorf("logged %q after the context ended", got)
	}
}
