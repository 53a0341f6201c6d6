package lognode

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/logstream"
	"github.com/drover-dev/drover/internal/wire/task"
)

func params(id string) task.LogsOpenParams {
	return task.LogsOpenParams{SessionID: "ls_1", InstanceID: id, Nonce: strings.Repeat("a", 64),
		MaxLifetime: api.Duration(time.Minute)}
}

// TestOpenRefusals: an instance the runtime does not run, a runtime
// without logs, and the stream cap are refused before any dial.
func TestOpenRefusals(t *testing.T) {
	m := New(Config{NodeID: "n1", BaseURL: "https://cp.invalid", TLSConfig: func() *tls.Config { return &tls.Config{} },
		MaxStreams: 1, Source: func(_ context.Context, id string, _ runtime.LogOptions) (io.ReadCloser, error) {
			switch id {
			case "other":
				return nil, fmt.Errorf("inspect %s: %w", id, runtime.ErrNotFound)
			case "nologs":
				return nil, fmt.Errorf("runtime x: %w", ErrUnsupported)
			}
			return nil, errors.New("unexpected")
		}})
	defer m.Close()
	for id, code := range map[string]string{"other": CodeInstanceUnknown, "nologs": CodeUnsupported} {
		_, err := m.Open(context.Background(), params(id), "cid")
		var e *Error
		if !errors.As(err, &e) || e.Code != code {
			t.Errorf("%s: %v, want %s", id, err, code)
		}
	}
	if m.Active() != 0 {
		t.Errorf("%d streams held after refusals", m.Active())
	}
}

// TestParamsRefusePaths: logs.open names an instance id, never a path.
func TestParamsRefusePaths(t *testing.T) {
	for _, id := range []string{"../../etc/shadow", "/var/log/syslog", "a/b", ""} {
		p := params(id)
		b, _ := json.Marshal(p)
		if _, fe := task.DecodeLogsOpenParams(b); fe == nil {
			t.Errorf("instance_id %q accepted", id)
		}
	}
}

// TestPump: records become frames by stream, a long line is split, the
// end frame says eof.
func TestPump(t *testing.T) {
	long := strings.Repeat("y", logstream.MaxLine+10)
	in := "stdout hello\nstderr oops\nserial " + long + "\nno prefix\n"
	got := make(chan []logstream.Frame, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(logstream.MaxFrame)
		var fs []logstream.Frame
		for {
			_, msg, err := c.Read(r.Context())
			if err != nil {
				break
			}
			f, err := logstream.Decode(msg)
			if err != nil {
				t.Errorf("decode: %v", err)
				break
			}
			f.Data = append([]byte(nil), f.Data...)
			fs = append(fs, f)
			if f.End != nil {
				break
			}
		}
		got <- fs
		c.Close(websocket.StatusNormalClosure, "")
	}))
	defer srv.Close()
	c, _, err := websocket.Dial(context.Background(), srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, end := copyLog(context.Background(), context.Background(), c, io.NopCloser(strings.NewReader(in)))
	if end.Reason != logstream.ReasonEOF || n != 5 {
		t.Errorf("copy = %d frames, %+v; want 5, eof", n, end)
	}
	fs := <-got
	var b strings.Builder
	for _, f := range fs {
		if f.End != nil {
			fmt.Fprintf(&b, "END %s", f.End.Reason)
			continue
		}
		fmt.Fprintf(&b, "%s:%d|", f.Stream, len(f.Data))
	}
	want := fmt.Sprintf("stdout:6|stderr:5|serial:%d|serial:11|serial:10|END eof", logstream.MaxLine)
	if b.String() != want {
		t.Errorf("frames %s\nwant   %s", b.String(), want)
	}
}
