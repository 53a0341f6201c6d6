package testutil

import (
	"runtime"
	"time"
)

// SettledGoroutines is the goroutine count once it has not changed for
// 20 ms (at most 2 s): what a test compares a later count with, after the
// goroutines of what it set up (handshakes, answers) have ended.
func SettledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}
