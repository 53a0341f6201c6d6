package mock

import (
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/runtimetest"
)

func TestConformance(t *testing.T) {
	var mu sync.Mutex
	byTest := map[*testing.T]*Runtime{}
	newRT := func(t *testing.T) runtime.Runtime {
		m := New(Options{})
		mu.Lock()
		byTest[t] = m
		mu.Unlock()
		return m
	}
	reopen := func(t *testing.T) runtime.Runtime {
		mu.Lock()
		defer mu.Unlock()
		m, ok := byTest[t]
		if !ok {
			t.Fatal("Reopen before newRT")
		}
		return m.Reopen()
	}
	runtimetest.Run(t, newRT, func(t *testing.T, id string) runtime.Spec { return spec(id) },
		runtimetest.Options{ReadyTimeout: 2 * time.Second, Graceful: time.Second, Reopen: reopen})
}
