package cloudinit

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/google/go-cmp/cmp"
)

// readISO opens an image with go-diskfs and returns its label and files.
func readISO(t *testing.T, path string) (string, map[string][]byte) {
	t.Helper()
	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatalf("open iso: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	isofs, err := d.GetFilesystem(0)
	if err != nil {
		t.Fatalf("read iso filesystem: %v", err)
	}
	entries, err := isofs.ReadDir(".")
	if err != nil {
		t.Fatalf("list iso root: %v", err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		b, err := isofs.ReadFile(e.Name())
		if err != nil {
			t.Fatalf("read %s from iso: %v", e.Name(), err)
		}
		files[e.Name()] = b
	}
	return strings.TrimRight(isofs.Label(), " "), files
}

func TestBuildISO(t *testing.T) {
	tests := []struct {
		name          string
		networkConfig []byte // nil: no network-config file
	}{
		{"user and meta data", nil},
		{"with network-config", []byte("version: 2\nethernets:\n  eth0:\n    dhcp4: true\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			seed := filepath.Join(base, "seed")
			c := Config{InstanceID: "vm-1", SSHAuthorizedKeys: []string{testKey(t)},
				Files: []File{{Path: "/run/drover/secrets/token", Content: bytes.Repeat([]byte("x"), 5000), Permissions: 0o400}}}
			if err := WriteSeedDir(seed, c); err != nil {
				t.Fatal(err)
			}
			want := map[string][]byte{"user-data": must(c.UserData()), "meta-data": c.MetaData()}
			if tt.networkConfig != nil {
				if err := os.WriteFile(filepath.Join(seed, "network-config"), tt.networkConfig, 0o600); err != nil {
					t.Fatal(err)
				}
				want["network-config"] = tt.networkConfig
			}
			out := filepath.Join(base, "seed.iso")
			if err := BuildISO(context.Background(), seed, out); err != nil {
				t.Fatal(err)
			}
			label, got := readISO(t, out)
			if label != VolumeLabel {
				t.Errorf("label = %q, want %q", label, VolumeLabel)
			}
			if diff := cmp.Diff(got, want); diff != "" {
				t.Errorf("iso files (-got +want):\n%s", diff)
			}
			fi, err := os.Stat(out)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size()%isoBlock != 0 || fi.Size() > 1<<20 {
				t.Errorf("iso size = %d, want a multiple of %d trimmed below 1 MiB", fi.Size(), isoBlock)
			}
			if runtime.GOOS != "windows" && fi.Mode().Perm() != 0o600 {
				t.Errorf("iso mode = %v, want 0600", fi.Mode().Perm())
			}
			left, err := os.ReadDir(base)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 2 {
				t.Errorf("leftover files beside the iso: %v", left)
			}
			checkLabelWithTools(t, out)
		})
	}
}

// checkLabelWithTools cross-checks the label with blkid or isoinfo when
// the machine has one; neither is required.
func checkLabelWithTools(t *testing.T, iso string) {
	t.Helper()
	if p, err := exec.LookPath("blkid"); err == nil {
		out, err := exec.Command(p, "-o", "value", "-s", "LABEL", iso).Output()
		if err != nil {
			t.Errorf("blkid %s: %v", iso, err)
		} else if got := strings.TrimSpace(string(out)); got != VolumeLabel {
			t.Errorf("blkid label = %q, want %q", got, VolumeLabel)
		}
	}
	if p, err := exec.LookPath("isoinfo"); err == nil {
		out, err := exec.Command(p, "-d", "-i", iso).Output()
		if err != nil {
			t.Errorf("isoinfo %s: %v", iso, err)
		} else if !slices.Contains(strings.Split(string(out), "\n"), "Volume id: "+VolumeLabel) {
			t.Errorf("isoinfo does not report volume id %q:\n%s", VolumeLabel, out)
		}
	}
}

func TestBuildISOReplacesOut(t *testing.T) {
	base := t.TempDir()
	out := filepath.Join(base, "seed.iso")
	for _, id := range []string{"first", "second"} {
		seed := filepath.Join(base, id)
		if err := WriteSeedDir(seed, Config{InstanceID: id}); err != nil {
			t.Fatal(err)
		}
		if err := BuildISO(context.Background(), seed, out); err != nil {
			t.Fatal(err)
		}
	}
	_, files := readISO(t, out)
	if !bytes.Contains(files["meta-data"], []byte(`"second"`)) {
		t.Errorf("meta-data after rebuild = %s, want instance second", files["meta-data"])
	}
}

func TestBuildISOErrors(t *testing.T) {
	base := t.TempDir()
	onlyUser := filepath.Join(base, "only-user")
	if err := os.MkdirAll(onlyUser, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(onlyUser, "user-data"), []byte("#cloud-config\n{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(base, "full")
	if err := WriteSeedDir(full, Config{InstanceID: "x"}); err != nil {
		t.Fatal(err)
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name    string
		ctx     context.Context
		seed    string
		out     string
		wantErr string
		wantIs  error
	}{
		{"missing meta-data", context.Background(), onlyUser, filepath.Join(base, "a.iso"), "read seed meta-data", fs.ErrNotExist},
		{"missing seed dir", context.Background(), filepath.Join(base, "nope"), filepath.Join(base, "b.iso"), "read seed user-data", fs.ErrNotExist},
		{"out dir missing", context.Background(), full, filepath.Join(base, "no", "c.iso"), "cloudinit: iso", fs.ErrNotExist},
		{"canceled", canceled, full, filepath.Join(base, "d.iso"), "cloudinit: iso", context.Canceled},
		{"empty out", context.Background(), full, "", "out path is required", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := BuildISO(tt.ctx, tt.seed, tt.out)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("BuildISO() = %v, want error containing %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("BuildISO() = %v, want errors.Is %v", err, tt.wantIs)
			}
			if tt.out != "" {
				if _, err := os.Stat(tt.out); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("out exists after a failure (stat: %v)", err)
				}
			}
		})
	}
	left, _ := filepath.Glob(filepath.Join(base, ".*"))
	if len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}
