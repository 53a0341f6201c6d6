package dashboard

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

func intp(n int) *int { return &n }

// sampleInventory is a GPU host's inventory: two sockets with VT-x, one
// H100 in IOMMU group 10, a 25 GbE NIC, an NVMe namespace and a SATA disk.
func sampleInventory() *api.HostInventory {
	return &api.HostInventory{
		Hostname: "gpu-01",
		CPU:      api.CPUInfo{Vendor: "GenuineIntel", Model: "Xeon Platinum 8480+", Sockets: 2, Cores: 112, Threads: 224, Virtualization: []string{"vmx"}},
		Memory:   api.MemoryInfo{TotalBytes: 2 << 40, AvailableBytes: 1 << 40, TotalMiB: 2 << 20},
		GPUs: []api.GPU{{PCIFunction: api.PCIFunction{Address: "0000:3b:00.0", VendorID: "0x10de", DeviceID: "0x2330",
			Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: intp(10)}, Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3"}},
		NICs: []api.NIC{{Name: "ens1f0", MAC: "0c:42:a1:00:00:01", SpeedMbps: 25000, Driver: "mlx5_core", PCIAddress: "0000:af:00.0", OperState: "up", Up: true}},
		NVMe: []api.NVMeNamespace{{Name: "nvme0n1", Model: "SAMSUNG MZQL23T8HCLS", SizeBytes: 3840755982336, PCIAddress: "0000:c1:00.0",
			IOMMUGroup: intp(12), MountPoints: []string{}, Holders: []string{}}},
		Disks:       []api.Disk{{Name: "nvme0n1", Kind: "nvme"}, {Name: "sda", Kind: "scsi", Model: "<script>x</script>", SizeBytes: 480 << 30, NUMANode: -1}},
		IOMMUGroups: []api.IOMMUGroup{{ID: 10, Devices: []string{"0000:3b:00.0", "0000:3b:00.1"}}, {ID: 12, Devices: []string{"0000:c1:00.0"}}},
	}
}

// hostPageAPI is a fake operator API with host h1 (its inventory, capacity
// and one stored preflight run), tokens "op" and "view" with the API's role
// rule on POST /api/v1/tasks, recording the tasks queued.
type hostPageAPI struct {
	mu     sync.Mutex
	host   api.Host
	queued []api.EnqueueTaskRequest
}

func newHostPageServer(t *testing.T) (*httptest.Server, *hostPageAPI) {
	now := time.Now()
	ok := now.Add(-time.Minute)
	f := &hostPageAPI{host: api.Host{ID: "h1", OSFamily: "linux", Status: api.HostHealthy, LastSeenAt: &now, Enabled: true,
		HeartbeatInterval: api.Duration(time.Second), LastSuccessfulPreflightAt: &ok,
		Capabilities: &api.Capabilities{Hostname: "gpu-01", OSFamily: "linux", Inventory: sampleInventory()},
		Capacity: &api.CapacityReport{Total: api.Capacity{VCPUs: 16, MemoryMiB: 65536, DiskGiB: 1000, GPUs: 1},
			Reserved: api.Capacity{VCPUs: 2, MemoryMiB: 4096, DiskGiB: 100}, Allocated: api.Capacity{VCPUs: 4, MemoryMiB: 8192, GPUs: 1},
			Free: api.Capacity{VCPUs: 10, MemoryMiB: 53248, DiskGiB: 900}}}}
	rep := preflight.Report{Schema: preflight.SchemaVersion, NodeID: "h1", Hops: []preflight.HopResult{
		{Hop: signal.HopNodeReadiness, Status: preflight.Passed, DurationMS: 3, Detail: "state dir writable"},
		{Hop: signal.HopNodeRuntimeAPIReachability, Status: preflight.Passed, DurationMS: 12, Detail: "mTLS to cp"},
	}}
	rep.Classify()
	raw, _ := json.Marshal(rep)
	run := api.PreflightRun{ID: "pfr_1", HostID: "h1", CorrelationID: "cid-pf", OK: true, CreatedBy: "operator:alice", CreatedAt: ok}
	role := map[string]api.Role{"Bearer op": api.RoleOperator, "Bearer view": api.RoleViewer}
	mux := http.NewServeMux()
	host := func() api.Host { f.mu.Lock(); defer f.mu.Unlock(); return f.host }
	mux.HandleFunc("GET /api/v1/hosts", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, []api.Host{host()}) })
	mux.HandleFunc("GET /api/v1/hosts/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "h1" {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(404, "host_not_found", "no host"))
			return
		}
		httpapi.WriteJSON(w, 200, host())
	})
	mux.HandleFunc("GET /api/v1/hosts/{id}/slots", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, []api.Slot{}) })
	mux.HandleFunc("GET /api/v1/audit", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, []api.AuditEvent{}) })
	mux.HandleFunc("GET /api/v1/tasks", func(w http.ResponseWriter, r *http.Request) { httpapi.WriteJSON(w, 200, []api.Task{}) })
	mux.HandleFunc("GET /api/v1/preflight-runs", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("host_id") != "h1" {
			t.Errorf("preflight runs of %q", r.URL.Query().Get("host_id"))
		}
		httpapi.WriteJSON(w, 200, []api.PreflightRun{run})
	})
	mux.HandleFunc("GET /api/v1/preflight-runs/{id}", func(w http.ResponseWriter, r *http.Request) {
		v := run
		v.Report = raw
		httpapi.WriteJSON(w, 200, v)
	})
	mux.HandleFunc("POST /api/v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		if !role[r.Header.Get("Authorization")].AtLeast(api.RoleOperator) {
			httpapi.WriteError(slog.Default(), w, r, httpapi.Errorf(403, "forbidden", "requires role operator"))
			return
		}
		var req api.EnqueueTaskRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.queued = append(f.queued, req)
		f.mu.Unlock()
		httpapi.WriteJSON(w, 201, api.Task{ID: "tsk_pf1", NodeID: req.NodeID, Type: req.Type})
	})
	u := New(Config{API: mux, Authenticate: func(_ context.Context, tok string) (httpapi.Principal, error) {
		if r, ok := role["Bearer "+tok]; ok {
			return httpapi.Principal{Name: tok, Role: r}, nil
		}
		return httpapi.Principal{}, httpapi.Errorf(401, "operator_token_invalid", "no")
	}})
	dm := http.NewServeMux()
	for _, rt := range u.Routes() {
		dm.Handle(rt.Pattern, rt.Handler)
	}
	ts := httptest.NewServer(dm)
	t.Cleanup(ts.Close)
	return ts, f
}

