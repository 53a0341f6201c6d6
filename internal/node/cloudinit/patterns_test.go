package cloudinit

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/pattern/patterntest"
)

// TestPatterns: each name rule's compact form accepts exactly what its
// documented, counted form does.
func TestPatterns(t *testing.T) {
	patterntest.Run(t, "instanceIDRE", instanceIDRE, "", "aZ09._-", "/")
	patterntest.Run(t, "userRE", userRE, "", "az09_-", "A.")
	patterntest.Run(t, "hostLabelRE", hostLabelRE, "", "aZ09-", "_.")
}
