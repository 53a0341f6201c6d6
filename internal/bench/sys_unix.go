//go:build unix

package bench

import "syscall"

// raiseNoFile lifts RLIMIT_NOFILE towards want (the hard limit too, which
// needs privilege; failing that, up to the current hard limit) and returns
// the soft limit in force afterwards.
func raiseNoFile(want uint64) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	if lim.Cur >= want {
		return uint64(lim.Cur)
	}
	if lim.Max < want {
		raised := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			return want
		}
	}
	lim.Cur = min(want, lim.Max)
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return uint64(lim.Cur)
}

// selfCPU is this process's user+system CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
