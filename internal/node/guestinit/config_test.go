package guestinit

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestConfigRoundTrip(t *testing.T) {
	c := Config{Entrypoint: []string{"/srv"}, Cmd: []string{"-v"}, Env: []string{"A=1"}, User: "app:app",
		WorkingDir: "/w", Hostname: "h", Secrets: map[string][]byte{"tok": []byte("s3cret")},
		Volumes: []Volume{{Serial: "vol-data", Target: "/data"}}, Network: &UserNetwork}
	b, err := EncodeConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%4096 != 0 || !bytes.HasPrefix(b, []byte(configMagic)) {
		t.Fatalf("drive is %d bytes, starts %q", len(b), b[:20])
	}
	got, err := DecodeConfig(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("round trip: got %+v, want %+v", got, c)
	}
	if a := got.Argv(); !reflect.DeepEqual(a, []string{"/srv", "-v"}) {
		t.Errorf("argv %v", a)
	}
}

func TestConfigInvalid(t *testing.T) {
	for name, c := range map[string]Config{
		"no command":   {},
		"bad env":      {Cmd: []string{"x"}, Env: []string{"NOEQUALS"}},
		"relative cwd": {Cmd: []string{"x"}, WorkingDir: "w"},
		"secret path":  {Cmd: []string{"x"}, Secrets: map[string][]byte{"../x": nil}},
		"volume root":  {Cmd: []string{"x"}, Volumes: []Volume{{Serial: "v", Target: "/"}}},
	} {
		if _, err := EncodeConfig(c); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	for _, b := range []string{"", "garbage\n", configMagic + "x\n", configMagic + "10\n{}"} {
		if _, err := DecodeConfig(strings.NewReader(b)); err == nil {
			t.Errorf("decoded %q", b)
		}
	}
}

func TestReports(t *testing.T) {
	out := "boot noise\r\n" + Report{Event: EventStarted, PID: 7}.Line() + "app says hiDROVER-INIT not json\n" +
		"partial" + Report{Event: EventExited, PID: 7, ExitCode: 137, Signal: "SIGKILL", OOMKilled: true}.Line()
	got := ParseReports([]byte(out))
	want := []Report{{Event: EventStarted, PID: 7}, {Event: EventExited, PID: 7, ExitCode: 137, Signal: "SIGKILL", OOMKilled: true}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("reports %+v, want %+v", got, want)
	}
	if l := (Report{Event: EventExited, ExitCode: 3}).Line(); l != `DROVER-INIT {"event":"exited","exit_code":3}`+"\r\n" {
		t.Errorf("line %q", l)
	}
}

func TestLookupUser(t *testing.T) {
	passwd := []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n# c\nbad:x:z:1::/:\n")
	group := []byte("root:x:0:\napp:x:1000:\nstaff:x:50:app,other\nweb:x:33:\n")
	for _, tc := range []struct {
		user string
		want Identity
		err  bool
	}{
		{"", Identity{UID: 0, GID: 0, Home: "/root"}, false},
		{"app", Identity{UID: 1000, GID: 1000, Home: "/home/app", Groups: []uint32{50}}, false},
		{"1000", Identity{UID: 1000, GID: 1000, Home: "/home/app", Groups: []uint32{50}}, false},
		{"app:web", Identity{UID: 1000, GID: 33, Home: "/home/app", Groups: []uint32{50}}, false},
		{"4242:4343", Identity{UID: 4242, GID: 4343, Home: "/"}, false},
		{"4242", Identity{UID: 4242, GID: 4242, Home: "/"}, false},
		{"nobody", Identity{}, true},
		{"app:nogroup", Identity{}, true},
	} {
		got, err := LookupUser(tc.user, passwd, group)
		if (err != nil) != tc.err {
			t.Errorf("%q: err %v", tc.user, err)
			continue
		}
		if !tc.err && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %+v, want %+v", tc.user, got, tc.want)
		}
	}
	if _, err := LookupUser("1", nil, nil); err != nil {
		t.Errorf("numeric user without passwd: %v", err)
	}
}

func TestMergeEnv(t *testing.T) {
	got := MergeEnv([]string{"PATH=/bin", "A=1"}, map[string]string{"A": "2", "B": "3"})
	if want := []string{"PATH=/bin", "A=2", "B=3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}

func TestInitramfs(t *testing.T) {
	b, err := InitramfsBytes([]byte("init"), "")
	if err != nil || len(b) == 0 {
		t.Fatalf("%d bytes, %v", len(b), err)
	}
	if _, err := InitramfsBytes([]byte("init"), t.TempDir()); err == nil {
		t.Error("a module dir without modules was accepted")
	}
}

func TestResolvConf(t *testing.T) {
	for _, c := range []struct{ dns, want string }{
		{"", ""},
		{"10.0.2.3", "nameserver 10.0.2.3\n"},
		{"10.88.0.53, 9.9.9.9,", "nameserver 10.88.0.53\nnameserver 9.9.9.9\n"},
	} {
		if got := string(Network{DNS: c.dns}.ResolvConf()); got != c.want {
			t.Errorf("ResolvConf(%q) = %q, want %q", c.dns, got, c.want)
		}
	}
}

func TestWorkload(t *testing.T) {
	img := Config{Entrypoint: []string{"/entry"}, Cmd: []string{"serve"}, Env: []string{"A=1", "B=2"}, User: "app", WorkingDir: "/srv"}
	for _, c := range []struct {
		name          string
		command, args []string
		env           map[string]string
		want          Config
	}{
		{"image as is", nil, nil, nil, Config{Entrypoint: []string{"/entry"}, Cmd: []string{"serve"}, Env: []string{"A=1", "B=2"}, User: "app", WorkingDir: "/srv"}},
		{"command resets the cmd", []string{"/bin/sh"}, nil, nil, Config{Entrypoint: []string{"/bin/sh"}, Env: []string{"A=1", "B=2"}, User: "app", WorkingDir: "/srv"}},
		{"args replace the cmd", nil, []string{"migrate"}, nil, Config{Entrypoint: []string{"/entry"}, Cmd: []string{"migrate"}, Env: []string{"A=1", "B=2"}, User: "app", WorkingDir: "/srv"}},
		{"command and args", []string{"/bin/sh"}, []string{"-c", "x"}, nil, Config{Entrypoint: []string{"/bin/sh"}, Cmd: []string{"-c", "x"}, Env: []string{"A=1", "B=2"}, User: "app", WorkingDir: "/srv"}},
		{"env merged", nil, nil, map[string]string{"B": "3", "C": "4"}, Config{Entrypoint: []string{"/entry"}, Cmd: []string{"serve"}, Env: []string{"A=1", "B=3", "C=4"}, User: "app", WorkingDir: "/srv"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Workload(img, c.command, c.args, c.env)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Workload = %+v, want %+v", got, c.want)
			}
		})
	}
	if Workload(img, nil, nil, map[string]string{"Z": "9"}); len(img.Env) != 2 {
		t.Errorf("Workload changed the image's env: %v", img.Env)
	}
}
