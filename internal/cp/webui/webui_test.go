package webui

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"
)

// embeddedFiles lists every file under static/, relative to it.
func embeddedFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := fs.WalkDir(assets, "static", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, strings.TrimPrefix(p, "static/"))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func get(t *testing.T, h http.Handler, method, target string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestHandlerServesEveryFile(t *testing.T) {
	h := Handler()
	wantType := map[string]string{
		".html": "text/html; charset=utf-8",
		".js":   "text/javascript; charset=utf-8",
		".mjs":  "text/javascript; charset=utf-8",
		".css":  "text/css; charset=utf-8",
		".svg":  "image/svg+xml",
		"":      "text/plain; charset=utf-8",
	}
	files := embeddedFiles(t)
	for _, must := range []string{"index.html", "app.js", "terminal.html", "terminal.js", "replay.html",
		"replay.js", "sessions.html", "sessions.js", "codes.js", "style.css", "vendor/xterm.mjs",
		"vendor/xterm.css", "vendor/addon-fit.mjs", "vendor/VERSIONS"} {
		if !contains(files, must) {
			t.Errorf("static/%s is not embedded", must)
		}
	}
	for _, name := range files {
		t.Run(name, func(t *testing.T) {
			rec := get(t, h, http.MethodGet, Prefix+name, nil)
			if rec.Code != http.StatusOK {
				t.Fatalf("GET %s%s = %d", Prefix, name, rec.Code)
			}
			want, err := assets.ReadFile("static/" + name)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Body.String() != string(want) {
				t.Errorf("body differs from the embedded file")
			}
			ct, ok := wantType[path.Ext(name)]
			if !ok {
				t.Fatalf("test has no content type for %s; add one to contentTypes and here", name)
			}
			hd := rec.Header()
			if got := hd.Get("Content-Type"); got != ct {
				t.Errorf("Content-Type = %q, want %q", got, ct)
			}
			if got := hd.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options = %q", got)
			}
			if got := hd.Get("Cache-Control"); got != "no-cache" {
				t.Errorf("Cache-Control = %q", got)
			}
			if hd.Get("ETag") == "" {
				t.Error("no ETag")
			}
			csp := hd.Get("Content-Security-Policy")
			if path.Ext(name) == ".html" {
				checkCSP(t, csp)
				if hd.Get("X-Frame-Options") != "DENY" {
					t.Errorf("X-Frame-Options = %q", hd.Get("X-Frame-Options"))
				}
			} else if csp != "" {
				t.Errorf("non-HTML file has a CSP %q", csp)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// checkCSP parses a Content-Security-Policy and checks the directives the
// console relies on.
func checkCSP(t *testing.T, csp string) {
	t.Helper()
	dirs := map[string]string{}
	for _, d := range strings.Split(csp, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
		dirs[name] = value
	}
	want := map[string]string{
		"default-src":     "'self'",
		"script-src":      "'self'",
		"connect-src":     "'self' ws: wss:",
		"style-src":       "'self' 'unsafe-inline'",
		"object-src":      "'none'",
		"base-uri":        "'none'",
		"frame-ancestors": "'none'",
	}
	for k, v := range want {
		if dirs[k] != v {
			t.Errorf("CSP %s = %q, want %q (policy %q)", k, dirs[k], v, csp)
		}
	}
	if strings.Contains(dirs["script-src"], "unsafe") {
		t.Errorf("script-src allows unsafe sources: %q", dirs["script-src"])
	}
}

func TestHandlerRoutes(t *testing.T) {
	h := Handler()
	index, _ := assets.ReadFile("static/index.html")
	tests := []struct {
		method, target string
		status         int
		location       string // for redirects
		body           string // for 200
	}{
		{"GET", "/", http.StatusFound, "/ui/", ""},
		{"GET", "/ui", http.StatusFound, "/ui/", ""},
		{"HEAD", "/ui", http.StatusFound, "/ui/", ""},
		{"GET", "/ui/", http.StatusOK, "", string(index)},
		{"GET", "/ui/index.html", http.StatusOK, "", string(index)},
		{"HEAD", "/ui/", http.StatusOK, "", ""},
		{"GET", "/ui/nope.js", http.StatusNotFound, "", ""},
		{"GET", "/ui/vendor/", http.StatusNotFound, "", ""},
		{"GET", "/ui/vendor", http.StatusNotFound, "", ""},
		{"GET", "/ui/../webui.go", http.StatusNotFound, "", ""},
		{"GET", "/ui//index.html", http.StatusNotFound, "", ""},
		{"GET", "/ui/static/index.html", http.StatusNotFound, "", ""},
		{"GET", "/index.html", http.StatusNotFound, "", ""},
		{"GET", "/api/v1/allocations", http.StatusNotFound, "", ""},
		{"POST", "/ui/", http.StatusMethodNotAllowed, "", ""},
		{"DELETE", "/ui/app.js", http.StatusMethodNotAllowed, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			rec := get(t, h, tt.method, tt.target, nil)
			if rec.Code != tt.status {
				t.Fatalf("status = %d, want %d", rec.Code, tt.status)
			}
			if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
				t.Error("no nosniff header")
			}
			if tt.location != "" && rec.Header().Get("Location") != tt.location {
				t.Errorf("Location = %q, want %q", rec.Header().Get("Location"), tt.location)
			}
			if tt.body != "" && rec.Body.String() != tt.body {
				t.Errorf("body is not index.html")
			}
			if tt.method == "HEAD" && rec.Code == http.StatusOK && rec.Body.Len() != 0 {
				t.Errorf("HEAD has a body")
			}
			if tt.status == http.StatusMethodNotAllowed && rec.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q", rec.Header().Get("Allow"))
			}
		})
	}
}

func TestHandlerRevalidates(t *testing.T) {
	h := Handler()
	first := get(t, h, http.MethodGet, "/ui/terminal.js", nil)
	etag := first.Header().Get("ETag")
	if etag == "" {
		t.Fatal("no ETag")
	}
	again := get(t, h, http.MethodGet, "/ui/terminal.js", map[string]string{"If-None-Match": etag})
	if again.Code != http.StatusNotModified {
		t.Errorf("If-None-Match with the ETag: status %d, want 304", again.Code)
	}
	other := get(t, h, http.MethodGet, "/ui/terminal.js", map[string]string{"If-None-Match": `"other"`})
	if other.Code != http.StatusOK {
		t.Errorf("If-None-Match with another ETag: status %d, want 200", other.Code)
	}
	if get(t, h, http.MethodGet, "/ui/app.js", nil).Header().Get("ETag") == etag {
		t.Error("two different files share an ETag")
	}
}

func TestNewHandlerNeedsIndex(t *testing.T) {
	sub, err := fs.Sub(assets, "static/vendor") // a tree without static/index.html
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newHandler(sub); err == nil {
		t.Error("newHandler accepted assets without static/index.html")
	}
}

var (
	// scriptTagRE finds <script ...> tags; attrsRE the src/href references.
	scriptTagRE = regexp.MustCompile(`(?is)<script\b([^>]*)>(.*?)</script>`)
	refRE       = regexp.MustCompile(`(?i)\b(?:src|href)="([^"]*)"`)
	handlerRE   = regexp.MustCompile(`(?i)\son[a-z]+\s*=`)
	importRE    = regexp.MustCompile(`(?m)^\s*(?:import|export)\b[^'"]*?\bfrom\s+'([^']+)'|^\s*import\s+'([^']+)'`)
	idRE        = regexp.MustCompile(`\bid="([^"]+)"`)
	byIDRE      = regexp.MustCompile(`byId\('([^']+)'\)`)
)

// TestPagesAreCSPClean checks what the CSP would otherwise break at run
// time: no inline script, no inline event handler, no javascript: URL,
// and every local reference (src, href, JS import) names an embedded file.
func TestPagesAreCSPClean(t *testing.T) {
	files := embeddedFiles(t)
	for _, name := range files {
		data, _ := assets.ReadFile("static/" + name)
		src := string(data)
		switch path.Ext(name) {
		case ".html":
			for _, m := range scriptTagRE.FindAllStringSubmatch(src, -1) {
				if !strings.Contains(m[1], "src=") || strings.TrimSpace(m[2]) != "" {
					t.Errorf("%s: inline script %q", name, m[0])
				}
			}
			if loc := handlerRE.FindStringIndex(src); loc != nil {
				t.Errorf("%s: inline event handler near %q", name, src[loc[0]:min(loc[1]+20, len(src))])
			}
			if strings.Contains(strings.ToLower(src), "javascript:") {
				t.Errorf("%s: javascript: URL", name)
			}
			for _, m := range refRE.FindAllStringSubmatch(src, -1) {
				checkLocalRef(t, files, name, m[1])
			}
			// Every id the page's script looks up must exist in the page.
			script := strings.TrimSuffix(name, ".html") + ".js"
			if name == "index.html" {
				script = "app.js"
			}
			js, err := assets.ReadFile("static/" + script)
			if err != nil {
				t.Errorf("%s: no script %s", name, script)
				continue
			}
			ids := map[string]bool{}
			for _, m := range idRE.FindAllStringSubmatch(src, -1) {
				if ids[m[1]] {
					t.Errorf("%s: duplicate id %q", name, m[1])
				}
				ids[m[1]] = true
			}
			for _, m := range byIDRE.FindAllStringSubmatch(string(js), -1) {
				if !ids[m[1]] {
					t.Errorf("%s looks up #%s, which %s lacks", script, m[1], name)
				}
			}
		case ".js", ".mjs":
			for _, m := range importRE.FindAllStringSubmatch(src, -1) {
				ref := m[1] + m[2]
				if !strings.HasPrefix(ref, "./") {
					t.Errorf("%s imports %q: only relative imports of embedded files work", name, ref)
					continue
				}
				checkLocalRef(t, files, name, ref)
			}
		}
	}
}

// checkLocalRef checks that ref, found in file from, names an embedded
// file; links to other pages may carry a query, fragments are ignored.
func checkLocalRef(t *testing.T, files []string, from, ref string) {
	t.Helper()
	ref, _, _ = strings.Cut(ref, "#")
	ref, _, _ = strings.Cut(ref, "?")
	if ref == "" {
		return
	}
	if strings.Contains(ref, "://") || strings.HasPrefix(ref, "/") {
		t.Errorf("%s: reference %q leaves the console's own files", from, ref)
		return
	}
	target := path.Join(path.Dir(from), ref)
	if !contains(files, target) {
		t.Errorf("%s: reference %q (%s) is not an embedded file", from, ref, target)
	}
}

// TestVendorPinned checks the vendored xterm.js files against
// static/vendor/VERSIONS: each file's SHA-256 (xterm.js 6 has no version
// string in its bundle), the pinned package versions and their licences.
func TestVendorPinned(t *testing.T) {
	data, err := assets.ReadFile("static/vendor/VERSIONS")
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]string{}
	listed := map[string]bool{"VERSIONS": true}
	var pkg string
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch {
		case f[0] == "package" && len(f) == 4:
			pkg = f[1]
			versions[pkg] = f[2]
			if !strings.HasPrefix(f[3], "sha512-") {
				t.Errorf("VERSIONS line %d: integrity %q is not an npm sha512 integrity", i+1, f[3])
			}
		case f[0] == "file" && len(f) == 4 && pkg != "":
			listed[f[1]] = true
			got, err := assets.ReadFile("static/vendor/" + f[1])
			if err != nil {
				t.Errorf("VERSIONS line %d: %v", i+1, err)
				continue
			}
			sum := sha256.Sum256(got)
			if hex.EncodeToString(sum[:]) != f[3] {
				t.Errorf("vendor/%s is not %s@%s's %s (sha256 %x, VERSIONS says %s)",
					f[1], pkg, versions[pkg], f[2], sum, f[3])
			}
		default:
			t.Errorf("VERSIONS line %d: cannot parse %q", i+1, line)
		}
	}
	if v := versions["@xterm/xterm"]; !strings.HasPrefix(v, "6.") {
		t.Errorf("@xterm/xterm version %q, want 6.x", v)
	}
	if versions["@xterm/addon-fit"] == "" {
		t.Error("@xterm/addon-fit is not listed")
	}
	for _, name := range embeddedFiles(t) {
		if rest, ok := strings.CutPrefix(name, "vendor/"); ok && !listed[rest] {
			t.Errorf("vendor/%s is not listed in VERSIONS", rest)
		}
	}
	for _, lic := range []string{"LICENSE-xterm", "LICENSE-addon-fit"} {
		if !listed[lic] {
			t.Errorf("%s is not vendored", lic)
		}
	}
	xterm, _ := assets.ReadFile("static/vendor/xterm.mjs")
	if !strings.Contains(string(xterm[:min(len(xterm), 2048)]), "The xterm.js authors") ||
		!strings.Contains(string(xterm), "export{") {
		t.Error("vendor/xterm.mjs is not the xterm.js ES module bundle")
	}
}

// TestDocumentedMount mounts the handler as the package comment says and
// checks the routes the server relies on.
func TestDocumentedMount(t *testing.T) {
	mux := http.NewServeMux()
	h := Handler()
	mux.Handle("GET /ui/", h)
	mux.Handle("GET /{$}", h)
	for _, tt := range []struct {
		target   string
		status   int
		location string
	}{
		{"/", http.StatusFound, "/ui/"},
		{"/ui", http.StatusTemporaryRedirect, "/ui/"}, // ServeMux's own redirect
		{"/ui/", http.StatusOK, ""},
		{"/ui/vendor/xterm.css", http.StatusOK, ""},
		{"/elsewhere", http.StatusNotFound, ""},
	} {
		rec := get(t, mux, http.MethodGet, tt.target, nil)
		if rec.Code != tt.status || rec.Header().Get("Location") != tt.location {
			t.Errorf("GET %s = %d %q, want %d %q", tt.target, rec.Code, rec.Header().Get("Location"), tt.status, tt.location)
		}
	}
}
