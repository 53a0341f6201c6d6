package termnode

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLoginShell(t *testing.T) {
	t.Parallel()
	passwd := filepath.Join(t.TempDir(), "passwd")
	content := "root:x:0:0:root:/root:/bin/bash\n" +
		"# comment\n" +
		"alice:x:1000:1000:Alice,,,:/home/alice:/usr/bin/zsh\n" +
		"noshell:x:1001:1001::/home/noshell:\n" +
		"relative:x:1002:1002::/home/relative:bin/bash\n" +
		"short:x:1003\n" +
		"alice2:x:1004:1004::/home/alice2:/bin/dash\n"
	if err := os.WriteFile(passwd, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ path, user, want string }{
		{passwd, "root", "/bin/bash"},
		{passwd, "alice", "/usr/bin/zsh"},
		{passwd, "alice2", "/bin/dash"},
		{passwd, "noshell", defaultShell},
		{passwd, "relative", defaultShell},
		{passwd, "short", defaultShell},
		{passwd, "ghost", defaultShell},
		{passwd, "ali", defaultShell},
		{filepath.Join(t.TempDir(), "missing"), "root", defaultShell},
	}
	for _, tc := range cases {
		if got := loginShell(tc.path, tc.user); got != tc.want {
			t.Errorf("loginShell(%s) = %q, want %q", tc.user, got, tc.want)
		}
	}
}
