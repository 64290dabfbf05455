package console

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	executionv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/execution/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/services/gateway/internal/audit"
	"github.com/integrations-platform/integrations/services/gateway/internal/ratelimit"
	"github.com/integrations-platform/integrations/services/gateway/internal/server"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
	"github.com/integrations-platform/integrations/services/gateway/internal/system"
)

// pageSize is how many rows a list page shows.
const pageSize = 50

// timeLayouts are the times a filter takes: the browser's datetime-local value (UTC, as the
// console shows every time), with or without seconds, or RFC 3339.
var timeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339Nano}

// parseTime reads the optional time filter field of q.
func parseTime(q url.Values, field string) (*timestamppb.Timestamp, error) {
	v := strings.TrimSpace(q.Get(field))
	if v == "" {
		return nil, nil
	}
	for _, layout := range timeLayouts {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			return timestamppb.New(t), nil
		}
	}
	return nil, &badInput{field, "not a time: use 2026-01-02T15:04 (UTC) or RFC 3339"}
}

// --- sign-in ---

type loginData struct{ Next string }

func (h *handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, err := h.session(r); err == nil {
		http.Redirect(w, r, Prefix+"executions", http.StatusSeeOther)
		return
	}
	h.render(w, http.StatusOK, "login", view{Title: "Sign in", Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}})
}