// section is the HTML of the element with id (up to its closing tag).
func section(t *testing.T, body, id, end string) string {
	t.Helper()
	i := strings.Index(body, `id="`+id+`"`)
	if i < 0 {
		t.Fatalf("no #%s in the page", id)
	}
	j := strings.Index(body[i:], end)
	if j < 0 {
		t.Fatalf("#%s does not end with %s", id, end)
	}
	return body[i : i+j]
}

// TestHostPageDeviceTables: the host page shows the inventory as
// captioned device tables (th with scope, in horizontal scrollers) with
// PCI ids, IOMMU groups naming their devices, and values escaped; the raw
// JSON stays below in a <details>.
func TestHostPageDeviceTables(t *testing.T) {
	ts, _ := newHostPageServer(t)
	c, _ := login(t, ts, "op")
	st, body := get(t, c, ts.URL+"/ui/hosts/h1")
	if st != 200 {
		t.Fatalf("host page: %d %s", st, body)
	}
	for id, wants := range map[string][]string{
		"inv-cpu":   {"<caption>CPU and memory</caption>", "Xeon Platinum 8480&#43; (GenuineIntel)", "2 / 112 / 224", "vmx", "2.0 TiB / 1.0 TiB"},
		"inv-gpus":  {"<caption>GPUs (1)</caption>", `<th scope="row">0000:3b:00.0</th>`, "<td>10de:2330</td>", "NVIDIA H100 80GB HBM3", "vfio-pci", "<td>10</td>"},
		"inv-nics":  {"<caption>Network interfaces (1)</caption>", "ens1f0", "0c:42:a1:00:00:01", "25000 Mb/s", "mlx5_core", "0000:af:00.0"},
		"inv-disks": {"<caption>Disks and NVMe namespaces (2)</caption>", "SAMSUNG MZQL23T8HCLS", "3.5 TiB", "0000:c1:00.0", "480.0 GiB", "&lt;script&gt;"},
		"inv-iommu": {"<caption>IOMMU groups (2)</caption>", "0000:3b:00.0 (GPU NVIDIA H100 80GB HBM3)<br>0000:3b:00.1", "0000:c1:00.0 (NVMe nvme0n1)"},
	} {
		sec := section(t, body, id, "</table>")
		for _, w := range wants {
			if !strings.Contains(sec, w) {
				t.Errorf("#%s lacks %q:\n%s", id, w, sec)
			}
		}
		if !strings.Contains(sec, `scope="`) {
			t.Errorf("#%s has no th scope", id)
		}
		if i := strings.Index(body, `id="`+id+`"`); !strings.HasSuffix(body[:i], `<div class="scroll"><table `) {
			t.Errorf("#%s is not in a horizontal scroller", id)
		}
	}
	if strings.Contains(body, "<script>x</script>") {
		t.Error("a disk model went into the page unescaped")
	}
	if n := strings.Count(body, "nvme0n1</th>"); n != 1 {
		t.Errorf("nvme0n1 listed %d times in the disks table, want once (the NVMe row)", n)
	}
	if !regexp.MustCompile(`(?s)<details><summary>The inventory as the agent reported it \(JSON\)</summary><pre>.*&#34;pci_address&#34;: &#34;0000:3b:00.0&#34;`).MatchString(body) {
		t.Error("the raw inventory JSON is not kept in a <details>")
	}
}

