package server

import (
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