// safeNext is where to go after signing in: a console page, never another site.
func safeNext(next string) string {
	if strings.HasPrefix(next, Prefix) && !strings.HasPrefix(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		return next
	}
	return Prefix + "executions"
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		h.render(w, http.StatusBadRequest, "login", view{Title: "Sign in", Error: "The form could not be read.", Data: loginData{Next: Prefix + "executions"}})
		return
	}
	next := safeNext(r.PostFormValue("next"))
	token := strings.TrimSpace(r.PostFormValue("token"))
	refuse := func(code int, msg string) {
		h.render(w, code, "login", view{Title: "Sign in", Error: msg, Data: loginData{Next: next}})
	}
	if token == "" {
		refuse(http.StatusBadRequest, "API key or admin token: required.")
		return
	}
	csrf, err := newCSRF()
	if err != nil {
		h.fail(w, r, nil, http.StatusInternalServerError, "Could not start a session.")
		return
	}
	s := &session{ID: uuid.NewString(), CSRF: csrf, Expires: h.cfg.Now().Add(h.cfg.SessionTTL)}
	err = h.cfg.Failures.Guard(r.Context(), ratelimit.SourceOfRequest(r), token, func() error {
		if isAdminToken(token, h.cfg.AdminToken) {
			s.Role, s.AdminHash = roleOperator, adminHash(h.cfg.AdminToken)
			return nil
		}
		app, ref, err := server.AuthenticateKey(r.Context(), h.cfg.Store, token)
		if err != nil {
			return err
		}
		s.Role, s.Application, s.Key = roleApplication, app, &ref
		return nil
	})
	if err != nil {
		e, ok := apperr.As(err)
		switch {
		case ok && e.Kind == apperr.KindResourceExhausted:
			w.Header().Set("Retry-After", ratelimit.RetryAfterSeconds(e.RetryAfter))
			refuse(http.StatusTooManyRequests, "Not signed in: too many failed sign-ins; try again in "+ratelimit.RetryAfterSeconds(e.RetryAfter)+" s.")
		case ok && e.Kind == apperr.KindUnauthenticated:
			refuse(http.StatusUnauthorized, loginRefusal(e.Message))
		default:
			h.failAPI(w, r, nil, err)
		}
		return
	}
	value, err := seal(h.cfg.Box, s)
	if err != nil {
		h.cfg.Logger.Error("console session not sealed", zap.Error(err))
		h.fail(w, r, nil, http.StatusInternalServerError, "Could not start a session.")
		return
	}
	h.setCookie(w, r, value, s.Expires)
	h.record(r.Context(), s, "login")
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// loginRefusal is what a refused sign-in says. A well-formed key that is unknown, revoked or
// expired gets one answer: which of them it is would tell someone holding an old key that it
// once was one. A malformed one (too long, a broken checksum) says so: that tells nothing the
// key's own form does not.
func loginRefusal(reason string) string {
	if strings.HasPrefix(reason, "malformed") {
		return "Not signed in: " + reason + "."
	}
	return "Not signed in: not a valid API key or admin token (unknown, revoked or expired)."
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request, s *session) {
	h.setCookie(w, r, "", time.Time{})
	if err := h.cfg.Store.ConsoleSessionEnd(context.WithoutCancel(r.Context()), s.ID, s.Expires); err != nil {
		h.cfg.Logger.Error("console session end not recorded", zap.Error(err))
		h.fail(w, r, nil, http.StatusServiceUnavailable, "Signing out could not be recorded: this browser's cookie is gone, but a copy of it would still work. Sign in and out again.")
		return
	}
	h.record(r.Context(), s, "logout")
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// --- executions ---

type executionsData struct {
	Filter     url.Values
	Statuses   []execution.Status
	Executions []*executionv1.Execution
	Next       string
}

func (h *handler) executions(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	req, err := executionsRequest(q, s)
	if err != nil {
		if b, ok := asBadInput(err); ok {
			h.fail(w, r, s, http.StatusBadRequest, b.Error())
			return
		}
		h.failAPI(w, r, s, err)
		return
	}
	resp, err := h.cfg.API.ListExecutions(as(r.Context(), s), req)
	if err != nil {
		h.failAPI(w, r, s, err)
		return
	}
	d := executionsData{Filter: q, Executions: resp.GetExecutions(), Next: nextPage("executions", q, resp.GetNextPageToken()),
		Statuses: []execution.Status{execution.StatusPending, execution.StatusRunning, execution.StatusSucceeded, execution.StatusFailed, execution.StatusCancelled}}
	h.render(w, http.StatusOK, "executions", view{Title: "Executions", Nav: "executions", Session: s, Data: d})
}

// nextPage is the link to the list page after this one, q's filters kept; none without a token.
func nextPage(page string, q url.Values, token string) string {
	if token == "" {
		return ""
	}
	next := maps.Clone(q)
	next.Set("page", token)
	return Prefix + page + "?" + next.Encode()
}

// executionsRequest reads the executions page's filters.
func executionsRequest(q url.Values, s *session) (*gatewayv1.ListExecutionsRequest, error) {
	req := &gatewayv1.ListExecutionsRequest{PageSize: pageSize, PageToken: q.Get("page"),
		Capability: strings.TrimSpace(q.Get("capability")), Query: strings.TrimSpace(q.Get("q"))}
	if v := q.Get("status"); v != "" {
		if req.Status = execution.StatusToProto(execution.Status(v)); req.Status == executionv1.ExecutionStatus_EXECUTION_STATUS_UNSPECIFIED {
			return nil, &badInput{"status", fmt.Sprintf("%q is not a status: one of pending, running, succeeded, failed, cancelled", v)}
		}
	}
	var err error
	if req.ApplicationId, err = applicationFilter(q, s); err != nil {
		return nil, err
	}
	if req.CreatedAfter, err = parseTime(q, "created_from"); err != nil {
		return nil, err
	}
	if req.CreatedBefore, err = parseTime(q, "created_to"); err != nil {
		return nil, err
	}
	return req, nil
}

// applicationFilter is the application field of q: the operator's narrowing of a list or a
// redrive to one application; an application names none (its own is implied).
func applicationFilter(q url.Values, s *session) (string, error) {
	v := strings.TrimSpace(q.Get("application"))
	if v != "" && s.Role != roleOperator {
		return "", &badInput{"application", "only the operator filters by application"}
	}
	return v, nil
}

// --- timeline ---

// timelineRow is one entry of the timeline, placed on the page's time axis.
type timelineRow struct {
	*gatewayv1.TimelineEntry
	Offset time.Duration // since the accept
	Pct    float64       // position on the axis, 0..100
}

type timelineData struct {
	Timeline *gatewayv1.GetExecutionTimelineResponse
	Rows     []timelineRow
	Span     time.Duration
}

func (h *handler) timeline(w http.ResponseWriter, r *http.Request, s *session) {
	tl, ok := h.getTimeline(w, r, s)
	if !ok {
		return
	}
	d := timelineData{Timeline: tl}
	entries := tl.GetEntries()
	if len(entries) > 0 {
		start := entries[0].GetAt().AsTime()
		d.Span = entries[len(entries)-1].GetAt().AsTime().Sub(start)
		for _, e := range entries {
			off := e.GetAt().AsTime().Sub(start)
			row := timelineRow{TimelineEntry: e, Offset: off}
			if d.Span > 0 {
				row.Pct = 100 * float64(off) / float64(d.Span)
			}
			d.Rows = append(d.Rows, row)
		}
	}
	h.render(w, http.StatusOK, "timeline", view{Title: "Execution " + r.PathValue("id"), Nav: "executions", Session: s, Data: d})
}

// getTimeline is the timeline of the execution the path names: the timeline page's, and the cancel
// pages' (its header).
func (h *handler) getTimeline(w http.ResponseWriter, r *http.Request, s *session) (*gatewayv1.GetExecutionTimelineResponse, bool) {
	id := r.PathValue("id")
	if uuid.Validate(id) != nil {
		h.fail(w, r, s, http.StatusBadRequest, "id: not an execution id")
		return nil, false
	}
	tl, err := h.cfg.API.GetExecutionTimeline(as(r.Context(), s), &gatewayv1.GetExecutionTimelineRequest{Id: id})
	if err != nil {
		h.failAPI(w, r, s, err)
		return nil, false
	}
	return tl, true
}

// --- cancel ---

func (h *handler) cancelConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	tl, ok := h.getTimeline(w, r, s)
	if !ok {
		return
	}
	id, st := tl.GetExecutionId(), execution.StatusFromProto(tl.GetStatus())
	d := confirmData{
		Heading: "Cancel execution " + id,
		What: fmt.Sprintf("The %s execution of %s (application %s) is settled cancelled; a running attempt's adapter is asked to stop. The completion event is delivered as for any settlement.",
			st, tl.GetCapability(), tl.GetApplicationId()),
		Action: Prefix + "executions/" + id + "/cancel", Button: "Cancel the execution", Back: Prefix + "executions/" + id,
	}
	if st.IsFinal() {
		d.What, d.Nothing = fmt.Sprintf("The execution is already settled %s: it cannot be cancelled.", st), true
	}
	h.render(w, http.StatusOK, "confirm", view{Title: "Cancel execution", Nav: "executions", Session: s, Data: d})
}

