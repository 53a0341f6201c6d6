package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// source is a parsed Fetch source: an http(s) URL or a local path (from
// a file URL or given as an absolute path).
type source struct {
	url       string // http(s) URL; empty for a local source
	host      string // the URL's host name or address, without port
	plainHTTP bool   // the URL is http, not https
	path      string // local path, not yet resolved
	display   string // what errors and logs name (credentials redacted)
}

func (c *Cache) parseSource(src string) (source, error) {
	if src == "" {
		return source{}, &FetchError{Stage: StageURL, Source: `""`, Err: errors.New("empty source")}
	}
	if filepath.IsAbs(src) {
		return source{path: filepath.Clean(src), display: src}, nil
	}
	u, err := url.Parse(src)
	if err != nil {
		return source{}, &FetchError{Stage: StageURL, Source: src, Err: unwrapURLError(err)}
	}
	display := u.Redacted()
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		if u.Host == "" {
			return source{}, &FetchError{Stage: StageURL, Source: display, Err: errors.New("missing host")}
		}
		if u.Hostname() == "" {
			return source{}, &FetchError{Stage: StageURL, Source: display, Err: errors.New("missing host")}
		}
		return source{url: u.String(), host: u.Hostname(), plainHTTP: strings.EqualFold(u.Scheme, "http"), display: display}, nil
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return source{}, &FetchError{Stage: StageURL, Source: display,
				Err: fmt.Errorf("file URL host %q: only local files are supported", u.Host)}
		}
		p := filepath.FromSlash(u.Path)
		if !filepath.IsAbs(p) {
			return source{}, &FetchError{Stage: StageURL, Source: display, Err: errors.New("file URL path is not absolute")}
		}
		return source{path: filepath.Clean(p), display: display}, nil
	case "":
		return source{}, &FetchError{Stage: StageURL, Source: display,
			Err: errors.New("want an http, https or file URL or an absolute path")}
	default:
		return source{}, &FetchError{Stage: StageURL, Source: display,
			Err: fmt.Errorf("unsupported scheme %q (want http, https or file)", u.Scheme)}
	}
}

// open returns the source's bytes and their size (-1 when unknown).
func (c *Cache) open(ctx context.Context, s source) (io.ReadCloser, int64, error) {
	if s.url == "" {
		resolved, err := c.checkPath(s.path, s.display)
		if err != nil {
			return nil, 0, err
		}
		f, err := os.Open(resolved)
		if err != nil {
			return nil, 0, &FetchError{Stage: StagePath, Source: s.display, Err: err}
		}
		fi, err := f.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", resolved)
		}
		if err != nil {
			_ = f.Close()
			return nil, 0, &FetchError{Stage: StagePath, Source: s.display, Err: err}
		}
		return f, fi.Size(), nil
	}

	if !c.allowLocal {
		if err := checkHost(ctx, s.host); err != nil {
			return nil, 0, &FetchError{Stage: StageURL, Source: s.display, Err: err}
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, 0, &FetchError{Stage: StageURL, Source: s.display, Err: err}
	}
	req.Header.Set("User-Agent", "drover-agent")
	resp, err := c.client.Do(req)
	if err != nil {
		stage := StageDownload
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		} else if errors.Is(err, ErrLocalURL) {
			stage = StageURL // a redirect or the dialed address was local
		}
		return nil, 0, &FetchError{Stage: stage, Source: s.display, Err: unwrapURLError(err)}
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, 0, &FetchError{Stage: StageDownload, Source: s.display, Err: fmt.Errorf("HTTP %s", resp.Status)}
	}
	return resp.Body, resp.ContentLength, nil
}

// unwrapURLError drops *url.Error's "Get <url>:" prefix: FetchError names
// the source already.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// CheckLocalPath resolves p (which must be absolute) through every symlink
// and returns the resolved path, or a *FetchError wrapping
// ErrPathNotAllowed unless it lies under one of Options.AllowedDirs (each
// resolved the same way, at call time).
func (c *Cache) CheckLocalPath(p string) (string, error) {
	return c.checkPath(p, p)
}

func (c *Cache) checkPath(p, display string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", &FetchError{Stage: StagePath, Source: display, Err: errors.New("path is not absolute")}
	}
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", &FetchError{Stage: StagePath, Source: display, Err: err}
	}
	for _, d := range c.allowed {
		root, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue // an allowed dir that does not exist (yet) holds nothing
		}
		if within(root, resolved) {
			return resolved, nil
		}
	}
	if len(c.allowed) == 0 {
		return "", &FetchError{Stage: StagePath, Source: display,
			Err: fmt.Errorf("%w: no allowed directories are configured", ErrPathNotAllowed)}
	}
	return "", &FetchError{Stage: StagePath, Source: display,
		Err: fmt.Errorf("%w: %s is not under %s", ErrPathNotAllowed, resolved, strings.Join(c.allowed, ", "))}
}

// within reports whether p is root or lies below it (both clean).
func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return false
	}
	return rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}
