package cloudinit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// VolumeLabel is the ISO9660 volume identifier NoCloud looks for.
const VolumeLabel = "cidata"

// isoBlock is the ISO9660 logical block size.
const isoBlock = 2048

// seedFiles are the files BuildISO copies, and whether each is required.
var seedFiles = []struct {
	name     string
	required bool
}{
	{"user-data", true},
	{"meta-data", true},
	{"network-config", false},
}

// BuildISO packs seedDir's user-data and meta-data (and network-config if
// present) into an ISO9660 image with Rock Ridge and Joliet names and the
// volume label "cidata", written to out atomically (a 0600 temporary file
// beside out, renamed over it).
func BuildISO(ctx context.Context, seedDir, out string) (err error) {
	if out == "" {
		return errors.New("cloudinit: iso: out path is required")
	}
	contents := make(map[string][]byte, len(seedFiles))
	for _, f := range seedFiles {
		b, err := os.ReadFile(filepath.Join(seedDir, f.name))
		if errors.Is(err, fs.ErrNotExist) && !f.required {
			continue
		}
		if err != nil {
			return fmt.Errorf("cloudinit: iso: read seed %s: %w", f.name, err)
		}
		contents[f.name] = b
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cloudinit: iso: %w", err)
	}

	dir := filepath.Dir(out)
	work, err := os.MkdirTemp(dir, ".cidata-work-*")
	if err != nil {
		return fmt.Errorf("cloudinit: iso: workspace: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(out)+".*.tmp")
	if err != nil {
		return fmt.Errorf("cloudinit: iso: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()

	if err = packISO(ctx, contents, tmp, work); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("cloudinit: iso: sync: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("cloudinit: iso: close: %w", err)
	}
	if err = os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("cloudinit: iso: %w", err)
	}
	return nil
}

// WriteISO validates c and packs its user-data and meta-data into f, an
// empty writable file (a memfd: the seed never touches a disk), as BuildISO
// does. workspace is the directory the ISO library stages the files in
// while it packs them (a private directory on a tmpfs when the seed holds
// secrets); it is left empty.
func WriteISO(ctx context.Context, c Config, f *os.File, workspace string) error {
	ud, err := c.UserData()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp(workspace, ".cidata-work-*")
	if err != nil {
		return fmt.Errorf("cloudinit: iso: workspace: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	return packISO(ctx, map[string][]byte{"user-data": ud, "meta-data": c.MetaData()}, f, work)
}

// packISO writes the ISO9660 image of contents into f, staging the files
// in work.
func packISO(ctx context.Context, contents map[string][]byte, f *os.File, work string) error {
	var total int64
	for _, b := range contents {
		total += int64(len(b))
	}
	// Room for the system area, descriptors, path tables and directories,
	// plus every file rounded up to a block; trimmed after Finalize.
	size := int64(1<<20) + total + int64(len(contents))*isoBlock
	size = (size + isoBlock - 1) / isoBlock * isoBlock
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("cloudinit: iso: size image: %w", err)
	}
	isofs, err := iso9660.Create(file.New(f, false), size, 0, isoBlock, work)
	if err != nil {
		return fmt.Errorf("cloudinit: iso: create filesystem: %w", err)
	}
	for _, sf := range seedFiles {
		b, ok := contents[sf.name]
		if !ok {
			continue
		}
		if err := writeISOFile(isofs, sf.name, b); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cloudinit: iso: %w", err)
	}
	err = isofs.Finalize(iso9660.FinalizeOptions{
		RockRidge:        true,
		Joliet:           true,
		VolumeIdentifier: VolumeLabel,
	})
	if err != nil {
		return fmt.Errorf("cloudinit: iso: finalize: %w", err)
	}
	if err := fixPVD(f, size); err != nil {
		return fmt.Errorf("cloudinit: iso: %w", err)
	}
	return nil
}

func writeISOFile(isofs *iso9660.FileSystem, name string, b []byte) error {
	w, err := isofs.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
	if err != nil {
		return fmt.Errorf("cloudinit: iso: add %s: %w", name, err)
	}
	if _, err := w.Write(b); err != nil {
		_ = w.Close()
		return fmt.Errorf("cloudinit: iso: add %s: %w", name, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("cloudinit: iso: add %s: %w", name, err)
	}
	return nil
}

// fixPVD pads the primary volume descriptor's system and volume
// identifiers with spaces as ISO9660 requires (go-diskfs leaves NULs, which
// strict readers show as part of the label) and truncates the image to the
// volume space size the descriptor records, so no padding is left.
func fixPVD(f *os.File, size int64) error {
	pvd := make([]byte, 132)
	if _, err := f.ReadAt(pvd, 16*isoBlock); err != nil {
		return fmt.Errorf("read primary volume descriptor: %w", err)
	}
	if pvd[0] != 1 || string(pvd[1:6]) != "CD001" {
		return errors.New("no primary volume descriptor at block 16")
	}
	ids := pvd[8:72] // system identifier [8:40], volume identifier [40:72]
	for i, c := range ids {
		if c == 0 {
			ids[i] = ' '
		}
	}
	if _, err := f.WriteAt(ids, 16*isoBlock+8); err != nil {
		return fmt.Errorf("write primary volume descriptor: %w", err)
	}
	vol := int64(binary.LittleEndian.Uint32(pvd[80:84])) * int64(binary.LittleEndian.Uint16(pvd[128:130]))
	if vol <= 0 || vol > size {
		return fmt.Errorf("volume size %d bytes is outside the image (%d bytes)", vol, size)
	}
	return f.Truncate(vol)
}
