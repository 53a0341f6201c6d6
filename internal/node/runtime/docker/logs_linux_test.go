package docker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// runLogged creates and starts a busybox instance running script, and
// returns its start time.
func runLogged(t *testing.T, r *rig, rt *Runtime, id, script string) time.Time {
	t.Helper()
	ctx := testCtx(t)
	destroyAtEnd(t, rt, id)
	if _, err := rt.Create(ctx, r.busyboxSpec(id, script)); err != nil {
		t.Fatal(err)
	}
	st, err := rt.Start(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return st.StartedAt
}

// waitExited polls until id's container is not running.
func waitExited(t *testing.T, rt *Runtime, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st, err := rt.Inspect(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != runtime.StateRunning {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s still runs", id)
}

// readLog reads a whole (not followed) log as records.
func readLog(t *testing.T, rt *Runtime, id string, o runtime.LogOptions) []string {
	t.Helper()
	rc, err := rt.Logs(testCtx(t), id, o)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return strings.SplitAfter(string(b), "\n")[:strings.Count(string(b), "\n")]
}

// TestLogsReal: the whole log with both streams labelled, Tail, Since and
// both, a final line without its newline, unknown and foreign ids.
func TestLogsReal(t *testing.T) {
	r := env(t)
	rt := r.newRuntime(t, t.TempDir())
	start := runLogged(t, r, rt, "logged", "echo out1; echo err1 >&2; sleep 1.5; echo out2; sleep 0.2; echo err2 >&2; sleep 0.2; printf tail")
	waitExited(t, rt, "logged")

	all := readLog(t, rt, "logged", runtime.LogOptions{})
	if len(all) != 5 || !slices.Contains(all[:2], "stdout out1\n") || !slices.Contains(all[:2], "stderr err1\n") ||
		!slices.Equal(all[2:], []string{"stdout out2\n", "stderr err2\n", "stdout tail\n"}) {
		t.Errorf("whole log %q", all)
	}
	if got := readLog(t, rt, "logged", runtime.LogOptions{Tail: 2}); !slices.Equal(got, []string{"stderr err2\n", "stdout tail\n"}) {
		t.Errorf("tail 2: %q", got)
	}
	since := start.Add(750 * time.Millisecond)
	if got := readLog(t, rt, "logged", runtime.LogOptions{Since: since}); !slices.Equal(got, all[2:]) {
		t.Errorf("since: %q", got)
	}
	// Since, then the last Tail of those (the engine alone would take the
	// last Tail of the whole log first).
	if got := readLog(t, rt, "logged", runtime.LogOptions{Since: since, Tail: 2}); !slices.Equal(got, all[3:]) {
		t.Errorf("since and tail 2: %q", got)
	}
	if got := readLog(t, rt, "logged", runtime.LogOptions{Since: since, Tail: 4}); !slices.Equal(got, all[2:]) {
		t.Errorf("since and tail 4: %q", got)
	}
	if got := readLog(t, rt, "logged", runtime.LogOptions{Since: time.Now().Add(time.Minute), Tail: 4}); len(got) != 0 {
		t.Errorf("since the future: %q", got)
	}

	ctx := testCtx(t)
	if _, err := rt.Logs(ctx, "nosuch", runtime.LogOptions{}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	// A container named like an instance's but not made by the adapter.
	if _, err := rt.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: containerName("foreign"),
		Config: &container.Config{Image: r.bb.Ref, Cmd: []string{"true"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.cli.ContainerRemove(context.Background(), containerName("foreign"), client.ContainerRemoveOptions{Force: true})
	})
	if _, err := rt.Logs(ctx, "foreign", runtime.LogOptions{}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("foreign container: %v", err)
	}
	if _, err := rt.Logs(ctx, "../etc", runtime.LogOptions{}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("invalid id: %v", err)
	}
}

// TestLogsFollow: a follower receives a line written later (also with
// Since and Tail together); Close ends it promptly, more than once and
// concurrently with a pending Read.
func TestLogsFollow(t *testing.T) {
	r := env(t)
	rt := r.newRuntime(t, t.TempDir())
	start := runLogged(t, r, rt, "follow", "echo early; sleep 1; echo first; echo more; sleep 2; echo later >&2; sleep 60")
	time.Sleep(1500 * time.Millisecond) // "first" and "more" are written

	// Both followers open before "later" is written.
	type follower struct {
		name     string
		o        runtime.LogOptions
		rc       io.ReadCloser
		lines    chan string
		readDone chan error
	}
	fs := []*follower{{name: "plain", o: runtime.LogOptions{Follow: true}},
		{name: "since+tail", o: runtime.LogOptions{Follow: true, Since: start.Add(500 * time.Millisecond), Tail: 1}}}
	for _, f := range fs {
		rc, err := rt.Logs(testCtx(t), "follow", f.o)
		if err != nil {
			t.Fatal(err)
		}
		f.rc, f.lines, f.readDone = rc, make(chan string, 16), make(chan error, 1)
		go func() {
			br := bufio.NewReader(rc)
			for {
				l, err := br.ReadString('\n')
				if err != nil {
					f.readDone <- err
					return
				}
				f.lines <- l
			}
		}()
	}
	for _, f := range fs {
		want := []string{"stdout early\n", "stdout first\n", "stdout more\n", "stderr later\n"}
		if f.o.Tail > 0 {
			want = want[2:]
		}
		for _, w := range want {
			select {
			case l := <-f.lines:
				if l != w {
					t.Fatalf("%s: followed %q, want %q", f.name, l, w)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no %q while following", f.name, w)
			}
		}
		t0 := time.Now()
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { f.rc.Close() })
		}
		wg.Wait()
		select {
		case <-f.readDone:
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: Read still pending after Close", f.name)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("%s: Close took %s", f.name, d)
		}
		f.rc.Close()
	}

	// The caller's context ending ends a follow as well.
	ctx, cancel := context.WithCancel(context.Background())
	rc, err := rt.Logs(ctx, "follow", runtime.LogOptions{Follow: true, Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(rc); done <- err }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("follow still reading after its context ended")
	}
}
