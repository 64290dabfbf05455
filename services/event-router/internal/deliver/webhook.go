package deliver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/telemetry"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/event-router/internal/store"
)

// maxReadBody bounds how much of a consumer's answer is read.
const maxReadBody = 64 << 10

// webhookClient posts events to webhooks.
type webhookClient struct {
	client *http.Client
	policy webhook.Policy
}

// newWebhookClient returns a client whose every connection is checked by policy after name
// resolution (resolver; nil: the system's), so a public name that resolves to a private address
// (DNS rebinding) is never connected to. Redirects are never followed — a 3xx is a failed attempt
// — so an answer cannot send the router on to an address the URL did not name; no proxy from the
// environment is used (Proxy is nil), so the address checked is the address connected.
//
// Host names are resolved rooted (webhook.RootedDial): never under the search domains of the
// router's own network, so that a name existing only inside the cluster fails as dns, like a name
// that exists nowhere, rather than as refused_address. The TLS server name and the Host header
// come from the URL, not from the dialled address, so they keep the name as registered.
func newWebhookClient(timeout time.Duration, policy webhook.Policy, resolver *net.Resolver) *webhookClient {
	dialer := &net.Dialer{Timeout: timeout, Resolver: resolver, Control: policy.Control}
	transport := &http.Transport{DialContext: webhook.RootedDial(dialer.DialContext), MaxIdleConnsPerHost: 8, IdleConnTimeout: 90 * time.Second}
	return &webhookClient{policy: policy, client: &http.Client{Timeout: timeout, Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// post delivers ev to the webhook at url once. Only a 2xx answer within the timeout counts
// (redirects are not followed, so a 3xx is a failure); the answer is read up to maxReadBody.
//
// The URL is checked against the policy first: the stored endpoint may not have come through the
// gateway's registration (an older row, a row written by hand), and a refused one is not dialled.
func (c *webhookClient) post(ctx context.Context, url string, secrets []string, ev *store.Delivery, scale float64) result {
	if _, err := c.policy.CheckURL(url); err != nil {
		return result{err: fmt.Errorf("webhook URL: %w", err), category: webhook.CategoryRefusedAddress}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(ev.Payload))
	if err != nil {
		return result{err: fmt.Errorf("build request: %w", err), category: webhook.CategoryOther}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "integrations-event-router/1")
	// The receiver may continue the execution's trace: the delivery's span is the parent.
	telemetry.InjectHTTP(ctx, req.Header)
	if err := webhooks.SetHeaders(req.Header, secrets, ev.EventID, time.Now(), ev.Payload); err != nil {
		return result{err: err, category: webhook.CategoryOther}
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return result{err: fmt.Errorf("post webhook: %w", err), category: category(err)}
	}
	defer func() { _ = resp.Body.Close() }()
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, maxReadBody))
	res := result{statusCode: resp.StatusCode, body: safetext.Truncate(string(body[:min(len(body), maxStoredBody)]), maxStoredBody)}
	switch {
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		res.err = fmt.Errorf("webhook answered %d", resp.StatusCode)
		res.category = webhook.CategoryHTTPStatus
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), responseTime(resp.Header, time.Now())); ok {
				res.retryAfter = time.Duration(float64(ra) * scale)
			}
		}
	case readErr != nil:
		// A 2xx whose answer did not arrive within the timeout does not count.
		res.err = fmt.Errorf("read webhook answer: %w", readErr)
		res.category = category(readErr)
	}
	return res
}

// responseTime is the time an HTTP date in the answer is relative to: the answer's own Date, when
// it has a valid one, so that a Retry-After date means the delay the receiver meant whatever the
// two hosts' clocks say (RFC 9110 §10.2.3); this host's now otherwise. The delay then becomes a
// next_attempt_at computed by the database, from its own now().
func responseTime(h http.Header, now time.Time) time.Time {
	if t, err := http.ParseTime(h.Get("Date")); err == nil {
		return t
	}
	return now
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 || secs > int64(365*24*time.Hour/time.Second) {
			return 0, false
		}
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
