package periodic

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

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
			var out testutil.SyncBuffer
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
	var out testutil.SyncBuffer
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
