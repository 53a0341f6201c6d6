package docker

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/pattern/patterntest"
)

// TestPatterns: each name rule's compact form accepts exactly what its
// documented, counted form does.
func TestPatterns(t *testing.T) {
	patterntest.Run(t, "digestRE", digestRE, "sha256:", "0f", "Ag")
	patterntest.Run(t, "secretRE", secretRE, "", "aZ09_.-", "/")
}
