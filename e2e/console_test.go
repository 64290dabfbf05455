package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Browser test knobs: where the screenshots go (default: the test's temporary directory), and
// whether a missing Chromium fails the test instead of skipping it (CI sets it).
const (
	screenshotsEnv    = "INTEGRATIONS_E2E_SCREENSHOTS"
	requireBrowserEnv = "INTEGRATIONS_E2E_REQUIRE_BROWSER"
)

// chromiumPath is the system Chromium, or "" when there is none.
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser is one headless Chromium tab.
type browser struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	counter int
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv(requireBrowserEnv) == "1" {
			t.Fatalf("no chromium binary on PATH and %s=1: install Debian's chromium package", requireBrowserEnv)
		}
		t.Skipf("no chromium binary on PATH: the console's browser test needs one (set %s=1 to fail instead)", requireBrowserEnv)
	}
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	t.Logf("console screenshots: %s", dir)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1366, 768),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		// The e2e TLS pass serves the REST listener with a throwaway CA.
		chromedp.Flag("ignore-certificate-errors", true),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	// The first run starts the browser, under a context without a deadline (a deadline on it
	// would stop the browser); every later action has one of its own.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start chromium")
	return &browser{t: t, ctx: ctx, dir: dir}
}

// actionTimeout bounds one browser action, its waits included.
const actionTimeout = 30 * time.Second

func runAction[T any](b *browser, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, actionTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(b.t, err)
	return v
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	runAction(b, chromedp.Steps(steps...))
}

// open navigates to url and returns the HTTP status its document was answered with.
func (b *browser) open(url string) int {
	b.t.Helper()
	return int(runAction(b, chromedp.NavigateResponse(url)).Status)
}

// shot writes a full-page PNG of the current page and returns its path.
func (b *browser) shot(name string) string {
	b.t.Helper()
	png := runAction(b, chromedp.FullScreenshot(100))
	b.counter++
	path := filepath.Join(b.dir, fmt.Sprintf("%02d-%s.png", b.counter, name))
	require.NoError(b.t, os.WriteFile(path, png, 0o644))
	return path
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	return runAction(b, chromedp.Text(chromedp.CSS(sel)))
}

