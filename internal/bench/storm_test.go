package bench

import (
	"context"
	"strings"
	"testing"
)

func TestStormNeedsServerProcess(t *testing.T) {
	_, err := Run(context.Background(), Config{Agents: 1, ReconnectStorm: true})
	if err == nil || !strings.Contains(err.Error(), "--server-process") {
		t.Fatalf("Run with ReconnectStorm in process: %v, want an error naming --server-process", err)
	}
}
