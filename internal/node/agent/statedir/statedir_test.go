package statedir

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func openT(t *testing.T, path string) *Dir {
	t.Helper()
	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return d
}

func result(msg string) api.TaskResult {
	return api.TaskResult{
		Status:     api.ResultSucceeded,
		Output:     json.RawMessage(`{"msg":"` + msg + `"}`),
		Timings:    map[string]int64{"timings.kernel_ms": 3},
		FinishedAt: t0.Add(time.Minute),
	}
}

func TestOpenCreatesNestedDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "state")
	d := openT(t, path)
	if d.Path() != path {
		t.Errorf("Path() = %q", d.Path())
	}
	for _, p := range []string{path, filepath.Join(path, "tasks")} {
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", p, err)
		}
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(file); err == nil {
		t.Error("Open of a regular file succeeded")
	}
	if _, err := Open(""); err == nil {
		t.Error("Open(\"\") succeeded")
	}
}

func TestNodeID(t *testing.T) {
	generated := regexp.MustCompile(`^node-[0-9a-f]{12}$`)
	path := t.TempDir()
	d := openT(t, path)

	id1, err := d.NodeID("")
	if err != nil || !generated.MatchString(id1) {
		t.Fatalf("generated id %q, %v", id1, err)
	}
	if id2, err := openT(t, path).NodeID(""); err != nil || id2 != id1 {
		t.Fatalf("after reopen id = %q, %v; want %q", id2, err, id1)
	}
	other, _ := openT(t, t.TempDir()).NodeID("")
	if other == id1 {
		t.Errorf("two state dirs generated the same id %q", other)
	}

	steps := []struct {
		configured, want string
		wantErr          error
	}{
		{"gpu-host-01.example", "gpu-host-01.example", nil},
		{"", "gpu-host-01.example", nil}, // the configured id was persisted
		{"gpu-host-02", "gpu-host-02", nil},
		{"../evil", "", ErrInvalidID},
		{"has space", "", ErrInvalidID},
		{"", "gpu-host-02", nil},
	}
	for _, s := range steps {
		got, err := d.NodeID(s.configured)
		if !errors.Is(err, s.wantErr) || got != s.want {
			t.Errorf("NodeID(%q) = %q, %v; want %q, %v", s.configured, got, err, s.want, s.wantErr)
		}
	}

	if err := os.WriteFile(filepath.Join(path, "node_id"), []byte("bad/id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeID(""); !errors.Is(err, ErrInvalidID) {
		t.Errorf("corrupt node_id: err = %v, want ErrInvalidID", err)
	}
}

func testIdentity(n int) Identity {
	s := strings.Repeat("x", n)
	return Identity{
		NodeID:            "node-0123456789ab",
		KeyPEM:            []byte("-----BEGIN EC PRIVATE KEY-----\n" + s + "\n-----END EC PRIVATE KEY-----\n"),
		CertPEM:           []byte("-----BEGIN CERTIFICATE-----\ncert" + s + "\n-----END CERTIFICATE-----\n"),
		CAPEM:             []byte("-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"),
		NotAfter:          t0.Add(24 * time.Hour),
		JWKS:              api.JWKS{Keys: []api.JWK{{Kty: "OKP", Crv: "Ed25519", X: "abc", Kid: "k1", Alg: "EdDSA"}}},
		ControlPlaneURL:   "https://cp.example:8443",
		HeartbeatInterval: 15 * time.Second,
		TerminalURL:       "wss://cp.example/terminal",
	}
}

func TestIdentity(t *testing.T) {
	path := t.TempDir()
	d := openT(t, path)
	if _, ok, err := d.LoadIdentity(); ok || err != nil {
		t.Fatalf("empty dir: ok=%v err=%v", ok, err)
	}
	want := testIdentity(1)
	if err := d.SaveIdentity(want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := openT(t, path).LoadIdentity()
	if err != nil || !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("LoadIdentity = %+v, %v, %v\nwant %+v", got, ok, err, want)
	}

	// Renewal replaces everything at once.
	renewed := testIdentity(2)
	renewed.NotAfter = t0.Add(48 * time.Hour)
	if err := d.SaveIdentity(renewed); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := d.LoadIdentity(); !reflect.DeepEqual(got, renewed) {
		t.Errorf("after renewal got %+v", got)
	}

	bad := []struct {
		name string
		mut  func(*Identity)
	}{
		{"no node id", func(i *Identity) { i.NodeID = "" }},
		{"no key", func(i *Identity) { i.KeyPEM = nil }},
		{"no cert", func(i *Identity) { i.CertPEM = nil }},
	}
	for _, b := range bad {
		id := testIdentity(3)
		b.mut(&id)
		if err := d.SaveIdentity(id); err == nil {
			t.Errorf("%s: SaveIdentity succeeded", b.name)
		}
	}
	if got, _, _ := d.LoadIdentity(); !reflect.DeepEqual(got, renewed) {
		t.Errorf("a rejected save changed the identity: %+v", got)
	}

	if err := os.WriteFile(filepath.Join(path, "identity.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.LoadIdentity(); err == nil {
		t.Error("corrupt identity.json loaded without error")
	}
}

// TestCrashLeftovers simulates a crash in the middle of atomic writes: the
// temporary files hold half-written new content and must never be read.
func TestCrashLeftovers(t *testing.T) {
	path := t.TempDir()
	d := openT(t, path)
	old := testIdentity(1)
	if err := d.SaveIdentity(old); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Begin("task-1", "", t0.Add(time.Hour), t0); err != nil {
		t.Fatal(err)
	}
	if err := d.SaveResult("task-1", result("one")); err != nil {
		t.Fatal(err)
	}
	leftovers := []string{
		filepath.Join(path, "identity.json.123456.tmp"),
		filepath.Join(path, "node_id.99.tmp"),
		filepath.Join(path, "tasks", "task-1.json.777.tmp"),
		filepath.Join(path, "tasks", "task-2.json.778.tmp"),
	}
	for _, l := range leftovers {
		if err := os.WriteFile(l, []byte(`{"version":1,"node_id":"half`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Before any reopen, readers ignore the leftovers.
	if p, err := d.Pending(); err != nil || len(p) != 1 || p[0].TaskID != "task-1" {
		t.Fatalf("Pending with leftovers = %+v, %v", p, err)
	}
	// A restart cleans them up and sees only the last complete state.
	d2 := openT(t, path)
	for _, l := range leftovers {
		if _, err := os.Stat(l); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("leftover %s not removed: %v", l, err)
		}
	}
	if got, ok, err := d2.LoadIdentity(); err != nil || !ok || !reflect.DeepEqual(got, old) {
		t.Errorf("identity after crash = %+v, %v, %v", got, ok, err)
	}
	if _, err := d2.Begin("task-2", "", t0.Add(time.Hour), t0); err != nil {
		t.Errorf("task-2 only had a temp file but Begin said %v", err)
	}
}

func TestTaskLifecycleAcrossRestart(t *testing.T) {
	path := t.TempDir()
	d := openT(t, path)
	exp := t0.Add(10 * time.Minute)
	rec, err := d.Begin("01JTASK", "", exp, t0)
	if err != nil || rec.TaskID != "01JTASK" || !rec.ExpiresAt.Equal(exp) || !rec.StartedAt.Equal(t0) || rec.Result != nil {
		t.Fatalf("Begin = %+v, %v", rec, err)
	}
	rec, err = d.Begin("01JTASK", "", exp.Add(time.Hour), t0.Add(time.Second))
	if !errors.Is(err, ErrSeen) || rec.TaskID != "01JTASK" || !rec.StartedAt.Equal(t0) {
		t.Fatalf("second Begin = %+v, %v; want the first record and ErrSeen", rec, err)
	}
	if err := d.SaveResult("01JTASK", result("done")); err != nil {
		t.Fatal(err)
	}

	d = openT(t, path) // agent restart before posting
	rec, err = d.Begin("01JTASK", "", exp, t0.Add(2*time.Second))
	if !errors.Is(err, ErrSeen) || rec.Result == nil || string(rec.Result.Output) != `{"msg":"done"}` {
		t.Fatalf("Begin after restart = %+v, %v", rec, err)
	}
	p, err := d.Pending()
	if err != nil || len(p) != 1 || !reflect.DeepEqual(*p[0].Result, result("done")) || p[0].Posted {
		t.Fatalf("Pending after restart = %+v, %v", p, err)
	}
	if err := d.MarkPosted("01JTASK"); err != nil {
		t.Fatal(err)
	}
	if err := d.MarkPosted("01JTASK"); err != nil {
		t.Errorf("second MarkPosted: %v", err)
	}
	if p, err := openT(t, path).Pending(); err != nil || len(p) != 0 {
		t.Errorf("Pending after MarkPosted = %+v, %v", p, err)
	}
}

func TestTaskErrors(t *testing.T) {
	d := openT(t, t.TempDir())
	if err := d.SaveResult("never-begun", result("x")); !errors.Is(err, ErrNotFound) {
		t.Errorf("SaveResult unknown: %v", err)
	}
	if err := d.MarkPosted("never-begun"); !errors.Is(err, ErrNotFound) {
		t.Errorf("MarkPosted unknown: %v", err)
	}
	if _, err := d.Begin("no-result", "", t0, t0); err != nil {
		t.Fatal(err)
	}
	if err := d.MarkPosted("no-result"); err == nil {
		t.Error("MarkPosted without a result succeeded")
	}
}

// TestInterrupted lists the tasks begun without a result, oldest first,
// with their correlation ids: not the finished ones, posted or not.
func TestInterrupted(t *testing.T) {
	d := openT(t, t.TempDir())
	for i, id := range []string{"cut-late", "finished", "cut-early", "posted"} {
		if _, err := d.Begin(id, "cid-"+id, t0.Add(time.Hour), t0.Add(time.Duration(3-i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"finished", "posted"} {
		if err := d.SaveResult(id, result(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.MarkPosted("posted"); err != nil {
		t.Fatal(err)
	}
	recs, err := d.Interrupted()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.TaskID+"/"+r.CorrelationID)
	}
	if want := []string{"cut-early/cid-cut-early", "cut-late/cid-cut-late"}; !slices.Equal(got, want) {
		t.Errorf("Interrupted = %v, want %v", got, want)
	}
}

func TestInvalidTaskIDsRejected(t *testing.T) {
	base := t.TempDir()
	d := openT(t, filepath.Join(base, "state"))
	ids := []string{
		"", ".", "..", "../escape", "../../etc/passwd", "a/b", `a\b`, `..\..\x`, "/abs",
		"a.json", "x y", "tab\t", "nul\x00byte", "é", "%2e%2e", strings.Repeat("a", 129),
		"CON", "con", "Nul", "COM1", "lpt9",
	}
	for _, id := range ids {
		if ValidTaskID(id) {
			t.Errorf("ValidTaskID(%q) = true", id)
		}
		if _, err := d.Begin(id, "", t0, t0); !errors.Is(err, ErrInvalidID) {
			t.Errorf("Begin(%q) err = %v, want ErrInvalidID", id, err)
		}
		if err := d.SaveResult(id, result("x")); !errors.Is(err, ErrInvalidID) {
			t.Errorf("SaveResult(%q) err = %v, want ErrInvalidID", id, err)
		}
		if err := d.MarkPosted(id); !errors.Is(err, ErrInvalidID) {
			t.Errorf("MarkPosted(%q) err = %v, want ErrInvalidID", id, err)
		}
	}
	ents, _ := os.ReadDir(base)
	if len(ents) != 1 {
		t.Errorf("files appeared next to the state dir: %v", ents)
	}
	for _, id := range []string{"a", "01J9ZK3X-task_ID", strings.Repeat("z", 128), "CONSOLE", "COM10"} {
		if !ValidTaskID(id) {
			t.Errorf("ValidTaskID(%q) = false", id)
		}
		if _, err := d.Begin(id, "", t0, t0); err != nil {
			t.Errorf("Begin(%q): %v", id, err)
		}
	}
}

func TestPendingOrderAndCorruptRecords(t *testing.T) {
	path := t.TempDir()
	d := openT(t, path)
	tasks := []struct {
		id             string
		started        time.Duration
		result, posted bool
	}{
		{"c-newest", 3 * time.Minute, true, false},
		{"a-oldest", 1 * time.Minute, true, false},
		{"b-middle", 2 * time.Minute, true, false},
		{"d-running", 0, false, false},
		{"e-posted", 0, true, true},
	}
	for _, tk := range tasks {
		if _, err := d.Begin(tk.id, "", t0.Add(time.Hour), t0.Add(tk.started)); err != nil {
			t.Fatal(err)
		}
		if tk.result {
			if err := d.SaveResult(tk.id, result(tk.id)); err != nil {
				t.Fatal(err)
			}
		}
		if tk.posted {
			if err := d.MarkPosted(tk.id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(path, "tasks", "README.txt"), []byte("not a record"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := d.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range p {
		got = append(got, r.TaskID)
	}
	if want := []string{"a-oldest", "b-middle", "c-newest"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Pending order = %v, want %v", got, want)
	}

	// A corrupt record is reported, not silently dropped, and still counts
	// as seen for replay protection.
	if err := os.WriteFile(filepath.Join(path, "tasks", "zz-corrupt.json"), []byte("{trunc"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err = d.Pending()
	if err == nil || len(p) != 3 {
		t.Errorf("Pending with a corrupt record = %d records, err %v", len(p), err)
	}
	if _, err := d.Begin("zz-corrupt", "", t0, t0); !errors.Is(err, ErrSeen) {
		t.Errorf("Begin over a corrupt record: %v, want ErrSeen", err)
	}
	if _, err := d.Prune(t0.Add(1000*time.Hour), 0); err == nil {
		t.Error("Prune did not report the corrupt record")
	}
	if _, err := os.Stat(filepath.Join(path, "tasks", "zz-corrupt.json")); err != nil {
		t.Errorf("Prune removed the corrupt record: %v", err)
	}
}

func TestPrune(t *testing.T) {
	d := openT(t, t.TempDir())
	keep := time.Hour
	now := t0.Add(10 * time.Hour)
	tasks := []struct {
		id             string
		expires        time.Time
		result, posted bool
		wantKept       bool
	}{
		{"posted-old", now.Add(-keep - time.Second), true, true, false},
		{"posted-at-edge", now.Add(-keep), true, true, true},
		{"posted-recent", now.Add(-keep + time.Minute), true, true, true},
		{"unposted-old", now.Add(-100 * time.Hour), true, false, true},
		{"running-old", now.Add(-100 * time.Hour), false, false, true},
	}
	for _, tk := range tasks {
		if _, err := d.Begin(tk.id, "", tk.expires, t0); err != nil {
			t.Fatal(err)
		}
		if tk.result {
			if err := d.SaveResult(tk.id, result(tk.id)); err != nil {
				t.Fatal(err)
			}
		}
		if tk.posted {
			if err := d.MarkPosted(tk.id); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := d.Prune(now, keep)
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1", n, err)
	}
	for _, tk := range tasks {
		_, err := d.Begin(tk.id, "", tk.expires, now)
		if kept := errors.Is(err, ErrSeen); kept != tk.wantKept {
			t.Errorf("%s kept=%v, want %v (Begin err %v)", tk.id, kept, tk.wantKept, err)
		}
	}
	if n, err := d.Prune(now, keep); err != nil || n != 0 {
		t.Errorf("second Prune = %d, %v", n, err)
	}
}

func TestConcurrentBeginRunsOnce(t *testing.T) {
	d := openT(t, t.TempDir())
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners, seen := 0, 0
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d.Begin("same-task", "", t0, t0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				winners++
			case errors.Is(err, ErrSeen):
				seen++
			default:
				t.Errorf("Begin: %v", err)
			}
		}()
	}
	wg.Wait()
	if winners != 1 || seen != 15 {
		t.Errorf("winners=%d seen=%d, want 1 and 15", winners, seen)
	}
}
