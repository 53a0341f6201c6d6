package task

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestStreamURLParam: stream_url is optional and, when present, must be an
// https:// URL; the agent decodes params with these functions, so a task
// naming anything else is refused before any dial.
func TestStreamURLParam(t *testing.T) {
	term := `{"session_id":"ts-1","allocation_id":"al-1","nonce":"n1","mode":"pty","username":"alice","cols":80,"rows":24,"max_lifetime":"1h"%s}`
	logs := `{"session_id":"ls-1","instance_id":"web-1","nonce":"n1","max_lifetime":"1h"%s}`
	good := []string{"", `,"stream_url":"https://cp-a.internal:8443"`, `,"stream_url":"https://10.0.0.5:8443/base"`}
	bad := []string{`,"stream_url":"http://cp-a:8443"`, `,"stream_url":"wss://cp-a:8443"`, `,"stream_url":"https://"`,
		`,"stream_url":"https://u:p@cp-a"`, `,"stream_url":"https://cp-a/?x=1"`, `,"stream_url":"cp-a:8443"`,
		`,"stream_url":"https://cp-a/` + strings.Repeat("a", MaxStreamURL) + `"`}
	for _, tmpl := range []string{term, logs} {
		decode := func(s string) []string {
			raw := json.RawMessage(strings.Replace(tmpl, "%s", s, 1))
			var fe []string
			if tmpl == term {
				_, errs := DecodeTerminalOpenParams(raw)
				for _, e := range errs {
					fe = append(fe, e.Field)
				}
			} else {
				_, errs := DecodeLogsOpenParams(raw)
				for _, e := range errs {
					fe = append(fe, e.Field)
				}
			}
			return fe
		}
		for _, g := range good {
			if fe := decode(g); fe != nil {
				t.Errorf("%s: refused %v", g, fe)
			}
		}
		for _, b := range bad {
			if fe := decode(b); len(fe) != 1 || fe[0] != "params.stream_url" {
				t.Errorf("%s: errors %v, want params.stream_url", b, fe)
			}
		}
	}
}
