package firecracker

// The fake firecracker: this test binary, re-executed with
// DROVER_FAKE_FC=1, serves the API on --api-sock and checks every request
// against the specification (specvalidate_test.go) before acting on it. It
// is a contract test server, not a stand-in for Firecracker: it boots
// nothing; it keeps just enough state to answer as Firecracker's API does
// (pre-boot only calls refused after InstanceStart, InstanceStart refused
// without a kernel or with files it cannot open) and, on InstanceStart,
// prints a line to its stdout (the serial log) and keeps running until
// SendCtrlAltDel, when it exits as a guest that reboots with reboot=k does.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment of the fake.
const (
	fakeEnv       = "DROVER_FAKE_FC"        // "1": be the fake
	fakeSpecEnv   = "DROVER_FAKE_FC_SPEC"   // the spec's absolute path
	fakeLogEnv    = "DROVER_FAKE_FC_LOG"    // where requests are recorded (JSON lines)
	fakeFailEnv   = "DROVER_FAKE_FC_FAIL"   // an action_type, or "METHOD /path", answered 400 with DROVER_FAKE_FC_FAULT
	fakeExitEnv   = "DROVER_FAKE_FC_EXIT"   // a message: print it to stderr and exit 1 before serving (a firecracker that dies at start)
	fakeFaultEnv  = "DROVER_FAKE_FC_FAULT"  // that fault_message
	fakeNoCADEnv  = "DROVER_FAKE_FC_NO_CAD" // "1": ignore SendCtrlAltDel (a guest that never shuts down)
	fakeBootedMsg = "fake-firecracker: guest booted"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeEnv) == "1" {
		os.Exit(fakeFirecracker(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// record is one request the fake received.
type record struct {
	Method    string          `json:"method"`
	Path      string          `json:"path"`
	Body      json.RawMessage `json:"body,omitempty"`
	Status    int             `json:"status"`
	Violation string          `json:"violation,omitempty"`
}

type fake struct {
	spec *apiSpec
	log  *os.File

	mu       sync.Mutex
	started  bool
	machine  MachineConfiguration
	kernel   string
	drives   map[string]string // drive_id → path_on_host
	failWhat string
	fault    string
	noCAD    bool
}

func fakeFirecracker(args []string) int {
	sock := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--api-sock" {
			sock = args[i+1]
		}
	}
	if sock == "" {
		fmt.Fprintln(os.Stderr, "fake firecracker: --api-sock is required")
		return 2
	}
	if msg := os.Getenv(fakeExitEnv); msg != "" {
		fmt.Fprintln(os.Stderr, msg)
		return 1
	}
	spec, err := loadSpec(os.Getenv(fakeSpecEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake firecracker:", err)
		return 2
	}
	f := &fake{spec: spec, machine: MachineConfiguration{VCPUCount: 1, MemSizeMiB: 128}, drives: map[string]string{},
		failWhat: os.Getenv(fakeFailEnv), fault: os.Getenv(fakeFaultEnv), noCAD: os.Getenv(fakeNoCADEnv) == "1"}
	if p := os.Getenv(fakeLogEnv); p != "" {
		if f.log, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "fake firecracker:", err)
			return 2
		}
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake firecracker:", err)
		return 1
	}
	fmt.Println("fake-firecracker: API listening on", sock)
	if err := http.Serve(ln, f); err != nil {
		fmt.Fprintln(os.Stderr, "fake firecracker:", err)
		return 1
	}
	return 0
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec := record{Method: r.Method, Path: r.URL.Path}
	if json.Valid(body) {
		rec.Body = body
	}
	status, answer := f.handle(r.Method, r.URL.Path, body, &rec)
	rec.Status = status
	if f.log != nil {
		b, _ := json.Marshal(rec)
		_, _ = f.log.Write(append(b, '\n'))
	}
	if answer != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(answer)
		return
	}
	w.WriteHeader(status)
}

func faultMsg(msg string) map[string]string { return map[string]string{"fault_message": msg} }

// handle answers one request: (status, JSON answer or nil).
func (f *fake) handle(method, path string, body []byte, rec *record) (int, any) {
	if err := f.spec.validateRequest(method, path, body); err != nil {
		rec.Violation = err.Error()
		status := http.StatusBadRequest
		if re, ok := err.(*requestError); ok {
			status = re.Status
		}
		return status, faultMsg("contract: " + err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failWhat == method+" "+path {
		fmt.Fprintf(os.Stderr, "[fake-firecracker:fc_api] The API server received a %s request on %q; refused: %s\n", method, path, f.fault)
		return http.StatusBadRequest, faultMsg(f.fault)
	}
	state := StateNotStarted
	if f.started {
		state = StateRunning
	}
	if method == http.MethodGet {
		switch path {
		case "/":
			return http.StatusOK, InstanceInfo{AppName: "Firecracker", ID: "anonymous-instance", State: state, VMMVersion: "1.16.1-fake"}
		case "/machine-config":
			return http.StatusOK, f.machine
		}
		return http.StatusBadRequest, faultMsg("fake firecracker does not implement GET " + path)
	}
	preBoot := path == "/machine-config" || path == "/boot-source" || path == "/vsock" || path == "/mmds/config" ||
		strings.HasPrefix(path, "/drives/") || strings.HasPrefix(path, "/network-interfaces/")
	if preBoot && f.started {
		return http.StatusBadRequest, faultMsg("The requested operation is not supported after starting the microVM.")
	}
	switch {
	case path == "/machine-config":
		_ = json.Unmarshal(body, &f.machine)
	case path == "/boot-source":
		var b BootSource
		_ = json.Unmarshal(body, &b)
		f.kernel = b.KernelImagePath
	case strings.HasPrefix(path, "/drives/"):
		var d Drive
		_ = json.Unmarshal(body, &d)
		if d.DriveID != strings.TrimPrefix(path, "/drives/") {
			return http.StatusBadRequest, faultMsg("The id from the path does not match the id from the body!")
		}
		f.drives[d.DriveID] = d.PathOnHost
	case strings.HasPrefix(path, "/network-interfaces/"):
		var n NetworkInterface
		_ = json.Unmarshal(body, &n)
		if n.IfaceID != strings.TrimPrefix(path, "/network-interfaces/") {
			return http.StatusBadRequest, faultMsg("The id from the path does not match the id from the body!")
		}
	case path == "/actions":
		var a InstanceActionInfo
		_ = json.Unmarshal(body, &a)
		return f.action(a.ActionType)
	}
	return http.StatusNoContent, nil
}

func (f *fake) action(typ string) (int, any) {
	if typ == f.failWhat {
		return http.StatusBadRequest, faultMsg(f.fault)
	}
	switch typ {
	case ActionInstanceStart:
		if f.started {
			return http.StatusBadRequest, faultMsg("The microVM is already running.")
		}
		if f.kernel == "" {
			return http.StatusBadRequest, faultMsg("Cannot start microvm without kernel configuration.")
		}
		for _, p := range append([]string{f.kernel}, mapValues(f.drives)...) {
			if _, err := os.Stat(p); err != nil {
				return http.StatusBadRequest, faultMsg(fmt.Sprintf("Unable to open file %s: %v", p, err))
			}
		}
		f.started = true
		fmt.Println(fakeBootedMsg)
	case ActionSendCtrlAltDel:
		if !f.started {
			return http.StatusBadRequest, faultMsg("The microVM is not running.")
		}
		if !f.noCAD {
			go func() {
				time.Sleep(20 * time.Millisecond)
				fmt.Println("reboot: Restarting system")
				os.Exit(0)
			}()
		}
	}
	return http.StatusNoContent, nil
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