func (h *handler) cancel(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if uuid.Validate(id) != nil {
		h.fail(w, r, s, http.StatusBadRequest, "id: not an execution id")
		return
	}
	if _, err := h.cfg.API.CancelExecution(as(r.Context(), s), &gatewayv1.CancelExecutionRequest{Id: id}); err != nil {
		h.failAPI(w, r, s, err)
		return
	}
	http.Redirect(w, r, Prefix+"executions/"+id, http.StatusSeeOther)
}

// --- events ---

type eventsData struct {
	Filter url.Values
	Events []*eventsv1.Event
	Next   string
}

var eventStatuses = map[string]eventsv1.EventStatus{
	"pending": eventsv1.EventStatus_EVENT_STATUS_PENDING, "delivered": eventsv1.EventStatus_EVENT_STATUS_DELIVERED,
	"dead": eventsv1.EventStatus_EVENT_STATUS_DEAD,
}

func (h *handler) events(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	req := &gatewayv1.ListEventsRequest{PageSize: pageSize, PageToken: q.Get("page"), ExecutionId: strings.TrimSpace(q.Get("execution_id"))}
	var err error
	if req.ApplicationId, err = applicationFilter(q, s); err != nil {
		h.fail(w, r, s, http.StatusBadRequest, err.Error())
		return
	}
	if v := q.Get("status"); v != "" {
		st, ok := eventStatuses[v]
		if !ok {
			h.fail(w, r, s, http.StatusBadRequest, fmt.Sprintf("status: %q is not an event status: one of pending, delivered, dead", v))
			return
		}
		req.Status = st
	}
	if req.Since, err = parseTime(q, "since"); err == nil {
		req.Until, err = parseTime(q, "until")
	}
	if b, ok := asBadInput(err); ok {
		h.fail(w, r, s, http.StatusBadRequest, b.Error())
		return
	}
	resp, err := h.cfg.API.ListEvents(as(r.Context(), s), req)
	if err != nil {
		h.failAPI(w, r, s, err)
		return
	}
	d := eventsData{Filter: q, Events: resp.GetEvents(), Next: nextPage("events", q, resp.GetNextPageToken())}
	h.render(w, http.StatusOK, "events", view{Title: "Events", Nav: "events", Session: s, Data: d})
}

func (h *handler) getEvent(w http.ResponseWriter, r *http.Request, s *session) (*eventsv1.Event, bool) {
	id := r.PathValue("id")
	if uuid.Validate(id) != nil {
		h.fail(w, r, s, http.StatusBadRequest, "id: not an event id")
		return nil, false
	}
	resp, err := h.cfg.API.GetEvent(as(r.Context(), s), &gatewayv1.GetEventRequest{Id: id})
	if err != nil {
		h.failAPI(w, r, s, err)
		return nil, false
	}
	return resp.GetEvent(), true
}

func (h *handler) event(w http.ResponseWriter, r *http.Request, s *session) {
	ev, ok := h.getEvent(w, r, s)
	if !ok {
		return
	}
	h.render(w, http.StatusOK, "event", view{Title: "Event " + ev.GetId(), Nav: "events", Session: s, Data: ev})
}

