package oci

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// ParseAuth reads the credentials for registry (host[:port], as in the
// image reference) from a secret's bytes, in one of three forms:
//
//   - a Docker config.json: {"auths": {"<registry>": {"auth": base64("user:password")}}}
//     (or "username"/"password", or "identitytoken"); keys may carry a
//     scheme and path (https://index.docker.io/v1/);
//   - {"username": "…", "password": "…"} (the container runtime's
//     registry_auth);
//   - user:password on one line.
//
// An empty secret means anonymous pulls. A config.json without an entry
// for registry is an error (naming the registries it has, never their
// credentials), as is anything else.
func ParseAuth(secret []byte, registry string) (authn.Authenticator, error) {
	secret = bytes.TrimSpace(secret)
	if len(secret) == 0 {
		return authn.Anonymous, nil
	}
	if secret[0] != '{' {
		user, pass, ok := strings.Cut(string(secret), ":")
		if !ok || user == "" || strings.ContainsAny(string(secret), "\n\r") {
			return nil, errors.New("registry auth: want a Docker config.json, a {\"username\",\"password\"} object or user:password on one line")
		}
		return authn.FromConfig(authn.AuthConfig{Username: user, Password: pass}), nil
	}
	// json's and AuthConfig's messages quote no input, only offsets and
	// types, so they are safe to return.
	var doc struct {
		Auths map[string]authn.AuthConfig `json:"auths"`
	}
	if err := json.Unmarshal(secret, &doc); err != nil {
		return nil, fmt.Errorf("registry auth: not valid JSON: %w", err)
	}
	if doc.Auths == nil {
		var c authn.AuthConfig
		if err := json.Unmarshal(secret, &c); err != nil {
			return nil, fmt.Errorf("registry auth: %w", err)
		}
		if c.Username == "" && c.IdentityToken == "" && c.RegistryToken == "" {
			return nil, errors.New("registry auth: a JSON secret needs \"auths\" (Docker config.json) or \"username\" and \"password\"")
		}
		return authn.FromConfig(c), nil
	}
	want := canonicalRegistry(registry)
	var have []string
	for k, c := range doc.Auths {
		if canonicalRegistry(k) == want {
			return authn.FromConfig(c), nil
		}
		have = append(have, k)
	}
	return nil, fmt.Errorf("registry auth: the config.json has no entry for %s (it has %s)", registry, strings.Join(have, ", "))
}

// canonicalRegistry reduces a config.json key or a registry name to a
// host[:port]; Docker Hub's names are all "index.docker.io".
func canonicalRegistry(s string) string {
	s = strings.ToLower(s)
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	s, _, _ = strings.Cut(s, "/")
	switch s {
	case "docker.io", "registry-1.docker.io", "index.docker.io":
		return "index.docker.io"
	}
	return s
}
