package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

// GetExecutionTimeline implements GatewayService.GetExecutionTimeline: authorised like
// GetExecution (an application reads its own executions only, another's is NOT_FOUND), and the
// admin token reads any application's.
func (s *Server) GetExecutionTimeline(ctx context.Context, req *gatewayv1.GetExecutionTimelineRequest) (*gatewayv1.GetExecutionTimelineResponse, error) {
	if _, err := uuid.Parse(req.GetId()); err != nil {
		return nil, apperr.Invalid("id", "%s is not an execution id", jsonbound.Quote(req.GetId()))
	}
	app := applicationID(ctx)
	if isOperator(ctx) {
		app = store.AnyApplication
	} else if app == "" {
		// Never the operator's view by accident: an application call always names its application.
		return nil, apperr.Unauthenticated("no application for this call")
	}
	tl, err := s.store.ExecutionTimeline(ctx, app, req.GetId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, apperr.NotFound("execution %s not found", req.GetId())
	}
	if err != nil {
		return nil, err
	}
	return TimelineProto(tl), nil
}

// TimelineProto puts the store's history of an execution on one time axis.
func TimelineProto(tl *store.Timeline) *gatewayv1.GetExecutionTimelineResponse {
	e := tl.Execution
	var entries []*gatewayv1.TimelineEntry
	add := func(at time.Time, kind gatewayv1.TimelineEntryKind, en *gatewayv1.TimelineEntry) {
		en.At, en.Kind = timestamppb.New(at), kind
		entries = append(entries, en)
	}
	add(e.CreatedAt, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ACCEPTED, &gatewayv1.TimelineEntry{
		Mode: execution.ModeToProto(e.Mode), IdempotencyKey: deref(e.IdempotencyKey),
		Summary: fmt.Sprintf("accepted %s %s%s", e.Mode, e.Capability, keySummary(e.IdempotencyKey)),
	})
	// Only the execution's last progress value is stored: it is the report of the last attempt
	// that made any (attempts run one after another).
	lastReporter := int32(0)
	for _, a := range tl.Attempts {
		if a.ProgressReports > 0 && a.LastProgressAt != nil {
			lastReporter = a.N
		}
	}
	for _, a := range tl.Attempts {
		add(a.StartedAt, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_STARTED, &gatewayv1.TimelineEntry{
			Attempt: a.N, Summary: fmt.Sprintf("attempt %d started", a.N),
		})
		if a.Renewals > 0 && a.LastRenewedAt != nil {
			add(*a.LastRenewedAt, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_LEASE_RENEWED, &gatewayv1.TimelineEntry{
				Attempt: a.N, Renewals: a.Renewals,
				Summary: fmt.Sprintf("attempt %d lease renewed (%s in all; this is the last)", a.N, times(a.Renewals)),
			})
		}
		if a.ProgressReports > 0 && a.LastProgressAt != nil {
			en := &gatewayv1.TimelineEntry{Attempt: a.N, ProgressReports: a.ProgressReports,
				Summary: fmt.Sprintf("attempt %d reported progress (%s in all; this is the last)", a.N, times(a.ProgressReports))}
			if a.N == lastReporter && len(e.Progress) > 0 {
				if p, err := structFromJSON(e.Progress); err == nil {
					en.Progress = p
				}
			}
			add(*a.LastProgressAt, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_PROGRESS, en)
		}
		if a.EndedAt != nil || deref(a.Outcome) != "" {
			at := a.StartedAt
			if a.EndedAt != nil {
				at = *a.EndedAt
			}
			en := &gatewayv1.TimelineEntry{
				Attempt: a.N, Outcome: deref(a.Outcome), ErrorClass: deref(a.FailureClass),
				ErrorCode: deref(a.FailureCode), ErrorMessage: deref(a.FailureMessage),
				Duration: durationpb.New(at.Sub(a.StartedAt)),
			}
			en.Summary = fmt.Sprintf("attempt %d %s", a.N, orDash(en.Outcome))
			if en.ErrorClass != "" || en.ErrorMessage != "" {
				en.Summary += fmt.Sprintf(": %s %s", en.ErrorClass, en.ErrorMessage)
			}
			add(at, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_ATTEMPT_ENDED, en)
		}
		if a.LateOutcome != nil && a.LateAt != nil {
			add(*a.LateAt, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_LATE_OUTCOME, &gatewayv1.TimelineEntry{
				Attempt: a.N, Outcome: string(*a.LateOutcome),
				Summary: fmt.Sprintf("attempt %d late outcome %s (recorded, not applied)", a.N, *a.LateOutcome),
			})
		}
	}
	if lastReporter == 0 && len(e.Progress) > 0 {
		// A progress stored before reports were counted (migration 00018) has no time of its
		// own: it was reported no later than the execution's last change (its settlement, when
		// settled).
		at := e.UpdatedAt
		if e.SettledAt != nil && e.SettledAt.Before(at) {
			at = *e.SettledAt
		}
		en := &gatewayv1.TimelineEntry{Attempt: e.Attempt, Summary: "last progress reported (its time was not recorded)"}
		if p, err := structFromJSON(e.Progress); err == nil {
			en.Progress = p
		}
		add(at, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_PROGRESS, en)
	}
	if e.SettledAt != nil {
		en := &gatewayv1.TimelineEntry{
			Attempt: e.Attempt, Status: execution.StatusToProto(e.Status), ErrorClass: deref(e.FailureClass),
			Reason: deref(e.FailureReason), ErrorCode: deref(e.FailureCode), ErrorMessage: deref(e.FailureMessage),
		}
		en.Summary = "settled " + string(e.Status)
		if en.Reason != "" {
			en.Summary += " (" + en.Reason + ")"
		}
		add(*e.SettledAt, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_SETTLED, en)
	}
	for _, ev := range tl.Events {
		recorded := &gatewayv1.TimelineEntry{
			EventId: ev.ID, EventType: ev.Type, EventSequence: ev.Sequence, DeliveryStatus: string(ev.Status),
			Summary: fmt.Sprintf("event %s #%d recorded (%s)", ev.Type, ev.Sequence, ev.Status),
		}
		if len(ev.Progress) > 0 {
			if p, err := structFromJSON(ev.Progress); err == nil {
				recorded.Progress = p
			}
		}
		add(ev.CreatedAt, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_EVENT, recorded)
		for _, d := range ev.Deliveries {
			en := &gatewayv1.TimelineEntry{
				EventId: ev.ID, EventType: ev.Type, EventSequence: ev.Sequence, Delivery: d.N, StatusCode: deref32(d.StatusCode),
				Duration: durationpb.New(d.Duration), ResponseStart: deref(d.ResponseBody), ErrorMessage: deref(d.Error),
			}
			en.Summary = fmt.Sprintf("delivery %d of %s #%d: ", d.N, ev.Type, ev.Sequence)
			if en.StatusCode != 0 {
				en.Summary += fmt.Sprintf("HTTP %d", en.StatusCode)
			} else if en.ErrorMessage != "" {
				en.Summary += en.ErrorMessage
			} else {
				en.Summary += "delivered"
			}
			en.Summary += " in " + DurationText(d.Duration)
			add(d.At, gatewayv1.TimelineEntryKind_TIMELINE_ENTRY_KIND_DELIVERY, en)
		}
	}
	// One time axis; at one instant the flow's order (the kinds are numbered in it), then the
	// order of reading (attempt by attempt, delivery by delivery).
	sort.SliceStable(entries, func(i, j int) bool {
		ti, tj := entries[i].GetAt().AsTime(), entries[j].GetAt().AsTime()
		if !ti.Equal(tj) {
			return ti.Before(tj)
		}
		return entries[i].GetKind() < entries[j].GetKind()
	})
	return &gatewayv1.GetExecutionTimelineResponse{
		ExecutionId: e.ID, ApplicationId: e.ApplicationID, Capability: e.Capability,
		Status: execution.StatusToProto(e.Status), Entries: entries,
	}
}

func keySummary(k *string) string {
	if k == nil || *k == "" {
		return ""
	}
	return " (idempotency key " + jsonbound.Quote(*k) + ")"
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

func deref32(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

func structFromJSON(raw []byte) (*structpb.Struct, error) {
	var st structpb.Struct
	if err := st.UnmarshalJSON(raw); err != nil {
		return nil, err
	}
	return &st, nil
}

func deref[S ~string](p *S) string {
	if p == nil {
		return ""
	}
	return string(*p)
}

// DurationText is a short duration as people read it: "<1 ms", "37 ms", "2.4 s". Delivery
// times are stored in whole milliseconds, so time.Duration's own text showed most as "0s".
func DurationText(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return "<1 ms"
	case d < 10*time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	default:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
}

// times says how often something happened: "once", "2 times".
func times(n int32) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}
