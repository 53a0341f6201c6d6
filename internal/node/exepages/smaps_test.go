package exepages

import (
	"strings"
	"testing"
)

const sample = `00400000-00d31000 r-xp 00000000 fe:00 10274757                           /usr/bin/drover-agent
Size:               9412 kB
Rss:                8260 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me dw
00d31000-0171f000 r--p 00931000 fe:00 10274757                           /usr/bin/drover-agent (deleted)
Size:              10168 kB
Rss:                7992 kB
Anonymous:             0 kB
VmFlags: rd mr mw me rr
0171f000-0178f000 rw-p 0131f000 fe:00 10274757                           /usr/bin/drover-agent
Rss:                 444 kB
Anonymous:           104 kB
c000000000-c000400000 rw-p 00000000 00:00 0 
Rss:                2048 kB
Anonymous:          2048 kB
7f0000000000-7f0000001000 r--p 00000000 103:1a 42                        /lib/x.so
Rss:                   4 kB
Anonymous:             0 kB
`

func TestParseSmaps(t *testing.T) {
	got, err := parseSmaps(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{
		{0x400000, 0xd31000, "r-xp", 0xfe, 0, 10274757, 8260 << 10, 0, false},
		{0xd31000, 0x171f000, "r--p", 0xfe, 0, 10274757, 7992 << 10, 0, true},
		{0x171f000, 0x178f000, "rw-p", 0xfe, 0, 10274757, 444 << 10, 104 << 10, false},
		{0xc000000000, 0xc000400000, "rw-p", 0, 0, 0, 2048 << 10, 2048 << 10, false},
		{0x7f0000000000, 0x7f0000001000, "r--p", 0x103, 0x1a, 42, 4 << 10, 0, false},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mappings, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestParseSmapsErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"key before mapping", "Rss: 4 kB\n", "before any mapping"},
		{"short header", "00400000-00d31000 r-xp 00000000 fe:00\n", "at least 5 fields"},
		{"range without dash", "00400000 r-xp 0 fe:00 1 /x\n", "no '-'"},
		{"range reversed", "00d31000-00400000 r-xp 0 fe:00 1 /x\n", "end not after start"},
		{"range not hex", "0040000g-00d31000 r-xp 0 fe:00 1 /x\n", "mapping range"},
		{"device without colon", "00400000-00d31000 r-xp 0 fe00 1 /x\n", "no ':'"},
		{"inode not a number", "00400000-00d31000 r-xp 0 fe:00 x /x\n", "mapping inode"},
		{"rss without unit", "00400000-00d31000 r-xp 0 fe:00 1 /x\nRss: 4\n", "Rss:"},
		{"anonymous not a number", "00400000-00d31000 r-xp 0 fe:00 1 /x\nAnonymous: many kB\n", "Anonymous:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseSmaps(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestDroppable(t *testing.T) {
	const maj, mnr, ino = 0xfe, 0, 7
	exe := mapping{start: 0x1000, end: 0x2000, perms: "r-xp", major: maj, minor: mnr, inode: ino, rss: 4096}
	for _, tc := range []struct {
		name string
		edit func(*mapping)
		want bool
	}{
		{"text", func(*mapping) {}, true},
		{"read-only data", func(m *mapping) { m.perms = "r--p" }, true},
		{"writable data", func(m *mapping) { m.perms = "rw-p" }, false},
		{"shared", func(m *mapping) { m.perms = "r-xs" }, false},
		{"private copies (breakpoint, relocation)", func(m *mapping) { m.anonymous = 4096 }, false},
		{"another file", func(m *mapping) { m.inode = ino + 1 }, false},
		{"same inode, other device", func(m *mapping) { m.minor = 1 }, false},
		{"unreadable", func(m *mapping) { m.perms = "---p" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := exe
			tc.edit(&m)
			if got := m.droppable(maj, mnr, ino); got != tc.want {
				t.Fatalf("droppable(%+v) = %v, want %v", m, got, tc.want)
			}
		})
	}
}
