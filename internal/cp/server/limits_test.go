package server

import (
	"strings"
	"testing"
	"time"
)

func TestLimitDefaults(t *testing.T) {
	var c Config
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.ReadHeaderTimeout != 10*time.Second || c.BodyReadTimeout != 30*time.Second || c.IdleTimeout != 2*time.Minute ||
		c.MaxHeaderBytes != 64<<10 || c.NodeLongPollLimit != 4 || c.Terminal.MaxSessionsPerNode != 16 ||
		c.Terminal.RecheckInterval != 30*time.Second {
		t.Fatalf("defaults %+v", c)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.BodyReadTimeout = -time.Second },
		func(c *Config) { c.MaxHeaderBytes = 100 },
		func(c *Config) { c.NodeLongPollLimit = -1 },
		func(c *Config) { c.Terminal.MaxSessionsPerNode = -1 },
	} {
		var c Config
		bad(&c)
		if err := c.setDefaults(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// TestPublicURL: a public URL's origin may open terminals besides the
// configured ones (the caller's slice is left alone); a URL with a path,
// query, credentials or another scheme is refused naming the setting.
func TestPublicURL(t *testing.T) {
	origins := make([]string, 1, 4)
	origins[0] = "https://other.example"
	c := Config{PublicURL: "https://drover.example:8443/", Terminal: TerminalConfig{AllowedOrigins: origins}}
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if got := c.Terminal.AllowedOrigins; len(got) != 2 || got[1] != "https://drover.example:8443" {
		t.Errorf("allowed origins %v", got)
	}
	if got := origins[:2][1]; got != "" {
		t.Errorf("the caller's slice was written: %q", got)
	}
	for _, bad := range []string{"drover.example", "ftp://drover.example", "https://drover.example/ui/",
		"https://drover.example/?x=1", "https://u:p@drover.example", "https://"} {
		c := Config{PublicURL: bad}
		err := c.setDefaults()
		if err == nil || !strings.Contains(err.Error(), "public URL") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
