package integration

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// a11yAuditJS checks the open page for the accessibility faults a
// machine can find, and returns one line per fault:
//   - text whose contrast with its background is below WCAG AA (4.5:1,
//     3:1 for large text: 24 px, or 18.66 px bold);
//   - a form control without an accessible name (label, aria-label or
//     aria-labelledby; hidden inputs and buttons with text are named);
//   - a link or button without text or a label;
//   - an <svg role="img"> without aria-label or aria-labelledby;
//   - a table header cell without scope in a table that has a body;
//   - not exactly one <h1>, or a heading level skipped;
//   - an element that takes the keyboard focus but has a negative
//     tabindex while being the only way to an action (tabindex > 0 also,
//     since it breaks the reading order).
const a11yAuditJS = `(() => {
  const out = [];
  const name = el => (el.id ? '#' + el.id : el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : ''));
  const visible = el => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const rgb = c => { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(',').map(x => parseFloat(x)); return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const bgOf = el => { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0.5) return c; } return {r: 255, g: 255, b: 255, a: 1}; };
  const seen = new Set();
  for (const el of document.body.querySelectorAll('*')) {
    if (!visible(el) || el.closest('svg') || el.closest('.xterm') || el.closest('.term-container')) continue;
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim() !== '');
    if (!own) continue;
    const s = getComputedStyle(el); const fg = rgb(s.color); if (!fg) continue;
    const bg = bgOf(el); const l1 = lum(fg), l2 = lum(bg);
    const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    const px = parseFloat(s.fontSize); const bold = parseInt(s.fontWeight) >= 700;
    const need = (px >= 24 || (bold && px >= 18.66)) ? 3 : 4.5;
    if (ratio < need) { const k = 'contrast ' + name(el) + ' ' + ratio.toFixed(2);
      if (!seen.has(k)) { seen.add(k); out.push(k + ' < ' + need + ' (' + s.color + ' on rgb(' + bg.r + ',' + bg.g + ',' + bg.b + '))'); } }
  }
  const labelled = el => el.labels && el.labels.length > 0 || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby') || el.getAttribute('title');
  for (const el of document.querySelectorAll('input, select, textarea')) {
    if (el.type === 'hidden' || el.type === 'submit' || el.type === 'button') continue;
    if (!labelled(el)) out.push('unlabelled control ' + name(el));
  }
  for (const el of document.querySelectorAll('a[href], button')) {
    if (!visible(el)) continue;
    if (el.textContent.trim() === '' && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby') && !el.querySelector('img[alt]'))
      out.push('nameless ' + el.tagName.toLowerCase() + ' ' + name(el));
    if (el.tabIndex > 0) out.push('positive tabindex ' + name(el));
  }
  for (const el of document.querySelectorAll('svg[role=img]')) {
    if (!el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby')) out.push('unlabelled svg ' + name(el));
  }
  for (const th of document.querySelectorAll('thead th')) {
    if (!th.getAttribute('scope')) out.push('th without scope ' + name(th) + ' "' + th.textContent.trim() + '"');
  }
  const hs = [...document.querySelectorAll('h1, h2, h3, h4, h5, h6')].filter(visible);
  const h1 = hs.filter(h => h.tagName === 'H1').length;
  if (h1 !== 1) out.push(h1 + ' h1 elements');
  let last = 0;
  for (const h of hs) { const lv = +h.tagName[1]; if (last && lv > last + 1) out.push('heading level skipped at ' + name(h) + ' (h' + last + ' to h' + lv + ')'); last = lv; }
  if (!document.documentElement.lang) out.push('no lang on <html>');
  if (!document.title) out.push('no <title>');
  return out;
})()`

// auditA11y runs a11yAuditJS on the open page and reports each fault as
// a test error naming the page.
func (p *page) auditA11y(pageName string) {
	p.t.Helper()
	faults := evalJS[[]string](p, a11yAuditJS)
	for _, f := range faults {
		p.t.Errorf("a11y %s: %s", pageName, f)
	}
}

// auditPhone checks the open page at a 390 px wide viewport: nothing
// makes the page itself scroll sideways (wide tables scroll in their own
// box).
func (p *page) auditPhone(pageName string) {
	p.t.Helper()
	if w := evalJS[int](p, `document.documentElement.scrollWidth`); w > 390 {
		// The elements that stick out, leaving out those inside a box
		// that scrolls or clips them.
		wide := evalJS[[]string](p, `[...document.body.querySelectorAll('*')].filter(e => {
			if (e.getBoundingClientRect().right <= 392) return false;
			for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
				if (getComputedStyle(a).overflowX !== 'visible') return false;
			}
			return true;
		}).slice(0, 5).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (typeof e.className === 'string' && e.className ? '.' + e.className.split(' ')[0] : '') + ' ' + Math.round(e.getBoundingClientRect().right) + 'px')`)
		p.t.Errorf("%s is %d px wide on a 390 px phone (widest: %s)", pageName, w, strings.Join(wide, ", "))
	}
}

// TestA11yAuditFindsFaults: the audit is not a test that cannot fail. A
// page with low-contrast text, an unlabelled input, a nameless button, an
// unlabelled SVG image, a header cell without scope, two h1s and a skipped
// heading level yields a fault for each; a clean page yields none.
func TestA11yAuditFindsFaults(t *testing.T) {
	p := startBrowser(t)
	bad := `<!doctype html><html><head><title>x</title></head><body>
<h1>One</h1><h1>Two</h1><h4>skip</h4>
<p style="color:#aaa;background:#fff">faint text</p>
<input id="q"><button id="b"></button>
<svg role="img" width="10" height="10"><rect width="10" height="10"/></svg>
<table><thead><tr><th>h</th></tr></thead><tbody><tr><td>d</td></tr></tbody></table>
</body></html>`
	good := `<!doctype html><html lang="en"><head><title>x</title></head><body>
<h1>One</h1><h2>Two</h2>
<p style="color:#333;background:#fff">clear text</p>
<label for="q">Query</label><input id="q"><button id="b">Go</button>
<svg role="img" aria-label="a box" width="10" height="10"><rect width="10" height="10"/></svg>
<table><thead><tr><th scope="col">h</th></tr></thead><tbody><tr><td>d</td></tr></tbody></table>
</body></html>`
	for _, c := range []struct {
		name, html string
		want       []string
	}{
		{"bad", bad, []string{"contrast p", "unlabelled control #q", "nameless button #b", "unlabelled svg", "th without scope", "2 h1 elements",
			"heading level skipped", "no lang on <html>"}},
		{"good", good, nil},
	} {
		p.do(10*time.Second, chromedp.Navigate("data:text/html;charset=utf-8,"+url.PathEscape(c.html)))
		faults := evalJS[[]string](p, a11yAuditJS)
		joined := strings.Join(faults, "\n")
		for _, w := range c.want {
			if !strings.Contains(joined, w) {
				t.Errorf("%s page: no fault %q in:\n%s", c.name, w, joined)
			}
		}
		if c.want == nil && len(faults) > 0 {
			t.Errorf("%s page: faults %v", c.name, faults)
		}
	}
}
