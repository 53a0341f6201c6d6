package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/drover-dev/drover/internal/node/cloudinit"
	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// A seed that holds secrets (a VM's cloud-init ISO, a microVM's config
// drive) lives, on Linux, only in the agent's memory: a sealed memfd that
// QEMU inherits as fd memSeedFD, put in fd set memSeedSet by -add-fd and
// opened as /dev/fdset/<set> (it works with -daemonize: the daemon keeps
// the inherited fd). persisted.SeedInMemory says so; persisted.Seed is
// then empty. The memfd outlives a stop or crash (a restart reuses it) but
// not the agent: after an agent restart, Start answers ErrSecretsNeeded
// until Create with the same spec and secrets builds it again.
const (
	memSeedFD  = 3
	memSeedSet = 1
)

// seedArgs are the -add-fd arguments that put an in-memory seed in its fd
// set, and the drive's file: the fd set, or the seed file.
func seedArgs(l Launch) (addFD []string, file string) {
	if !l.SeedFD {
		return nil, qemuValue(l.Seed)
	}
	return []string{"-add-fd", "fd=" + strconv.Itoa(memSeedFD) + ",set=" + strconv.Itoa(memSeedSet)},
		"/dev/fdset/" + strconv.Itoa(memSeedSet)
}

// memSeedBytes is a sealed memfd holding b.
func memSeedBytes(id string, b []byte) (_ *os.File, err error) {
	f, err := newMemFile(id)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
		}
	}()
	if _, err = f.Write(b); err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	if err = sealMemFile(f); err != nil {
		return nil, err
	}
	return f, nil
}

// memSeedISO is a sealed memfd holding cfg's NoCloud ISO; the ISO library
// stages the files on a tmpfs, never on a disk.
func memSeedISO(ctx context.Context, id string, cfg cloudinit.Config) (_ *os.File, err error) {
	work, remove, err := tmpfsWorkspace()
	if err != nil {
		return nil, err
	}
	defer remove()
	f, err := newMemFile(id)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
		}
	}()
	if err = cloudinit.WriteISO(ctx, cfg, f, work); err != nil {
		return nil, err
	}
	if err = sealMemFile(f); err != nil {
		return nil, err
	}
	return f, nil
}

// secretSeed builds in's seed with spec's secrets in memory: a microVM's
// config drive from the secretless copy Create left in its directory, a
// VM's cloud-init ISO from its spec.
func secretSeed(ctx context.Context, in *instance, spec runtime.Spec) (*os.File, error) {
	if !spec.VMOrZero().MicroVM {
		return memSeedISO(ctx, spec.ID, seedConfig(spec))
	}
	b, err := os.ReadFile(in.path(configDriveName))
	if err != nil {
		return nil, err
	}
	cfg, err := guestinit.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	cfg.Secrets = spec.Secrets
	drive, err := guestinit.EncodeConfig(cfg)
	if err != nil {
		return nil, err
	}
	return memSeedBytes(spec.ID, drive)
}

// resupplySeed builds again the in-memory seed of an instance whose seed
// went with an earlier agent (Create with the same spec and secrets); the
// id lock is held.
func (r *Runtime) resupplySeed(ctx context.Context, in *instance, spec runtime.Spec) error {
	in.mu.Lock()
	need := in.st.SeedInMemory && in.seed == nil
	in.mu.Unlock()
	if !need {
		return nil
	}
	f, err := secretSeed(ctx, in, spec)
	if err != nil {
		return runtime.Errorf(api.ReasonSecretsInjectionFailed, "create", spec.ID, "seed: %w", err)
	}
	in.mu.Lock()
	in.seed = f
	in.mu.Unlock()
	r.log.Info("instance seed rebuilt in memory", "id", spec.ID)
	return nil
}

// closeSeed drops in's in-memory seed.
func (in *instance) closeSeed() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.seed != nil {
		_ = in.seed.Close()
		in.seed = nil
	}
}
