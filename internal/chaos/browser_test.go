package chaos

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/drover-dev/drover/internal/wire/terminal"
)

// chromiumPath is Debian's chromium (.ci/run installs it).
const chromiumPath = "/usr/bin/chromium"

// consoleShowsError opens the allocation's terminal in the web console in
// headless Chromium while the fault holds and checks that the page ends in
// the structured error want (code and recovery text), not "Connecting...".
// Without Chromium it logs and returns, unless CI is set: then it fails.
func (c *cluster) consoleShowsError(want terminal.ErrorCode) string {
	t := c.t
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s: %v (install the Debian package chromium; required under CI)", chromiumPath, err)
		}
		t.Logf("%s: %v: the console check is skipped", chromiumPath, err)
		return "no chromium"
	}
	profile := t.TempDir() // TMPDIR too: Chromium leaves its singleton socket's directory there
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.UserDataDir(profile), chromedp.Env("TMPDIR="+profile), chromedp.WindowSize(1000, 700))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	defer cancelTab()
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromiumPath, err)
	}
	step := func(d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("browser: %v", err)
		}
	}
	waitJS := func(expr string, d time.Duration) {
		t.Helper()
		wrapped := "(() => { try { return !!(" + expr + "); } catch (e) { return false; } })()"
		deadline := time.Now().Add(d)
		for {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ok, err := chromedp.Run(sctx, chromedp.Evaluate[bool](wrapped))
			cancel()
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				body, _ := eval[string](ctx, `document.body.innerText`)
				t.Fatalf("browser: %s not true within %s; page:\n%s", expr, d, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	step(15*time.Second, chromedp.Navigate(c.opURL+"/ui/"), chromedp.WaitVisible(chromedp.ID("login-token")),
		chromedp.SendKeys(chromedp.ID("login-token"), c.token), chromedp.Click(chromedp.ID("login-submit")))
	btn := `[data-alloc-id="` + c.allocID + `"] .open-terminal`
	waitJS(`document.querySelector('`+btn+`:not([disabled])') !== null`, 10*time.Second)
	step(10*time.Second, chromedp.Click(chromedp.CSS(btn)))
	start := time.Now()
	waitJS(`['failed', 'closed', 'exited', 'pty_ready'].includes(document.getElementById('term-state').textContent)`,
		streamTimeout+15*time.Second)
	took := time.Since(start)
	state, _ := eval[string](ctx, `document.getElementById('term-state').textContent.trim()`)
	visible, _ := eval[bool](ctx, `!document.getElementById('term-error').hidden`)
	code, _ := eval[string](ctx, `document.getElementById('term-error-code').textContent.trim()`)
	recovery, _ := eval[string](ctx, `document.getElementById('term-error-recovery').textContent.trim()`)
	body, _ := eval[string](ctx, `document.body.innerText`)
	if state != "failed" || !visible || code != string(want) || recovery != terminal.RecoveryText(want) {
		t.Errorf("console: state %q, error box visible=%v code %q recovery %q; want failed, %s and %q", state, visible, code,
			recovery, want, terminal.RecoveryText(want))
	}
	if strings.Contains(strings.ToLower(body), "connecting...") {
		t.Errorf("the console still says Connecting...:\n%s", body)
	}
	return "console showed " + code + " after " + took.Round(100*time.Millisecond).String()
}

// eval evaluates expr in the page (5 s at most).
func eval[T any](ctx context.Context, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}
