package exepages

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// mapping is one entry of /proc/<pid>/smaps, reduced to what Trim decides
// on.
type mapping struct {
	start, end   uint64
	perms        string // e.g. "r-xp"
	major, minor uint32 // the backing file's device
	inode        uint64
	rss          int64 // bytes
	anonymous    int64 // bytes of private copies (copy-on-write), never dropped
	randomRead   bool  // VmFlags has "rr" (MADV_RANDOM: no read-around on faults)
}

// of reports whether m maps the file identified by dev and inode.
func (m mapping) of(major, minor uint32, inode uint64) bool {
	return m.major == major && m.minor == minor && m.inode == inode
}

// droppable reports whether m can be unmapped without losing anything:
// private, not writable, no private copies (a debugger's breakpoint, a
// relocated page), and backed by the file identified by dev and inode.
func (m mapping) droppable(major, minor uint32, inode uint64) bool {
	return m.of(major, minor, inode) &&
		len(m.perms) == 4 && m.perms[0] == 'r' && m.perms[1] == '-' && m.perms[3] == 'p' &&
		m.anonymous == 0
}

// parseSmaps reads smaps text: a header line per mapping
// ("start-end perms offset major:minor inode [path]") followed by
// "Key: value kB" lines.
func parseSmaps(r io.Reader) ([]mapping, error) {
	var out []mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if strings.HasSuffix(f[0], ":") {
			if len(out) == 0 {
				return nil, fmt.Errorf("smaps line %d: %q before any mapping", line, f[0])
			}
			m := &out[len(out)-1]
			switch f[0] {
			case "Rss:", "Anonymous:":
				if len(f) != 3 || f[2] != "kB" {
					return nil, fmt.Errorf("smaps line %d: %s: want \"<n> kB\"", line, f[0])
				}
				kb, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("smaps line %d: %s: %w", line, f[0], err)
				}
				if f[0] == "Rss:" {
					m.rss = kb << 10
				} else {
					m.anonymous = kb << 10
				}
			case "VmFlags:":
				m.randomRead = slices.Contains(f[1:], "rr")
			}
			continue
		}
		m, err := parseHeader(f)
		if err != nil {
			return nil, fmt.Errorf("smaps line %d: %w", line, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func parseHeader(f []string) (mapping, error) {
	var m mapping
	if len(f) < 5 {
		return m, fmt.Errorf("mapping header: want at least 5 fields, got %d", len(f))
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok {
		return m, fmt.Errorf("mapping range %q: no '-'", f[0])
	}
	var err error
	if m.start, err = strconv.ParseUint(lo, 16, 64); err != nil {
		return m, fmt.Errorf("mapping range %q: %w", f[0], err)
	}
	if m.end, err = strconv.ParseUint(hi, 16, 64); err != nil {
		return m, fmt.Errorf("mapping range %q: %w", f[0], err)
	}
	if m.end <= m.start {
		return m, fmt.Errorf("mapping range %q: end not after start", f[0])
	}
	m.perms = f[1]
	maj, mnr, ok := strings.Cut(f[3], ":")
	if !ok {
		return m, fmt.Errorf("mapping device %q: no ':'", f[3])
	}
	a, err := strconv.ParseUint(maj, 16, 32)
	if err != nil {
		return m, fmt.Errorf("mapping device %q: %w", f[3], err)
	}
	b, err := strconv.ParseUint(mnr, 16, 32)
	if err != nil {
		return m, fmt.Errorf("mapping device %q: %w", f[3], err)
	}
	m.major, m.minor = uint32(a), uint32(b)
	if m.inode, err = strconv.ParseUint(f[4], 10, 64); err != nil {
		return m, fmt.Errorf("mapping inode %q: %w", f[4], err)
	}
	return m, nil
}
