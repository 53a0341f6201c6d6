//go:build !unix

package image

import "testing"

// mkfifo skips t: this system has no FIFOs to make.
func mkfifo(t *testing.T, _ string) {
	t.Skip("no FIFOs on this system (the backing-file cases need one)")
}
