// Package webui owns the embedded web console assets (HTML, CSS, JavaScript
// and the vendored xterm.js) and the HTTP handler that serves them under
// /ui/. It must not call the store or hold any credentials server-side: the
// pages call the operator API from the browser with the operator's own
// bearer token, kept in the tab's sessionStorage, and terminal tokens go
// straight from the API to the browser's WebSocket.
//
// Mount it on the operator listener for "/ui/" and the exact root:
//
//	h := webui.Handler()
//	mux.Handle("GET /ui/", h) // ServeMux also redirects "/ui" to "/ui/"
//	mux.Handle("GET /{$}", h) // "/" redirects to "/ui/"
//
// (A "GET" pattern matches HEAD too.) The handler expects the full request
// path: do not wrap it in http.StripPrefix.
package webui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// ContentSecurityPolicy is sent with every HTML page. Scripts come only from
// this origin (no inline scripts, no eval). 'unsafe-inline' for styles is
// needed by xterm.js, whose DOM renderer injects <style> elements for the
// theme and cell size. connect-src allows the API on this origin and the
// terminal WebSocket (ws:/wss: because not every browser counts
// ws://same-host as 'self').
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; " +
	"style-src 'self' 'unsafe-inline'; connect-src 'self' ws: wss:; img-src 'self' data:; " +
	"font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

//go:embed static
var assets embed.FS

// asset is one embedded file, ready to serve.
type asset struct {
	name  string
	data  []byte
	ctype string
	etag  string
	html  bool
}

// handler serves the embedded assets; it is immutable after Handler builds it.
type handler struct {
	files map[string]asset // keyed by path below static/, e.g. "vendor/xterm.mjs"
}

// contentTypes maps the extensions the console ships to their media types.
// A file with another extension is served as application/octet-stream.
func contentTypes() map[string]string {
	return map[string]string{
		".html": "text/html; charset=utf-8",
		".js":   "text/javascript; charset=utf-8",
		".mjs":  "text/javascript; charset=utf-8",
		".css":  "text/css; charset=utf-8",
		".svg":  "image/svg+xml",
		".png":  "image/png",
		".ico":  "image/x-icon",
		".json": "application/json",
		"":      "text/plain; charset=utf-8", // LICENSE-*, VERSIONS
	}
}

// Handler returns the console's HTTP handler: "/" and "/ui" redirect to
// "/ui/", "/ui/" serves index.html, "/ui/NAME" serves the embedded file
// NAME, anything else is 404. Only GET and HEAD are allowed. Every response
// has X-Content-Type-Options: nosniff and Cache-Control: no-cache (file
// names carry no content hash, so browsers revalidate with the ETag, a
// SHA-256 of the content); HTML pages also get ContentSecurityPolicy.
func Handler() http.Handler {
	h, err := newHandler(assets)
	if err != nil {
		// The files are compiled in; failing to read them is a build defect.
		panic(fmt.Sprintf("webui: embedded assets: %v", err))
	}
	return h
}

// newHandler indexes every file under static/ in fsys.
func newHandler(fsys fs.FS) (*handler, error) {
	types := contentTypes()
	h := &handler{files: map[string]asset{}}
	err := fs.WalkDir(fsys, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		ext := path.Ext(p)
		ctype, ok := types[ext]
		if !ok {
			ctype = "application/octet-stream"
		}
		sum := sha256.Sum256(data)
		name := strings.TrimPrefix(p, "static/")
		h.files[name] = asset{
			name:  name,
			data:  data,
			ctype: ctype,
			etag:  `"` + hex.EncodeToString(sum[:16]) + `"`,
			html:  ext == ".html",
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk static: %w", err)
	}
	if _, ok := h.files["index.html"]; !ok {
		return nil, fmt.Errorf("static/index.html is missing")
	}
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	p := r.URL.Path
	switch {
	case p == "" || p == "/" || p == strings.TrimSuffix(Prefix, "/"):
		http.Redirect(w, r, Prefix, http.StatusFound)
		return
	case !strings.HasPrefix(p, Prefix):
		http.NotFound(w, r)
		return
	}
	name := strings.TrimPrefix(p, Prefix)
	if name == "" {
		name = "index.html"
	}
	a, ok := h.files[name] // exact match: "..", "//" and directories never match
	if !ok {
		http.NotFound(w, r)
		return
	}
	hdr.Set("Content-Type", a.ctype)
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", a.etag)
	if a.html {
		hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
		hdr.Set("X-Frame-Options", "DENY")
	}
	http.ServeContent(w, r, a.name, time.Time{}, bytes.NewReader(a.data))
}
