package task

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/pattern/patterntest"
)

// TestPatterns: each name rule's compact form accepts exactly what its
// documented, counted form does.
func TestPatterns(t *testing.T) {
	patterntest.Run(t, "tokenRE", tokenRE, "", "aZ09._:-", "/ ")
	patterntest.Run(t, "usernameRE", usernameRE, "", "az09_-", "A.")
	patterntest.Run(t, "sha256RE", sha256RE, "", "0fAF", "g")
	patterntest.Run(t, "imageDigestRE", imageDigestRE, "sha256:", "0f", "Ag")
}
