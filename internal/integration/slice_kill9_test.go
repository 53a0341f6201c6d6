package integration

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/sliceflow"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// stallingImage serves the guest's disk image over http: the first
// request gets the headers and the first half of the file (at most a MiB),
// then nothing until its client goes away (arrived is closed once it has been written); every
// later request gets the whole file.
type stallingImage struct {
	path    string
	arrived chan struct{}
	calls   atomic.Int32
}

func (s *stallingImage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.calls.Add(1) > 1 {
		http.ServeFile(w, r, s.path)
		return
	}
	f, err := os.Open(s.path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	// Half the file (the test image is smaller than a MiB): the client
	// waits for the rest.
	buf := make([]byte, min(1<<20, fi.Size()/2))
	n, _ := io.ReadFull(f, buf)
	_, _ = w.Write(buf[:n])
	w.(http.Flusher).Flush()
	close(s.arrived)
	<-r.Context().Done()
}

// TestSliceWorkflowAgentKill9TCG kills a real drover-agent process with
// SIGKILL in the middle of slice.vm_provision (the node holds the slot's
// lease and half of the image is downloaded) and starts it again on the
// same state: the agent reports the task failed with
// agent_restarted_during_task (it never runs a task twice), the workflow
// compensates (slice.vm_release on the node, the leases freed) and the
// partial download is removed. The slot then takes a second allocation,
// whose VM QEMU cannot start (the fixture's GPU and VF are not real
// devices): that failure is compensated too, and nothing of either is
// left.
func TestSliceWorkflowAgentKill9TCG(t *testing.T) {
	requireRoot(t)
	bin := buildAgent(t)
	e := startEnv(t, openSQLite(t))
	n := newSliceNodeWith(t, e, "slice-k9", sliceNodeOpts{agentBin: bin,
		env: []string{"NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS=true"}})
	n.approveSlots(e)

	img := &stallingImage{path: n.g.Disk, arrived: make(chan struct{})}
	srv := httptest.NewServer(img)
	t.Cleanup(srv.Close)
	req := n.request("dave")
	req.Image = srv.URL + "/disk.img"
	a := e.createSlice(req)
	select {
	case <-img.arrived:
	case <-time.After(3 * time.Minute):
		t.Fatal("the agent never started downloading the image")
	}
	if f := n.files("slices/leases"); len(f) != 1 {
		t.Fatalf("node slot leases while downloading: %v, want one", f)
	}
	partials := func() []string { return n.files(filepath.Join("images", "tmp")) }
	// The first half reaches the file a moment after it left the server.
	deadline := time.Now().Add(10 * time.Second)
	for len(partials()) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if p := partials(); len(p) != 1 || !strings.HasSuffix(p[0], ".part") {
		t.Fatalf("partial downloads before the kill: %v, want one .part file", p)
	}
	n.stop()
	n.start(e)

	a = e.followSlice(a.ID, 3*time.Minute, nil, settled)
	failedSlice(t, e, n, a, sliceflow.StepAwaitProvision, signal.SliceProvisionFailed)
	if !strings.Contains(a.Workflow.Error, "agent_restarted_during_task") {
		t.Errorf("workflow error %q does not say the agent restarted during the task", a.Workflow.Error)
	}
	if p := partials(); len(p) != 0 {
		t.Errorf("partial downloads after the restart: %v", p)
	}
	var steps []string
	for _, s := range a.Workflow.Steps {
		steps = append(steps, s.Step)
	}
	if want := []string{sliceflow.StepLeaseSlots, sliceflow.StepVMProvision, sliceflow.StepAwaitProvision,
		"compensate_" + sliceflow.StepDeprovisionUser, "compensate_" + sliceflow.StepReleaseVM, "compensate_" + sliceflow.StepAwaitRelease,
		"compensate_" + sliceflow.StepFreeLeases}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}

	// The slot is free again: a second allocation leases it, downloads the
	// image in full and writes it, and fails where QEMU is asked for the
	// VFIO devices.
	a2 := e.createSlice(req)
	a2 = e.followSlice(a2.ID, 4*time.Minute, nil, settled)
	failedSlice(t, e, n, a2, sliceflow.StepAwaitProvision, signal.SliceProvisionFailed)
	if !strings.Contains(a2.Workflow.Error, slicevm.PhaseVirtInstall) {
		t.Errorf("second allocation's error %q does not name %s", a2.Workflow.Error, slicevm.PhaseVirtInstall)
	}
	t.Logf("second allocation: %s", a2.Workflow.Error)
	// The image was written onto the slot's NVMe before QEMU failed; the
	// compensation's release wiped it.
	nv, err := os.ReadFile(n.nvme)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(nv, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("the NVMe namespace is not wiped after the failed second allocation: byte %d is %#x", i, nv[i])
	}
	if got := img.calls.Load(); got != 2 {
		t.Errorf("image requests = %d, want 2 (the stalled one, then the whole file once)", got)
	}
}
