// Package integration holds Drover's end-to-end tests: the real control
// plane over real TLS on loopback (in-process replicas and `drover server`
// child processes), real agents, and both store adapters, SQLite and a
// throw-away PostgreSQL started by the tests. It has no non-test code.
package integration
