package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/server"
)

// credentialName is the systemd credential (LoadCredential=drover-kek:...)
// read when neither --kek-file nor DROVER_KEK_FILE is given.
const credentialName = "drover-kek"

// KEKFlags select the key-encryption key of the private keys at rest.
type KEKFlags struct {
	KEKFile               string   `name:"kek-file" env:"DROVER_KEK_FILE" help:"Key-encryption key for the CA and task-signing private keys in the store: 32 raw bytes, 64 hex digits or base64 (default: the systemd credential drover-kek, $CREDENTIALS_DIRECTORY/drover-kek). Plaintext keys found in the store are encrypted with it on start."`
	PreviousKEKFiles      []string `name:"previous-kek-file" env:"DROVER_PREVIOUS_KEK_FILES" help:"Older key-encryption keys (repeatable): keys sealed with them are opened and re-encrypted with --kek-file on start (KEK rotation)."`
	InsecurePlaintextKeys bool     `name:"insecure-plaintext-keys" help:"Run without a key-encryption key: private keys stay in plaintext in the store (anyone who reads the database can impersonate the control plane)."`
}

// ring loads the configured KEKs; nil (and no error) only with
// --insecure-plaintext-keys and no KEK. log may be nil.
func (f KEKFlags) ring(log *slog.Logger) (*kek.Ring, error) {
	path := f.KEKFile
	if path == "" {
		if dir := os.Getenv("CREDENTIALS_DIRECTORY"); dir != "" {
			if p := filepath.Join(dir, credentialName); fileExists(p) {
				path = p
			}
		}
	}
	if path == "" {
		if len(f.PreviousKEKFiles) > 0 {
			return nil, errors.New("--previous-kek-file needs --kek-file (the key to re-encrypt with)")
		}
		if f.InsecurePlaintextKeys {
			return nil, nil
		}
		return nil, server.ErrNoKEK
	}
	if f.InsecurePlaintextKeys {
		return nil, errors.New("--insecure-plaintext-keys contradicts --kek-file (or DROVER_KEK_FILE, or the drover-kek credential)")
	}
	primary, err := loadKEK(path, "--kek-file", log)
	if err != nil {
		return nil, err
	}
	var previous []*kek.Key
	for _, p := range f.PreviousKEKFiles {
		k, err := loadKEK(p, "--previous-kek-file", log)
		if err != nil {
			return nil, err
		}
		previous = append(previous, k)
	}
	return kek.NewRing(primary, previous...), nil
}

// loadKEK reads one KEK file and warns when others may read it.
func loadKEK(path, flag string, log *slog.Logger) (*kek.Key, error) {
	k, insecure, err := kek.LoadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if insecure && log != nil {
		log.Warn("key-encryption key file is readable by group or others; chmod 600 it", "path", path, "flag", flag)
	}
	return k, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// KeysRotateKEKCmd re-encrypts the private keys in a store with a new KEK.
type KeysRotateKEKCmd struct {
	Store      string `name:"store" env:"DROVER_STORE" required:"" help:"sqlite:PATH or postgres://..."`
	OldKEKFile string `name:"old-kek-file" required:"" help:"The key-encryption key the store's keys are sealed with now."`
	NewKEKFile string `name:"new-kek-file" required:"" help:"The key-encryption key to seal them with (give it to every replica as --kek-file)."`
}

// Run implements the command.
func (c *KeysRotateKEKCmd) Run(ctx context.Context, env *Env) error {
	log := slog.New(slog.NewTextHandler(env.Stderr, nil))
	oldKey, err := loadKEK(c.OldKEKFile, "--old-kek-file", log)
	if err != nil {
		return err
	}
	newKey, err := loadKEK(c.NewKEKFile, "--new-kek-file", log)
	if err != nil {
		return err
	}
	if oldKey.ID() == newKey.ID() {
		return errors.New("--old-kek-file and --new-kek-file hold the same key")
	}
	st, err := openStore(ctx, c.Store, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	n, err := server.SealAtRest(ctx, st, kek.NewRing(newKey, oldKey), log)
	if err != nil {
		return fmt.Errorf("rotate key-encryption key (%d keys re-encrypted before the error; run it again): %w", n, err)
	}
	fmt.Fprintf(env.Stdout, "%d private keys re-encrypted with key-encryption key %s (was %s)\n", n, newKey.ID(), oldKey.ID())
	return nil
}
