// Package volume keeps named, file-backed volumes for microVMs on a host:
// an ext4 filesystem in a raw file (<name>.ext4, sparse, made with
// mkfs.ext4 on the file: no mount, no root needed) or in a qcow2 image
// (<name>.qcow2, the same filesystem converted with qemu-img), of a size
// in GiB. A volume is created on its first Ensure and then kept across
// instance restarts and recreations; only Delete removes it, and Delete is
// refused while an instance holds it (Attach/Detach record holders). One
// instance holds a volume at a time: Attach refuses a second one while
// the first is live (a Live func says which holders still exist, so a
// holder left by an agent that crashed between a destroy and its Detach
// is dropped instead of blocking the volume forever).
//
// Use:
//
//	m, err := volume.New(volume.Options{Dir: filepath.Join(runtimeDir, "volumes")})
//	v, err := m.Ensure(ctx, "pgdata", 10, volume.FormatRaw) // v.Path: attach as an extra drive
//	err = m.Check(ctx, v)                                     // a filesystem QEMU can be given
//	err = m.Attach("pgdata", instanceID, live)                // when the instance is created
//	err = m.Detach("pgdata", instanceID)                      // when it is destroyed
//	existed, err := m.Delete(ctx, "pgdata", live)             // explicit delete only
//
// Each volume has <name>.json beside its file (format, size, holders),
// replaced atomically. Every failure is a *runtime.Error with reason
// volume_attach_failed (Op "volume", ID the volume name). Names are
// api.ValidVolumeName's (1-63 of [a-z0-9_.-] starting with a letter or
// digit, no ".."): no path tricks.
package volume

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Format is a volume's file format.
type Format string

// Formats; both hold an ext4 filesystem labelled with the volume's name
// (its first 16 characters).
const (
	FormatRaw   Format = "raw"
	FormatQCOW2 Format = "qcow2"
)

// MaxSizeGiB bounds a volume's size; DefaultSizeGiB is the size of one
// created with size 0.
const (
	MaxSizeGiB     = api.MaxVolumeSizeGiB
	DefaultSizeGiB = api.DefaultVolumeSizeGiB
)

// ErrInUse: Delete of a volume a live instance holds, or Attach of one
// another live instance holds (runtime.ErrVolumeInUse).
var ErrInUse = runtime.ErrVolumeInUse

// Live reports whether the instance id still exists (a holder of a volume
// that is not live is dropped). nil counts every holder as live.
type Live func(id string) bool

// Options configure a Manager.
type Options struct {
	Dir      string // required: where volumes live (<runtime dir>/volumes)
	MkfsExt4 string // default "mkfs.ext4"
	QEMUImg  string // default "qemu-img"
}

// Volume describes one volume.
type Volume struct {
	Name      string    `json:"name"`
	Path      string    `json:"-"`
	Format    Format    `json:"format"`
	SizeGiB   int       `json:"size_gib"`
	CreatedAt time.Time `json:"created_at"`
	Holders   []string  `json:"holders,omitempty"` // instance ids
}

// Manager creates, lists and deletes volumes; safe for concurrent use.
type Manager struct {
	opts Options
	mu   sync.Mutex
}

// ValidName reports whether name may name a volume (api.ValidVolumeName).
func ValidName(name string) bool { return api.ValidVolumeName(name) }

func fail(name, format string, args ...any) error {
	return runtime.Errorf(api.ReasonVolumeAttachFailed, "volume", name, format, args...)
}

// New makes the volume directory.
func New(o Options) (*Manager, error) {
	if o.Dir == "" {
		return nil, fail("", "no volume directory")
	}
	if o.MkfsExt4 == "" {
		o.MkfsExt4 = "mkfs.ext4"
	}
	if o.QEMUImg == "" {
		o.QEMUImg = "qemu-img"
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fail("", "volume directory: %w", err)
	}
	return &Manager{opts: o}, nil
}

func (m *Manager) metaPath(name string) string { return filepath.Join(m.opts.Dir, name+".json") }

func (m *Manager) filePath(name string, f Format) string {
	ext := ".ext4"
	if f == FormatQCOW2 {
		ext = ".qcow2"
	}
	return filepath.Join(m.opts.Dir, name+ext)
}

// load reads a volume's metadata; ok is false when it does not exist.
func (m *Manager) load(name string) (Volume, bool, error) {
	b, err := os.ReadFile(m.metaPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return Volume{}, false, nil
	}
	if err != nil {
		return Volume{}, false, err
	}
	var v Volume
	if err := json.Unmarshal(b, &v); err != nil {
		return Volume{}, false, fmt.Errorf("%s: %w", m.metaPath(name), err)
	}
	v.Path = m.filePath(name, v.Format)
	return v, true, nil
}

