package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	goruntime "runtime"
	"slices"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/drover-dev/drover/internal/node/image"
)

// ImageConfig is what a guest init needs of an image's config. It is
// written as JSON beside the root filesystem (ConfigPath).
type ImageConfig struct {
	Entrypoint   []string `json:"entrypoint,omitempty"`
	Cmd          []string `json:"cmd,omitempty"`
	Env          []string `json:"env,omitempty"`
	User         string   `json:"user,omitempty"`
	WorkingDir   string   `json:"working_dir,omitempty"`
	ExposedPorts []string `json:"exposed_ports,omitempty"` // "8080/tcp", sorted
	StopSignal   string   `json:"stop_signal,omitempty"`
}

// Layer is one layer blob of an image, bottom first in Image.Layers.
type Layer struct {
	Digest    string `json:"digest"` // sha256:… of the blob as served
	Size      int64  `json:"size"`
	MediaType string `json:"media_type"`
}

// Image is a pulled image.
type Image struct {
	Ref      string      // the reference it was pulled by
	Digest   string      // manifest digest (of this platform's manifest)
	Resolved string      // what Ref resolved to: Digest, or an index's digest
	Config   ImageConfig // from the image's config blob
	Layers   []Layer
	Cached   bool // no layer was downloaded
}

func (r *record) image(cached bool) *Image {
	return &Image{Ref: r.Ref, Digest: r.Digest, Resolved: r.Resolved, Config: r.Config,
		Layers: slices.Clone(r.Layers), Cached: cached}
}

// Pull returns the image ref names, downloading the layers the cache does
// not hold. digest (sha256:<hex>, optional) pins it: a reference that
// resolves to another digest (manifest or index) fails with
// ErrDigestMismatch, and a pinned image already cached is returned
// without asking the registry. auth is the registry secret's bytes
// (ParseAuth; nil: anonymous). progress (may be nil) sees each layer's
// bytes in phase "pull". Every failure is a *runtime.Error with reason
// image_pull_failed whose message keeps the registry's own.
func (s *Store) Pull(ctx context.Context, ref, digest string, auth []byte, progress ProgressFunc) (*Image, error) {
	start := time.Now()
	if progress == nil {
		progress = func(Progress) {}
	}
	pin := ""
	if digest != "" {
		d, err := normDigest(digest)
		if err != nil {
			return nil, pullError(ref, err)
		}
		pin = d
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, pullError(ref, fmt.Errorf("reference: %w", err))
	}
	if d, ok := r.(name.Digest); ok {
		if pin != "" && d.DigestStr() != pin {
			return nil, pullError(ref, fmt.Errorf("%w: the reference names %s, pinned %s", ErrDigestMismatch, d.DigestStr(), pin))
		}
		pin = d.DigestStr()
	}
	if pin != "" {
		if img := s.cachedImage(pin, ref, progress); img != nil {
			return img, nil
		}
	}
	reg := r.Context().Registry.RegistryStr()
	if !s.allowLocal {
		host := reg
		if h, _, err := net.SplitHostPort(reg); err == nil {
			host = h
		}
		if err := image.CheckHost(ctx, host); err != nil {
			return nil, pullError(ref, fmt.Errorf("registry %s: %w", reg, err))
		}
	}
	a, err := ParseAuth(auth, reg)
	if err != nil {
		return nil, pullError(ref, err)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(a), remote.WithTransport(s.client.Transport),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}), remote.WithUserAgent("drover-agent")}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, pullError(ref, registryError(ctx, reg, err))
	}
	img, err := desc.Image()
	if err != nil {
		return nil, pullError(ref, registryError(ctx, reg, err))
	}
	md, err := img.Digest()
	if err != nil {
		return nil, pullError(ref, registryError(ctx, reg, err))
	}
	manifest, resolved := md.String(), desc.Digest.String()
	if pin != "" && pin != manifest && pin != resolved {
		return nil, pullError(ref, fmt.Errorf("%w: %s resolves to %s, pinned %s", ErrDigestMismatch, ref, resolved, pin))
	}

	unlock, err := s.locks.lock(ctx, manifest)
	if err != nil {
		return nil, pullError(ref, err)
	}
	defer unlock()
	if img := s.cachedImage(manifest, ref, progress); img != nil {
		return img, nil
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, pullError(ref, registryError(ctx, reg, err))
	}
	if cf.OS != "" && cf.OS != "linux" {
		return nil, pullError(ref, fmt.Errorf("image is for %s/%s, not linux", cf.OS, cf.Architecture))
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, pullError(ref, registryError(ctx, reg, err))
	}
	rec := &record{Ref: ref, Digest: manifest, Resolved: resolved, Config: imageConfig(cf.Config)}
	held := []string{manifest}
	for _, l := range layers {
		info, err := layerInfo(l)
		if err != nil {
			return nil, pullError(ref, registryError(ctx, reg, err))
		}
		rec.Layers = append(rec.Layers, info)
		held = append(held, info.Digest)
	}
	defer s.hold(held...)()
	var fetched int64
	for i, l := range layers {
		n, err := s.fetchLayer(ctx, ref, l, rec.Layers[i], progress)
		if err != nil {
			return nil, pullError(ref, registryError(ctx, reg, fmt.Errorf("layer %s: %w", rec.Layers[i].Digest, err)))
		}
		fetched += n
	}
	s.mu.Lock()
	rec.LastUsed = s.now().UTC()
	s.idx.Images[manifest] = rec
	err = s.saveLocked()
	if err == nil {
		_, err = s.pruneLocked()
	}
	s.mu.Unlock()
	if err != nil {
		return nil, pullError(ref, err)
	}
	s.log.Info("oci image pulled", "image", ref, "digest", manifest, "layers", len(rec.Layers),
		"downloaded_bytes", fetched, "duration", time.Since(start).Round(time.Millisecond))
	return rec.image(fetched == 0), nil
}

