package httpapi

import (
	"net/http"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// PrefersMinimal reports whether the request's Prefer headers (RFC 7240)
// carry return=minimal: the client wants no body where the route can
// answer without one. Preference names and this value compare without
// case; a preference's parameters are ignored. It allocates nothing.
func PrefersMinimal(r *http.Request) bool {
	for _, v := range r.Header[api.HeaderPrefer] {
		for v != "" {
			var pref string
			pref, v, _ = strings.Cut(v, ",")
			pref, _, _ = strings.Cut(pref, ";")
			name, val, ok := strings.Cut(pref, "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "return") {
				continue
			}
			val = strings.TrimSpace(val)
			if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
				val = val[1 : len(val)-1]
			}
			if strings.EqualFold(val, "minimal") {
				return true
			}
		}
	}
	return false
}
