package osuser

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/pattern/patterntest"
)

// TestPatterns: each name rule's compact form accepts exactly what its
// documented, counted form does.
func TestPatterns(t *testing.T) {
	patterntest.Run(t, "usernameRE", usernameRE, "", "az09_-", "A.")
}
