// Package chaos holds the automated chaos matrix (chaos_test.go,
// TestChaosMatrix): it builds the real drover and drover-agent binaries,
// runs a real control plane and a real agent on loopback with the agent's
// control plane and terminal URLs going through a test-controlled TCP fault
// proxy, injects one fault per scenario, checks that `drover preflight
// --json` names the expected hop and signal and that the evidence bundle
// carries the report's correlation id, then repairs the fault and checks
// that preflight passes again without store edits. The package has no
// non-test code; docs/runbooks/chaos.md explains each injection and holds
// one run's table (scripts/chaos prints it).
package chaos