// TestHostPageCapacityAndPreflight: the capacity plot is an inline SVG
// with a labelled stacked bar per resource (numbers in text, segments
// scaled to the total), and the latest preflight run's hops are shown.
func TestHostPageCapacityAndPreflight(t *testing.T) {
	ts, _ := newHostPageServer(t)
	c, _ := login(t, ts, "op")
	_, body := get(t, c, ts.URL+"/ui/hosts/h1")
	svg := section(t, body, "capacity-chart", "</svg>")
	for _, w := range []string{`role="img"`, `aria-labelledby="capacity-chart-title"`,
		"vCPU: 16 total · 2 reserved · 4 allocated · 10 free", "Memory: 65536 MiB total · 4096 reserved · 8192 allocated · 53248 free",
		"Disk: 1000 GiB total · 100 reserved · 0 allocated · 900 free", "GPUs: 1 total · 0 reserved · 1 allocated · 0 free",
		// vCPU: 2, 4 and 10 of 16 on a 420 px track.
		`<rect x="0" y="20" width="52" height="14" class="cap-reserved" data-n="2"><title>vCPU reserved: 2</title>`,
		`<rect x="52" y="20" width="105" height="14" class="cap-allocated" data-n="4">`,
		`<rect x="157" y="20" width="262" height="14" class="cap-free" data-n="10">`} {
		if !strings.Contains(svg, w) {
			t.Errorf("capacity chart lacks %q:\n%s", w, svg)
		}
	}
	hops := section(t, body, "preflight-hops", "</table>")
	for _, w := range []string{"Hops of preflight run pfr_1", `<th scope="row">node_readiness</th>`, "state dir writable", "12 ms"} {
		if !strings.Contains(hops, w) {
			t.Errorf("preflight hops lack %q:\n%s", w, hops)
		}
	}
	if !strings.Contains(section(t, body, "preflight-latest", "</p>"), `<strong class="ok">passed</strong>`) {
		t.Error("latest preflight run is not shown as passed")
	}
	if strings.Contains(section(t, body, "last-preflight-ok", "</span>"), "never") {
		t.Error("last successful preflight shows never")
	}
}