func (b *browser) count(sel string) int {
	b.t.Helper()
	return runAction(b, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
}

// login signs in through the form with the keyboard only: focus the field, type, Enter.
func (b *browser) login(base, token string) {
	b.t.Helper()
	b.do(chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Focus(chromedp.ID("token")), chromedp.SendKeys(chromedp.ID("token"), token+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS("nav")))
}

// TestConsoleInABrowser drives the console in headless Chromium against the real stack: an
// application signs in, finds the execution it just made (retried twice, completed through the
// callback API), reads its timeline hop by hop, redelivers its event and sees the new attempt,
// and cannot reach another application's execution; the operator sees both applications, the
// dead letters, the broker diagnostic and the audit entry of the redelivery.
func TestConsoleInABrowser(t *testing.T) {
	br := newBrowser(t)
	s := newStackScaled(t, eventsScale)
	// A lease long enough (scaled) that the callback completes attempt 3 before it expires.
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s)+`  - name: dummy.console
    adapter: dummy
    modes: [async]
    max_attempts: 5
    retry_delays: [1m]
    lease: 24h
`)
	keyB := "appb_" + randomHex(16)
	s.schema.ApplyCatalog(t, "applications:\n  - id: app-b\n    api_key: "+keyB+"\n")
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")
	hook := newHook(t)
	hook.register(t, s, s.APIKey)
	// The other application's receiver fails every delivery: its event dies (six attempts at the
	// scaled delays), for the operator to redrive.
	hookB := newHook(t)
	hookB.register(t, s, keyB)
	hookB.setAnswer(func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) })

	code, resp := s.call(http.MethodPost, "/v1/capabilities/dummy.fast:invoke", keyB, []byte(`{"mode": "MODE_ASYNC", "payload": {}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", resp)
	theirs := execution(resp)["id"].(string)
	code, resp = s.call(http.MethodPost, "/v1/capabilities/dummy.console:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "idempotency_key": "console-1", "payload": {"dummy": {"fail_transient": 2, "complete_later_ms": 300}}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", resp)
	id := execution(resp)["id"].(string)
	receiveFor(t, hook.arrived, id)
	require.Eventually(t, func() bool {
		ev := s.eventOf(t, s.APIKey, id)
		return ev != nil && ev["status"] == "EVENT_STATUS_DELIVERED"
	}, 30*time.Second, 20*time.Millisecond, "the delivery is recorded")
	// The REST API has the console's filters too: the admin token lists across applications.
	code, body := s.call(http.MethodGet, "/v1/executions?query=console-&created_after="+url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)), s.APIKey, nil)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["executions"], 1)
	assert.Equal(t, id, body["executions"].([]any)[0].(map[string]any)["id"])
	code, body = s.call(http.MethodGet, "/v1/executions?application_id=app-b", adminToken, nil)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["executions"], 1)
	assert.Equal(t, theirs, body["executions"].([]any)[0].(map[string]any)["id"])
	code, body = s.call(http.MethodGet, "/v1/executions?application_id=app-b", s.APIKey, nil)
	assert.Equal(t, http.StatusBadRequest, code, "an application names only itself: %v", body)

	base := s.RESTURL
	link := func(id string) chromedp.CSS { return chromedp.CSS(`a[href="/console/executions/` + id + `"]`) }

	// Sign-in, keyboard only.
	br.do(chromedp.Navigate(base+"/console/executions"), chromedp.WaitVisible(chromedp.ID("token")))
	br.shot("login")
	br.login(base, s.APIKey)

	// The executions page lists the execution just made, and not the other application's.
	br.do(chromedp.Navigate(base+"/console/executions"), chromedp.WaitVisible(link(id)))
	main := br.text("main")
	assert.Contains(t, main, "console-1", "its idempotency key")
	assert.NotContains(t, main, theirs, "another application's execution is not listed")
	br.shot("executions")
	// Keyboard first: the first Tab reaches the skip link, which moves focus to the content.
	assert.Equal(t, "en", runAction(br, chromedp.Evaluate[string](`document.documentElement.lang`)))
	br.do(chromedp.KeyEvent(kb.Tab))
	assert.Equal(t, "skip", runAction(br, chromedp.Evaluate[string](`document.activeElement.className`)), "the skip link comes first")
	br.do(chromedp.KeyEvent(kb.Enter))
	assert.Equal(t, "main", runAction(br, chromedp.Evaluate[string](`document.activeElement.id`)), "the skip link moves focus to the content")
	br.do(chromedp.Navigate(base+"/console/executions?q=console-"), chromedp.WaitVisible(link(id)))

	// Its timeline: every hop, in order, on one axis.
	br.do(chromedp.Click(link(id)), chromedp.WaitVisible(chromedp.CSS("table.timeline")))
	rows := runAction(br, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("tr.entry")).map(r => r.dataset.kind + (r.dataset.attempt !== "0" ? " " + r.dataset.attempt : ""))`))
	// The progress report at its own time, within attempt 3, before the callback's completion.
	want := []string{"accepted", "attempt started 1", "attempt ended 1", "attempt started 2", "attempt ended 2",
		"attempt started 3", "progress 3", "attempt ended 3", "settled 3", "event", "delivery"}
	require.Equal(t, want, withoutRenewals(rows), "each hop in order")
	assert.Contains(t, br.text(`tr.entry[data-kind="progress"]`), `"percent":50`, "the progress the adapter reported")
	assert.Contains(t, br.text(`tr.entry[data-kind="attempt ended"][data-attempt="3"]`), "succeeded", "attempt 3 completed through the callback")
	// The axis spreads the entries over the span: the first at its start, the last at its end.
	span := runAction(br, chromedp.Evaluate[[]float64](`(() => { const t = document.querySelectorAll(".axis .tick"), a = document.querySelector(".axis").getBoundingClientRect(); return [t[0].getBoundingClientRect().left - a.left, t[t.length-1].getBoundingClientRect().left - a.left, a.width]; })()`))
	assert.Less(t, span[0], 0.05*span[2], "the accept at the axis' start")
	assert.Greater(t, span[1], 0.9*span[2], "the delivery at its end")
	timeline := br.text("table.timeline")
	assert.Contains(t, timeline, "console-1", "the accept's idempotency key")
	assert.Contains(t, timeline, "transient", "the failed attempts' error class")
	assert.Contains(t, timeline, "HTTP 204", "the delivery's status code")
	assert.Equal(t, len(rows), br.count(".axis .tick"), "one tick per entry on the axis")
	br.shot("timeline")

	// Its event: redeliver it (confirm page, then POST) and see the new attempt.
	href := runAction(br, chromedp.AttributeValue(chromedp.CSS(`tr.entry[data-kind="event"] a`), "href"))
	require.True(t, href.Exists, "the event links to its page")
	eventHref := href.Value
	eventLink := chromedp.CSS(`a[href="` + eventHref + `"]`)
	br.do(chromedp.Navigate(base+"/console/events"), chromedp.WaitVisible(eventLink))
	br.shot("events")
	br.do(chromedp.Click(eventLink), chromedp.WaitVisible(chromedp.ID("deliveries")))
	before := br.count("#deliveries tr.delivery")
	require.Equal(t, 1, before, "one delivery so far")
	br.shot("event")
	br.do(chromedp.Click(chromedp.CSS(`a[href="`+eventHref+`/redeliver"]`)), chromedp.WaitVisible(chromedp.ID("confirm")))
	assert.Contains(t, br.text("#what"), "delivered again")
	br.shot("redeliver-confirm")
	br.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.ID("deliveries")))
	receiveFor(t, hook.arrived, id)
	require.Eventually(t, func() bool {
		br.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("deliveries")))
		return br.count("#deliveries tr.delivery") == before+1
	}, 30*time.Second, 100*time.Millisecond, "the redelivery's attempt appears on the event page")
	br.shot("event-redelivered")

	// Cancel a running execution (the adapter would complete it in ten minutes) from its page:
	// the confirm page, then the POST; its timeline then says cancelled. Made only now: its
	// deadline is scaled down with the rest.
	code, resp = s.call(http.MethodPost, "/v1/capabilities/dummy.console:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "idempotency_key": "cancel-me", "payload": {"dummy": {"complete_later_ms": 600000}}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", resp)
	toCancel := execution(resp)["id"].(string)
	require.Eventually(t, func() bool {
		code, body := s.call(http.MethodGet, "/v1/executions/"+toCancel, s.APIKey, nil)
		return code == http.StatusOK && execution(body)["status"] == "EXECUTION_STATUS_RUNNING"
	}, 30*time.Second, 20*time.Millisecond, "the execution to cancel is running")
	br.do(chromedp.Navigate(base+"/console/executions/"+toCancel), chromedp.WaitVisible(chromedp.ID("cancel")))
	br.do(chromedp.Click(chromedp.ID("cancel")), chromedp.WaitVisible(chromedp.ID("confirm")))
	assert.Contains(t, br.text("#what"), "execution of dummy.console")
	br.shot("cancel-confirm")
	br.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS("table.timeline")))
	assert.Contains(t, br.text(".facts"), "cancelled")
	assert.Contains(t, br.text(`tr.entry[data-kind="settled"]`), "cancelled")
	assert.Equal(t, 0, br.count("#cancel"), "nothing left to cancel")
	br.shot("cancelled")

	// Another application's execution by URL: a 404 page, none of its data.
	assert.Equal(t, http.StatusNotFound, br.open(base+"/console/executions/"+theirs))
	br.do(chromedp.WaitVisible(chromedp.ID("problem")))
	notFound := br.text("main")
	assert.NotContains(t, notFound, "app-b")
	assert.NotContains(t, notFound, "dummy.fast")
	br.shot("other-application-404")
	br.do(chromedp.Navigate(base+"/console/audit"), chromedp.WaitVisible(chromedp.ID("audit")))
	appAudit := br.text("#audit")
	assert.Contains(t, appAudit, "event.redeliver")
	assert.Contains(t, appAudit, "execution.cancel")
	br.shot("audit-application")

	// Sign out (the form's button), then the operator.
	br.do(chromedp.Click(chromedp.CSS(`form.who button`)), chromedp.WaitVisible(chromedp.ID("token")))
	br.login(base, adminToken)
	br.do(chromedp.Navigate(base+"/console/executions"), chromedp.WaitVisible(link(theirs)), chromedp.WaitVisible(link(id)))
	assert.Equal(t, "app-b", runAction(br, chromedp.Evaluate[string](`document.querySelector('a[href="/console/executions/`+theirs+`"]').closest("tr").querySelector("td.app").textContent`)),
		"the Application column")
	br.shot("operator-executions")
	br.do(chromedp.Navigate(base+"/console/executions/"+theirs), chromedp.WaitVisible(chromedp.CSS("table.timeline")))
	assert.Contains(t, br.text("main"), "app-b")
	br.shot("operator-timeline")
	br.do(chromedp.Navigate(base+"/console/dead-letters"), chromedp.WaitVisible(chromedp.ID("route-executions")),
		chromedp.WaitVisible(chromedp.ID("route-events")))
	assert.NotContains(t, br.text("main"), "could not be read", "the broker answered")
	br.shot("dead-letters")

	// The other application's dead event: listed for the operator with its application, then
	// redriven after the preview count, and delivered.
	require.Eventually(t, func() bool {
		ev := s.eventOf(t, keyB, theirs)
		return ev != nil && ev["status"] == "EVENT_STATUS_DEAD"
	}, 30*time.Second, 50*time.Millisecond, "app-b's event is dead")
	br.do(chromedp.Navigate(base+"/console/events?status=dead&application=app-b"), chromedp.WaitVisible(chromedp.CSS("td.app")))
	assert.Contains(t, br.text("main table"), "app-b")
	assert.Contains(t, br.text("main table"), theirs, "the dead event of app-b's execution")
	br.shot("operator-events")
	br.do(chromedp.Click(chromedp.CSS(`form[action="/console/events/redrive"] button`)), chromedp.WaitVisible(chromedp.ID("confirm")))
	assert.Contains(t, br.text("#what"), "Redrive 1 dead events of application app-b")
	br.shot("operator-redrive-confirm")
	hookB.setAnswer(nil)
	br.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS("main table")))
	require.Eventually(t, func() bool { return s.eventOf(t, keyB, theirs)["status"] == "EVENT_STATUS_DELIVERED" },
		30*time.Second, 20*time.Millisecond, "the redriven event is delivered")

	br.do(chromedp.Navigate(base+"/console/diagnostic"), chromedp.Click(chromedp.ID("run")), chromedp.WaitVisible(chromedp.ID("diagnosis")))
	diag := br.text("#diagnosis")
	assert.Contains(t, diag, "executions")
	assert.Contains(t, diag, "events")
	br.shot("diagnostic")
	br.do(chromedp.Navigate(base+"/console/audit"), chromedp.WaitVisible(chromedp.ID("audit")))
	audit := br.text("#audit")
	assert.Contains(t, audit, "event.redeliver")
	assert.Contains(t, audit, strings.TrimPrefix(eventHref, "/console/events/"), "the redelivered event")
	assert.Contains(t, audit, "diagnostic.run")
	assert.Contains(t, audit, "execution.cancel")
	assert.Contains(t, audit, "dead events of application app-b")
	br.shot("audit-operator")
}

// withoutRenewals drops lease renewals, which come or not with the machine's speed.
func withoutRenewals(rows []string) []string {
	var out []string
	for _, r := range rows {
		if !strings.HasPrefix(r, "lease renewed") {
			out = append(out, r)
		}
	}
	return out
}
