package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// The request and response bodies of the Firecracker API this adapter
// uses, written against the API's own specification (testdata/
// firecracker-api-v1.16.1.yaml, Swagger 2.0; definitions of the same
// names). Only the properties the adapter sets are here; every optional one
// is omitempty so a request carries nothing the adapter did not mean.
type (
	// MachineConfiguration is PUT/GET /machine-config.
	MachineConfiguration struct {
		VCPUCount  int  `json:"vcpu_count"`
		MemSizeMiB int  `json:"mem_size_mib"`
		SMT        bool `json:"smt,omitempty"`
	}
	// BootSource is PUT /boot-source.
	BootSource struct {
		KernelImagePath string `json:"kernel_image_path"`
		BootArgs        string `json:"boot_args,omitempty"`
		InitrdPath      string `json:"initrd_path,omitempty"`
	}
	// Drive is PUT /drives/{drive_id}: a virtio-block drive.
	Drive struct {
		DriveID      string `json:"drive_id"`
		IsRootDevice bool   `json:"is_root_device"`
		IsReadOnly   bool   `json:"is_read_only"`
		PathOnHost   string `json:"path_on_host"`
		CacheType    string `json:"cache_type,omitempty"` // Unsafe | Writeback
		IOEngine     string `json:"io_engine,omitempty"`  // Sync | Async
	}
	// NetworkInterface is PUT /network-interfaces/{iface_id}.
	NetworkInterface struct {
		IfaceID     string `json:"iface_id"`
		HostDevName string `json:"host_dev_name"`
		GuestMAC    string `json:"guest_mac,omitempty"`
	}
	// Vsock is PUT /vsock.
	Vsock struct {
		GuestCID int    `json:"guest_cid"`
		UDSPath  string `json:"uds_path"`
	}
	// MMDSConfig is PUT /mmds/config.
	MMDSConfig struct {
		Version           string   `json:"version,omitempty"` // V1 | V2
		NetworkInterfaces []string `json:"network_interfaces"`
		IPv4Address       string   `json:"ipv4_address,omitempty"`
	}
	// InstanceActionInfo is PUT /actions.
	InstanceActionInfo struct {
		ActionType string `json:"action_type"` // InstanceStart | SendCtrlAltDel | FlushMetrics
	}
	// InstanceInfo is GET /.
	InstanceInfo struct {
		AppName    string `json:"app_name"`
		ID         string `json:"id"`
		State      string `json:"state"` // Not started | Running | Paused
		VMMVersion string `json:"vmm_version"`
	}
)

// Actions (InstanceActionInfo.ActionType) and instance states.
const (
	ActionInstanceStart  = "InstanceStart"
	ActionSendCtrlAltDel = "SendCtrlAltDel"
	StateRunning         = "Running"
	StateNotStarted      = "Not started"
)

// APIError is a Firecracker answer outside 2xx, with the fault_message of
// its Error body.
type APIError struct {
	Method, Path string
	Status       int
	FaultMessage string
}

func (e *APIError) Error() string {
	msg := e.FaultMessage
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("%s %s: %d: %s", e.Method, e.Path, e.Status, msg)
}

// Client talks to one Firecracker process over its API unix socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the API socket at path; each request is
// bounded by timeout (0: 10s) and by its context.
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true, // a process per instance; nothing to pool
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr, Timeout: timeout}}
}

// Socket is the API socket's path.
func (c *Client) Socket() string { return c.socket }

// do sends one request; in (when not nil) is the JSON body, out (when not
// nil) receives the JSON answer.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encode: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &APIError{Method: method, Path: path, Status: resp.StatusCode}
		var fault struct {
			FaultMessage string `json:"fault_message"`
		}
		if json.Unmarshal(b, &fault) == nil {
			e.FaultMessage = fault.FaultMessage
		}
		if e.FaultMessage == "" {
			e.FaultMessage = strings.TrimSpace(string(b))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

// PutMachineConfig sets vCPUs and memory (pre-boot).
func (c *Client) PutMachineConfig(ctx context.Context, m MachineConfiguration) error {
	return c.do(ctx, http.MethodPut, "/machine-config", m, nil)
}

// GetMachineConfig reads the machine configuration.
func (c *Client) GetMachineConfig(ctx context.Context) (MachineConfiguration, error) {
	var m MachineConfiguration
	err := c.do(ctx, http.MethodGet, "/machine-config", nil, &m)
	return m, err
}

// PutBootSource sets the kernel, its command line and initrd (pre-boot).
func (c *Client) PutBootSource(ctx context.Context, b BootSource) error {
	return c.do(ctx, http.MethodPut, "/boot-source", b, nil)
}

// PutDrive adds or replaces a drive (pre-boot).
func (c *Client) PutDrive(ctx context.Context, d Drive) error {
	if err := checkPathID("drive_id", d.DriveID); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/drives/"+d.DriveID, d, nil)
}

// PutNetworkInterface adds a network interface on a host tap (pre-boot).
func (c *Client) PutNetworkInterface(ctx context.Context, n NetworkInterface) error {
	if err := checkPathID("iface_id", n.IfaceID); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/network-interfaces/"+n.IfaceID, n, nil)
}

// PutVsock adds the vsock device (pre-boot).
func (c *Client) PutVsock(ctx context.Context, v Vsock) error {
	return c.do(ctx, http.MethodPut, "/vsock", v, nil)
}

// PutMMDSConfig configures the metadata service (pre-boot).
func (c *Client) PutMMDSConfig(ctx context.Context, m MMDSConfig) error {
	return c.do(ctx, http.MethodPut, "/mmds/config", m, nil)
}

// PutMMDS replaces the metadata store's contents (any JSON object).
func (c *Client) PutMMDS(ctx context.Context, contents map[string]any) error {
	if contents == nil {
		contents = map[string]any{}
	}
	return c.do(ctx, http.MethodPut, "/mmds", contents, nil)
}

// Action runs a synchronous action (InstanceStart, SendCtrlAltDel).
func (c *Client) Action(ctx context.Context, action string) error {
	return c.do(ctx, http.MethodPut, "/actions", InstanceActionInfo{ActionType: action}, nil)
}

// Describe is GET /: the instance's state and the VMM's version.
func (c *Client) Describe(ctx context.Context) (InstanceInfo, error) {
	var i InstanceInfo
	err := c.do(ctx, http.MethodGet, "/", nil, &i)
	return i, err
}

// checkPathID refuses an id that would not stay one path segment.
func checkPathID(what, id string) error {
	if id == "" || strings.ContainsAny(id, "/?#% ") {
		return errors.New(what + " " + fmt.Sprintf("%q", id) + ": want a non-empty path segment")
	}
	return nil
}
