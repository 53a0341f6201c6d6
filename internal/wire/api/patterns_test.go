package api

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/pattern/patterntest"
)

// TestPatterns: each name rule's compact form accepts exactly what its
// documented, counted form does.
func TestPatterns(t *testing.T) {
	patterntest.Run(t, "runtimeIDRE", runtimeIDRE, "", "az09_-", "A./")
	patterntest.Run(t, "secretNameRE", secretNameRE, "", "az09_.-", "A/")
	patterntest.Run(t, "volumeNameRE", volumeNameRE, "", "az09_.-", "A/")
}