// confirmData is a confirmation page: what will happen, and the form that does it.
type confirmData struct {
	Heading string
	What    string
	Action  string
	Fields  map[string]string
	Button  string
	Back    string
	// Nothing is set when there is nothing to do: the page says so and shows no button.
	Nothing bool
}

func (h *handler) redeliverConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	ev, ok := h.getEvent(w, r, s)
	if !ok {
		return
	}
	h.render(w, http.StatusOK, "confirm", view{Title: "Redeliver event", Nav: "events", Session: s, Data: confirmData{
		Heading: "Redeliver event " + ev.GetId(),
		What: fmt.Sprintf("The %s event of execution %s (now %s, %d attempts made) becomes pending with a fresh attempt budget and is delivered again. Its delivery history is kept; the receiver sees the same event id.",
			ev.GetType(), ev.GetExecutionId(), eventStatusName(ev.GetStatus()), ev.GetAttempts()),
		Action: Prefix + "events/" + ev.GetId() + "/redeliver", Button: "Redeliver", Back: Prefix + "events/" + ev.GetId(),
	}})
}

func (h *handler) redeliver(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if uuid.Validate(id) != nil {
		h.fail(w, r, s, http.StatusBadRequest, "id: not an event id")
		return
	}
	if _, err := h.cfg.API.RedeliverEvent(as(r.Context(), s), &gatewayv1.RedeliverEventRequest{Id: id}); err != nil {
		h.failAPI(w, r, s, err)
		return
	}
	http.Redirect(w, r, Prefix+"events/"+id, http.StatusSeeOther)
}

func (h *handler) redriveRequest(w http.ResponseWriter, r *http.Request, s *session, form url.Values) (*gatewayv1.RedriveEventsRequest, bool) {
	since, err := parseTime(form, "since")
	if err != nil {
		h.fail(w, r, s, http.StatusBadRequest, err.Error())
		return nil, false
	}
	app, err := applicationFilter(form, s)
	if err != nil {
		h.fail(w, r, s, http.StatusBadRequest, err.Error())
		return nil, false
	}
	return &gatewayv1.RedriveEventsRequest{Since: since, ApplicationId: app}, true
}

// redriveScope says whose dead events a redrive takes, for its confirmation.
func redriveScope(s *session, req *gatewayv1.RedriveEventsRequest) string {
	switch {
	case s.Role != roleOperator:
		return "this application"
	case req.GetApplicationId() != "":
		return "application " + req.GetApplicationId()
	default:
		return "every application"
	}
}

func (h *handler) redriveConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	req, ok := h.redriveRequest(w, r, s, r.URL.Query())
	if !ok {
		return
	}
	req.ValidateOnly = true
	resp, err := h.cfg.API.RedriveEvents(as(r.Context(), s), req)
	if err != nil {
		h.failAPI(w, r, s, err)
		return
	}
	since := "ever"
	fields := map[string]string{}
	if req.GetSince() != nil {
		since = req.GetSince().AsTime().UTC().Format(time.RFC3339)
		fields["since"] = since
	}
	if req.GetApplicationId() != "" {
		fields["application"] = req.GetApplicationId()
	}
	h.render(w, http.StatusOK, "confirm", view{Title: "Redrive dead events", Nav: "events", Session: s, Data: confirmData{
		Heading: "Redrive dead events",
		What: fmt.Sprintf("Redrive %d dead events of %s created since %s: each becomes pending with a fresh attempt budget and is delivered again.",
			resp.GetCount(), redriveScope(s, req), since),
		Action: Prefix + "events/redrive", Fields: fields, Button: fmt.Sprintf("Redrive %d events", resp.GetCount()),
		Back: Prefix + "events?status=dead", Nothing: resp.GetCount() == 0,
	}})
}

func (h *handler) redrive(w http.ResponseWriter, r *http.Request, s *session) {
	req, ok := h.redriveRequest(w, r, s, r.PostForm)
	if !ok {
		return
	}
	if _, err := h.cfg.API.RedriveEvents(as(r.Context(), s), req); err != nil {
		h.failAPI(w, r, s, err)
		return
	}
	http.Redirect(w, r, Prefix+"events?status=pending", http.StatusSeeOther)
}

// --- operator: dead letters, diagnostic ---

// deadLetterLimit is how many of a route's dead letters the page lists (and counts for a
// redrive's preview).
const deadLetterLimit = 200

type deadLettersData struct {
	Routes []routeDeadLetters
}

