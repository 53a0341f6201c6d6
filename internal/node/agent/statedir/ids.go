package statedir

import "strings"

// MaxTaskIDLen is the longest task id accepted.
const MaxTaskIDLen = 128

// ValidTaskID reports whether id is safe to use as a file name: 1 to 128
// characters from [A-Za-z0-9_-] (so no separators, dots or traversal), and
// not a Windows reserved device name such as CON or COM1.
func ValidTaskID(id string) bool {
	if len(id) == 0 || len(id) > MaxTaskIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return !windowsReserved(id)
}

// ValidNodeID reports whether id is an acceptable node id: 1 to 253
// characters from [A-Za-z0-9._-] starting with a letter or digit, so that
// it is safe in a file, a URL path and a SPIFFE id.
func ValidNodeID(id string) bool {
	if len(id) == 0 || len(id) > 253 || !isAlnum(id[0]) {
		return false
	}
	for i := 1; i < len(id); i++ {
		c := id[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// windowsReserved reports device names that Windows resolves regardless of
// directory or extension ("CON.json" is the console).
func windowsReserved(id string) bool {
	u := strings.ToUpper(id)
	switch u {
	case "CON", "PRN", "AUX", "NUL":
		return true
	}
	if len(u) == 4 && (strings.HasPrefix(u, "COM") || strings.HasPrefix(u, "LPT")) && u[3] >= '0' && u[3] <= '9' {
		return true
	}
	return false
}
