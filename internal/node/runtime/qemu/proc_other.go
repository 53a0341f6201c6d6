//go:build !unix

package qemu

// supportedOS is false: the runtime relies on QEMU's -daemonize and on unix
// signals, which this OS lacks; New refuses to build a Runtime.
const supportedOS = false

func processAlive(int, string) bool { return false }

func killProcess(int, string) error { return errUnsupportedOS }

func scanQEMU(string) map[string][]int { return nil }