type routeDeadLetters struct {
	Route   string
	Letters []system.DeadLetter
	Error   string
	More    bool
}

func (h *handler) deadLetters(w http.ResponseWriter, r *http.Request, s *session) {
	var d deadLettersData
	for _, route := range system.Routes() {
		list, err := system.DeadLetters(r.Context(), h.cfg.System, route, deadLetterLimit)
		rd := routeDeadLetters{Route: route, Letters: list, More: len(list) == deadLetterLimit}
		if err != nil {
			h.cfg.Logger.Warn("console dead letters not read", zap.String("route", route), zap.Error(err))
			rd.Error = "the broker could not be read: " + err.Error()
		}
		d.Routes = append(d.Routes, rd)
	}
	h.render(w, http.StatusOK, "deadletters", view{Title: "Dead letters", Nav: "dead-letters", Session: s, Data: d})
}

func routeParam(w http.ResponseWriter, r *http.Request, h *handler, s *session, v string) (string, bool) {
	for _, route := range system.Routes() {
		if v == route {
			return route, true
		}
	}
	h.fail(w, r, s, http.StatusBadRequest, fmt.Sprintf("route: %q is not a route: one of %s", v, strings.Join(system.Routes(), ", ")))
	return "", false
}

func (h *handler) deadLetterRedriveConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	route, ok := routeParam(w, r, h, s, r.URL.Query().Get("route"))
	if !ok {
		return
	}
	list, err := system.DeadLetters(r.Context(), h.cfg.System, route, deadLetterLimit)
	if err != nil {
		h.fail(w, r, s, http.StatusServiceUnavailable, "The broker could not be read: "+err.Error())
		return
	}
	count := strconv.Itoa(len(list))
	if len(list) == deadLetterLimit {
		count = "at least " + count
	}
	h.render(w, http.StatusOK, "confirm", view{Title: "Redrive dead letters", Nav: "dead-letters", Session: s, Data: confirmData{
		Heading: "Redrive the " + route + " route's dead letters",
		What:    fmt.Sprintf("Move %s dead letters of the %s route back to its work queue, each with a fresh attempt budget.", count, route),
		Action:  Prefix + "dead-letters/redrive", Fields: map[string]string{"route": route},
		Button: "Redrive " + route + " dead letters", Back: Prefix + "dead-letters", Nothing: len(list) == 0,
	}})
}

func (h *handler) deadLetterRedrive(w http.ResponseWriter, r *http.Request, s *session) {
	route, ok := routeParam(w, r, h, s, r.PostFormValue("route"))
	if !ok {
		return
	}
	if _, err := system.RedriveDeadLetters(audit.ViaConsole(r.Context()), h.cfg.System, route, nil); err != nil {
		h.fail(w, r, s, http.StatusServiceUnavailable, "The broker could not be reached: "+err.Error())
		return
	}
	http.Redirect(w, r, Prefix+"dead-letters", http.StatusSeeOther)
}

type diagnosticData struct {
	Ran     bool
	Results []mq.Diagnosis
	Error   string
}

func (h *handler) diagnosticPage(w http.ResponseWriter, r *http.Request, s *session) {
	h.render(w, http.StatusOK, "diagnostic", view{Title: "Broker diagnostic", Nav: "diagnostic", Session: s})
}

func (h *handler) diagnostic(w http.ResponseWriter, r *http.Request, s *session) {
	d := diagnosticData{Ran: true}
	results, err := system.Diagnose(audit.ViaConsole(r.Context()), h.cfg.System)
	d.Results = results
	if err != nil {
		d.Error = err.Error()
	}
	h.render(w, http.StatusOK, "diagnostic", view{Title: "Broker diagnostic", Nav: "diagnostic", Session: s, Data: d})
}

// --- audit ---

type auditData struct {
	Entries []store.AuditEntry
	Next    string
}

func (h *handler) audit(w http.ResponseWriter, r *http.Request, s *session) {
	var before int64
	if v := r.URL.Query().Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			h.fail(w, r, s, http.StatusBadRequest, "before: not an audit entry number")
			return
		}
		before = n
	}
	list, err := h.cfg.Store.AuditList(r.Context(), s.actor(), before, pageSize)
	if err != nil {
		h.failAPI(w, r, s, err)
		return
	}
	d := auditData{Entries: list}
	if len(list) == pageSize {
		d.Next = Prefix + "audit?before=" + strconv.FormatInt(list[len(list)-1].ID, 10)
	}
	h.render(w, http.StatusOK, "audit", view{Title: "Audit log", Nav: "audit", Session: s, Data: d})
}