// TestHostLiveFragment: the page's live block polls its fragment route at
// the heartbeat interval; the fragment carries the new status (a host that
// stopped heartbeating shows stale) and swaps capacity and preflight out
// of band; an unknown host ends the polling (286).
func TestHostLiveFragment(t *testing.T) {
	ts, f := newHostPageServer(t)
	c, _ := login(t, ts, "op")
	_, body := get(t, c, ts.URL+"/ui/hosts/h1")
	if !strings.Contains(body, `<div id="host-live" hx-get="/ui/hosts/h1/live" hx-trigger="every 1000ms" hx-swap="outerHTML">`) {
		t.Errorf("host page has no polling live block:\n%s", body)
	}
	f.mu.Lock()
	old := time.Now().Add(-time.Minute)
	f.host.Status, f.host.LastSeenAt = api.HostStale, &old
	f.mu.Unlock()
	st, frag := get(t, c, ts.URL+"/ui/hosts/h1/live")
	if st != 200 || !strings.HasPrefix(frag, `<div id="host-live"`) || strings.Contains(frag, "<html") {
		t.Fatalf("live fragment: %d %s", st, frag)
	}
	for _, w := range []string{`<strong id="host-status" class="status s-stale">stale</strong>`, `class="late"`,
		`<section id="host-capacity" aria-labelledby="h-cap" hx-swap-oob="true">`, `<section id="host-preflight" aria-labelledby="h-preflight" hx-swap-oob="true">`,
		`id="capacity-chart"`} {
		if !strings.Contains(frag, w) {
			t.Errorf("live fragment lacks %q:\n%s", w, frag)
		}
	}
	if st, _ := get(t, c, ts.URL+"/ui/hosts/nope/live"); st != 286 {
		t.Errorf("live fragment of an unknown host: %d, want 286", st)
	}
}

// TestRunPreflightAction: an operator's Run preflight queues diag.preflight
// for the host and comes back with "preflight queued: task <id>"; a viewer
// sees no Run preflight and a viewer's forged POST (with its own valid
// CSRF token) gets 403 and queues nothing.
func TestRunPreflightAction(t *testing.T) {
	ts, f := newHostPageServer(t)
	view, vcsrf := login(t, ts, "view")
	_, body := get(t, view, ts.URL+"/ui/hosts/h1")
	if strings.Contains(body, "act-preflight") || strings.Contains(body, "Run preflight") {
		t.Error("viewer's host page offers Run preflight")
	}
	if resp, _ := postResp(t, view, ts.URL+"/ui/hosts/h1/actions/preflight", url.Values{"csrf": {vcsrf}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("viewer's forged preflight: %d, want 403", resp.StatusCode)
	}

	op, csrf := login(t, ts, "op")
	_, body = get(t, op, ts.URL+"/ui/hosts/h1")
	if !strings.Contains(body, `id="act-preflight">Run preflight</button>`) {
		t.Error("operator's host page has no Run preflight")
	}
	if resp, _ := postResp(t, op, ts.URL+"/ui/hosts/h1/actions/preflight", url.Values{}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("preflight without CSRF: %d, want 403", resp.StatusCode)
	}
	resp, _ := postResp(t, op, ts.URL+"/ui/hosts/h1/actions/preflight", url.Values{"csrf": {csrf}})
	loc := resp.Header.Get("Location")
	want := "/ui/hosts/h1?" + url.Values{"done": {"preflight queued: task tsk_pf1"}}.Encode()
	if resp.StatusCode != http.StatusSeeOther || loc != want {
		t.Errorf("preflight action: %d %s", resp.StatusCode, loc)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.queued) != 1 || f.queued[0].NodeID != "h1" || f.queued[0].Type != "diag.preflight" {
		t.Errorf("queued %+v", f.queued)
	}
}

// TestCapacityChartOvercommit: allocated beyond the total scales the bar
// to the sum, so no segment runs past the track; no report draws nothing.
func TestCapacityChartOvercommit(t *testing.T) {
	if capacityChart(nil) != "" {
		t.Error("nil report drew a chart")
	}
	svg := string(capacityChart(&api.CapacityReport{Total: api.Capacity{VCPUs: 4}, Allocated: api.Capacity{VCPUs: 8}}))
	if !strings.Contains(svg, `<rect x="0" y="20" width="420" height="14" class="cap-allocated" data-n="8">`) {
		t.Errorf("over-committed vCPU bar:\n%s", svg)
	}
}