func (m *Manager) save(v Volume) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(m.metaPath(v.Name), append(b, '\n'), 0o600)
}

// Ensure returns the volume name, creating it with sizeGiB (0:
// DefaultSizeGiB) and format (empty: raw) on first use. An existing volume
// is kept as it is: size 0 and format "" take whatever it has; asking for
// another format or a larger size than it has is an error (volumes are not
// converted or grown).
func (m *Manager) Ensure(ctx context.Context, name string, sizeGiB int, format Format) (Volume, error) {
	if !ValidName(name) {
		return Volume{}, fail(name, "invalid volume name %q: 1-63 of [a-z0-9_.-], starting with a letter or digit", name)
	}
	if format != "" && format != FormatRaw && format != FormatQCOW2 {
		return Volume{}, fail(name, "format %q: want raw or qcow2", format)
	}
	if sizeGiB < 0 || sizeGiB > MaxSizeGiB {
		return Volume{}, fail(name, "size %d GiB: want 1-%d (0: %d, or the existing volume's)", sizeGiB, MaxSizeGiB, DefaultSizeGiB)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok, err := m.load(name)
	if err != nil {
		return Volume{}, fail(name, "read metadata: %w", err)
	}
	if ok {
		if format != "" && v.Format != format {
			return Volume{}, fail(name, "exists as %s, asked for %s (volumes are not converted)", v.Format, format)
		}
		if sizeGiB > v.SizeGiB {
			return Volume{}, fail(name, "exists with %d GiB, asked for %d (volumes are not grown)", v.SizeGiB, sizeGiB)
		}
		if _, err := os.Stat(v.Path); err != nil {
			return Volume{}, fail(name, "volume file: %w", err)
		}
		return v, nil
	}
	if format == "" {
		format = FormatRaw
	}
	if sizeGiB == 0 {
		sizeGiB = DefaultSizeGiB
	}
	v = Volume{Name: name, Format: format, SizeGiB: sizeGiB, CreatedAt: time.Now().UTC(), Path: m.filePath(name, format)}
	if err := m.create(ctx, v); err != nil {
		return Volume{}, fail(name, "create: %w", err)
	}
	if err := m.save(v); err != nil {
		_ = os.Remove(v.Path)
		return Volume{}, fail(name, "write metadata: %w", err)
	}
	return v, nil
}

// create writes v's file: a sparse raw file formatted ext4, converted to
// qcow2 when asked; a temporary name until done.
func (m *Manager) create(ctx context.Context, v Volume) error {
	raw := filepath.Join(m.opts.Dir, "."+v.Name+".raw.tmp")
	defer os.Remove(raw)
	f, err := os.OpenFile(raw, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(v.SizeGiB) << 30)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	label := v.Name
	if len(label) > 16 {
		label = label[:16]
	}
	if err := run(ctx, m.opts.MkfsExt4, "-q", "-F", "-L", label, "-E", "lazy_itable_init=1,lazy_journal_init=1", raw); err != nil {
		return err
	}
	if v.Format == FormatRaw {
		return os.Rename(raw, v.Path)
	}
	tmp := filepath.Join(m.opts.Dir, "."+v.Name+".qcow2.tmp")
	defer os.Remove(tmp)
	if err := run(ctx, m.opts.QEMUImg, "convert", "-q", "-f", "raw", "-O", "qcow2", raw, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, v.Path)
}

func run(ctx context.Context, bin string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Get returns a volume; ok is false when it does not exist.
func (m *Manager) Get(name string) (Volume, bool, error) {
	if !ValidName(name) {
		return Volume{}, false, fail(name, "invalid volume name %q", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok, err := m.load(name)
	if err != nil {
		return Volume{}, false, fail(name, "read metadata: %w", err)
	}
	return v, ok, nil
}

// List returns every volume by name.
func (m *Manager) List() ([]Volume, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ents, err := os.ReadDir(m.opts.Dir)
	if err != nil {
		return nil, fail("", "list: %w", err)
	}
	var out []Volume
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !ValidName(name) {
			continue
		}
		v, ok, err := m.load(name)
		if err != nil {
			return nil, fail(name, "read metadata: %w", err)
		}
		if ok {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Attach records that instance id holds the volume (it must exist). A
// volume holds one instance at a time: another holder that is live is
// refused (ErrInUse, naming it); one that is not is dropped. Attaching
// again is a no-op.
func (m *Manager) Attach(name, id string, live Live) error {
	var held []string
	err := m.update(name, func(v *Volume) bool {
		n := len(v.Holders)
		v.Holders = slices.DeleteFunc(v.Holders, func(h string) bool { return h != id && live != nil && !live(h) })
		changed := len(v.Holders) != n
		for _, h := range v.Holders {
			if h != id {
				held = append(held, h)
			}
		}
		if len(held) == 0 && !slices.Contains(v.Holders, id) {
			v.Holders, changed = append(v.Holders, id), true
		}
		return changed
	})
	if err == nil && len(held) > 0 {
		return fail(name, "%w: held by instance %s (one instance at a time)", ErrInUse, strings.Join(held, ", "))
	}
	return err
}

// Detach records that instance id no longer holds the volume; a missing
// volume or holder is fine.
func (m *Manager) Detach(name, id string) error {
	err := m.update(name, func(v *Volume) bool {
		n := len(v.Holders)
		v.Holders = slices.DeleteFunc(v.Holders, func(h string) bool { return h == id })
		return len(v.Holders) != n
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// update applies fn to the volume's metadata and saves it when fn reports
// a change.
func (m *Manager) update(name string, fn func(*Volume) bool) error {
	if !ValidName(name) {
		return fail(name, "invalid volume name %q", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok, err := m.load(name)
	if err != nil {
		return fail(name, "read metadata: %w", err)
	}
	if !ok {
		return fail(name, "no such volume: %w", os.ErrNotExist)
	}
	if !fn(&v) {
		return nil
	}
	sort.Strings(v.Holders)
	if err := m.save(v); err != nil {
		return fail(name, "write metadata: %w", err)
	}
	return nil
}

// Reconcile drops holders that are not live instances (an agent that
// crashed between a destroy and its Detach) and temporary files of
// interrupted creations.
func (m *Manager) Reconcile(live []string) error {
	vols, err := m.List()
	if err != nil {
		return err
	}
	for _, v := range vols {
		for _, h := range v.Holders {
			if !slices.Contains(live, h) {
				if err := m.Detach(v.Name, h); err != nil {
					return err
				}
			}
		}
	}
	tmps, _ := filepath.Glob(filepath.Join(m.opts.Dir, ".*.tmp"))
	for _, t := range tmps {
		_ = os.Remove(t)
	}
	return nil
}

// Delete removes a volume and its data; existed is false when there was
// none (not an error). It is refused (ErrInUse, naming the holders) while
// a live instance holds it; holders that are not live are dropped first.
func (m *Manager) Delete(ctx context.Context, name string, live Live) (existed bool, err error) {
	_ = ctx // removing two files does not block
	if !ValidName(name) {
		return false, fail(name, "invalid volume name %q", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok, err := m.load(name)
	if err != nil {
		return false, fail(name, "read metadata: %w", err)
	}
	if !ok {
		return false, nil
	}
	held := slices.DeleteFunc(slices.Clone(v.Holders), func(h string) bool { return live != nil && !live(h) })
	if len(held) > 0 {
		return true, fail(name, "%w: held by instance %s (destroy it first)", ErrInUse, strings.Join(held, ", "))
	}
	// The metadata goes first: a crash in between leaves a file no
	// metadata names (List skips it, a new Ensure writes over it), never
	// metadata naming a file that is gone.
	if err := os.Remove(m.metaPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, fail(name, "delete: %w", err)
	}
	if err := os.Remove(v.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, fail(name, "delete: %w", err)
	}
	return true, nil
}

// ext4Magic is an ext2/3/4 superblock's s_magic, little-endian at byte
// 1024+56 of the filesystem.
const ext4MagicOffset, ext4Magic = 1024 + 56, 0xEF53

// Check says whether v's file is what QEMU may be given and the guest can
// mount: a raw volume must be a regular file of its size at least that
// starts with an ext4 superblock; a qcow2 one must pass image.Inspect as
// qcow2 (no backing or data file naming other host files).
func (m *Manager) Check(ctx context.Context, v Volume) error {
	fi, err := os.Lstat(v.Path)
	if err != nil {
		return fail(v.Name, "volume file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fail(v.Name, "volume file %s is not a regular file", v.Path)
	}
	if v.Format == FormatQCOW2 {
		if _, err := image.Inspect(ctx, m.opts.QEMUImg, v.Path, image.FormatQCOW2); err != nil {
			return fail(v.Name, "not a usable qcow2 image: %w", err)
		}
		return nil
	}
	f, err := os.Open(v.Path)
	if err != nil {
		return fail(v.Name, "volume file: %w", err)
	}
	defer func() { _ = f.Close() }()
	var b [2]byte
	if _, err := f.ReadAt(b[:], ext4MagicOffset); err != nil || int(b[0])|int(b[1])<<8 != ext4Magic {
		return fail(v.Name, "volume file %s holds no ext4 filesystem (no superblock magic)", v.Path)
	}
	return nil
}
