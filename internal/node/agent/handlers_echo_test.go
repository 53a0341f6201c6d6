package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/task"
)

func TestEchoHandler(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))
	h := EchoHandler("node-e", func() time.Time { return at })
	if h.Timeout != task.EchoTimeout {
		t.Fatalf("timeout = %s, want %s", h.Timeout, task.EchoTimeout)
	}
	tests := []struct {
		name     string
		params   string
		want     string
		wantCode string
	}{
		{"message", `{"message":"hello"}`, "hello", ""},
		{"unicode", `{"message":"grüße ✓"}`, "grüße ✓", ""},
		{"no params", ``, "", ""},
		{"1 KiB", `{"message":"` + strings.Repeat("a", task.MaxEchoMessage) + `"}`, strings.Repeat("a", task.MaxEchoMessage), ""},
		{"too long", `{"message":"` + strings.Repeat("a", task.MaxEchoMessage+1) + `"}`, "", "invalid_params"},
		{"unknown param", `{"message":"x","extra":1}`, "", "invalid_params"},
		{"not a string", `{"message":5}`, "", "invalid_params"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := h.Run(context.Background(), Task{Type: task.TypeEcho, Params: json.RawMessage(tc.params)})
			if tc.wantCode != "" {
				var he *HandlerError
				if !errors.As(err, &he) || he.Code != tc.wantCode {
					t.Fatalf("err = %v, want code %s", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := task.EchoOutput{Message: tc.want, NodeID: "node-e", RanAt: at.UTC()}
			if got, ok := out.Output.(task.EchoOutput); !ok || got != want {
				t.Fatalf("output = %#v, want %#v", out.Output, want)
			}
		})
	}
}

func TestDefaultHandlersRunEcho(t *testing.T) {
	h, ok := DefaultHandlers(Config{HostID: "node-d", StateDir: t.TempDir()})[task.TypeEcho]
	if !ok {
		t.Fatal("DefaultHandlers has no diag.echo")
	}
	out, err := h.Run(context.Background(), Task{Type: task.TypeEcho, Params: json.RawMessage(`{"message":"hi"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Output.(task.EchoOutput); got.Message != "hi" || got.NodeID != "node-d" || got.RanAt.IsZero() {
		t.Fatalf("output = %#v", got)
	}
}