// cachedImage returns the cached image whose manifest (or resolved index)
// digest is d, with every blob present, marking it used; nil when there
// is none.
func (s *Store) cachedImage(d, ref string, progress ProgressFunc) *Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rec *record
	for _, r := range s.idx.Images {
		if r.Digest == d || r.Resolved == d {
			rec = r
			break
		}
	}
	if rec == nil {
		return nil
	}
	for _, l := range rec.Layers {
		if fi, err := os.Stat(s.blobPath(l.Digest)); err != nil || fi.Size() != l.Size {
			return nil
		}
	}
	rec.LastUsed = s.now().UTC()
	if err := s.saveLocked(); err != nil {
		s.log.Warn("oci: record last use", "err", err)
	}
	for _, l := range rec.Layers {
		progress(Progress{Phase: PhasePull, Image: ref, Layer: l.Digest, Bytes: l.Size, Total: l.Size, Done: true, Cached: true})
	}
	img := rec.image(true)
	img.Ref = ref
	return img
}

func layerInfo(l v1.Layer) (Layer, error) {
	d, err := l.Digest()
	if err != nil {
		return Layer{}, err
	}
	size, err := l.Size()
	if err != nil {
		return Layer{}, err
	}
	mt, err := l.MediaType()
	if err != nil {
		return Layer{}, err
	}
	if d.Algorithm != "sha256" {
		return Layer{}, fmt.Errorf("layer %s: only sha256 digests are supported", d)
	}
	return Layer{Digest: d.String(), Size: size, MediaType: string(mt)}, nil
}

func imageConfig(c v1.Config) ImageConfig {
	ic := ImageConfig{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, User: c.User,
		WorkingDir: c.WorkingDir, StopSignal: c.StopSignal}
	for p := range c.ExposedPorts {
		ic.ExposedPorts = append(ic.ExposedPorts, p)
	}
	sort.Strings(ic.ExposedPorts)
	return ic
}

// fetchLayer stores l's blob unless cached, verifying its sha256 while it
// streams into tmp; it returns the bytes downloaded.
func (s *Store) fetchLayer(ctx context.Context, ref string, l v1.Layer, info Layer, progress ProgressFunc) (n int64, err error) {
	p := s.blobPath(info.Digest)
	if fi, err := os.Stat(p); err == nil && fi.Size() == info.Size {
		progress(Progress{Phase: PhasePull, Image: ref, Layer: info.Digest, Bytes: info.Size, Total: info.Size, Done: true, Cached: true})
		return 0, nil
	}
	rc, err := l.Compressed()
	if err != nil {
		return 0, err
	}
	defer func() { _ = rc.Close() }()
	hexd := info.Digest[len("sha256:"):]
	tmp, err := os.CreateTemp(s.tmpDir, hexd+"-*.part")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	pw := &progressWriter{report: func(b int64, done bool) {
		progress(Progress{Phase: PhasePull, Image: ref, Layer: info.Digest, Bytes: b, Total: info.Size, Done: done})
	}}
	n, err = io.Copy(io.MultiWriter(tmp, h, pw), ctxReader{ctx: ctx, r: rc})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return n, err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != info.Digest {
		return n, fmt.Errorf("%w: blob hashes to %s", ErrDigestMismatch, got)
	}
	if err = tmp.Chmod(0o440); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		return n, fmt.Errorf("store: %w", err)
	}
	pw.report(n, true)
	return n, nil
}

// progressWriter reports the bytes written at most every 256 KiB or
// 200 ms.
type progressWriter struct {
	n, last int64
	at      time.Time
	report  func(bytes int64, done bool)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if p.n-p.last >= 256<<10 || time.Since(p.at) >= 200*time.Millisecond {
		p.last, p.at = p.n, time.Now()
		p.report(p.n, false)
	}
	return len(b), nil
}

// ctxReader stops reading once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// registryError names the registry and prefers ctx's error over the
// transport's wrapping of it.
func registryError(ctx context.Context, reg string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("registry %s: %w (%w)", reg, cerr, err)
	}
	return fmt.Errorf("registry %s: %w", reg, err)
}
