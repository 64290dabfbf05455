package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/integrations-platform/integrations/sdk/go/webhooks"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/integrations-platform/integrations/pkg/apperr"
	"github.com/integrations-platform/integrations/pkg/execution"
	eventsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/events/v1"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
	"github.com/integrations-platform/integrations/pkg/log"
	"github.com/integrations-platform/integrations/pkg/webhook"
	"github.com/integrations-platform/integrations/services/gateway/internal/store"
)

var eventStatusToProto = map[execution.EventStatus]eventsv1.EventStatus{
	execution.EventPending:   eventsv1.EventStatus_EVENT_STATUS_PENDING,
	execution.EventDelivered: eventsv1.EventStatus_EVENT_STATUS_DELIVERED,
	execution.EventDead:      eventsv1.EventStatus_EVENT_STATUS_DEAD,
}

func eventStatusFromProto(s eventsv1.EventStatus) execution.EventStatus {
	for k, v := range eventStatusToProto {
		if v == s {
			return k
		}
	}
	return ""
}

// eventProto is the API's view of an event; deliveries are added by GetEvent.
func eventProto(e *store.Event) (*eventsv1.Event, error) {
	out := &eventsv1.Event{
		Id: e.ID, Type: e.Type, ExecutionId: e.ExecutionID, CreateTime: timestamppb.New(e.CreatedAt),
		Status: eventStatusToProto[e.Status], Attempts: e.Attempts, Sequence: e.Sequence, ApplicationId: e.ApplicationID,
		NextAttemptTime: optTime(e.NextAttemptAt), DeliveredTime: optTime(e.DeliveredAt), DeadTime: optTime(e.DeadAt),
	}
	if e.LastError != nil {
		out.LastError = webhook.PublicCategory(*e.LastError) // never raw network text (rows of old)
	}
	if len(e.Data) > 0 && string(e.Data) != "null" {
		out.Data = &structpb.Struct{}
		if err := protojson.Unmarshal(e.Data, out.Data); err != nil {
			return nil, fmt.Errorf("decode data of event %s: %w", e.ID, err)
		}
	}
	// The same data typed by the event's type (data is kept for v0.1 clients).
	typed, err := webhooks.TypedData(e.Type, e.Data)
	if err != nil {
		return nil, fmt.Errorf("decode data of event %s: %w", e.ID, err)
	}
	switch m := typed.(type) {
	case *eventsv1.ExecutionCompletedData:
		out.TypedData = &eventsv1.Event_ExecutionCompleted{ExecutionCompleted: m}
	case *eventsv1.ExecutionProgressData:
		out.TypedData = &eventsv1.Event_ExecutionProgress{ExecutionProgress: m}
	}
	return out, nil
}

func deliveryProto(d store.Delivery) *eventsv1.DeliveryAttempt {
	out := &eventsv1.DeliveryAttempt{Number: d.N, Time: timestamppb.New(d.At), Duration: durationpb.New(d.Duration)}
	if d.StatusCode != nil {
		out.StatusCode = *d.StatusCode
	}
	if d.Error != nil {
		out.Error = webhook.PublicCategory(*d.Error)
	}
	if d.ResponseBody != nil {
		out.ResponseBody = *d.ResponseBody
	}
	return out
}

func optTime(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// optTimestamp validates an optional timestamp field.
func optTimestamp(field string, ts *timestamppb.Timestamp) (*time.Time, error) {
	if ts == nil {
		return nil, nil
	}
	if err := ts.CheckValid(); err != nil {
		return nil, apperr.Invalid(field, "not a valid time: %v", err)
	}
	t := ts.AsTime()
	return &t, nil
}

func checkEventID(id string) error {
	if uuid.Validate(id) != nil {
		return apperr.Invalid("id", "%s is not an event id", jsonbound.Quote(id))
	}
	return nil
}

// ListEvents implements GatewayService.ListEvents.
func (s *Server) ListEvents(ctx context.Context, req *gatewayv1.ListEventsRequest) (*gatewayv1.ListEventsResponse, error) {
	f := store.EventFilter{Limit: int(req.GetPageSize())}
	switch {
	case f.Limit < 0 || f.Limit > MaxPageSize:
		return nil, apperr.Invalid("page_size", "must be between 1 and %d", MaxPageSize)
	case f.Limit == 0:
		f.Limit = DefaultPageSize
	}
	if req.GetStatus() != eventsv1.EventStatus_EVENT_STATUS_UNSPECIFIED {
		if f.Status = eventStatusFromProto(req.GetStatus()); f.Status == "" {
			return nil, apperr.Invalid("status", "unknown status %v", req.GetStatus())
		}
	}
	if id := req.GetExecutionId(); id != "" {
		if uuid.Validate(id) != nil {
			return nil, apperr.Invalid("execution_id", "%s is not an execution id", jsonbound.Quote(id))
		}
		f.ExecutionID = id
	}
	var err error
	if f.Since, err = optTimestamp("since", req.GetSince()); err != nil {
		return nil, err
	}
	if f.Until, err = optTimestamp("until", req.GetUntil()); err != nil {
		return nil, err
	}
	if f.Since != nil && f.Until != nil && !f.Until.After(*f.Since) {
		return nil, apperr.Invalid("until", "must be after since")
	}
	if tok := req.GetPageToken(); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || uuid.Validate(string(raw)) != nil {
			return nil, apperr.Invalid("page_token", "not a token from a previous page")
		}
		f.Before = string(raw)
	}
	app, err := listApplication(ctx, req.GetApplicationId(), "events")
	if err != nil {
		return nil, err
	}
	// One row past the page says whether another page follows: the last page carries no
	// next_page_token (a token on it led to an empty page).
	size := f.Limit
	f.Limit++
	rows, err := s.store.EventList(ctx, app, f)
	if err != nil {
		return nil, err
	}
	resp := &gatewayv1.ListEventsResponse{}
	if len(rows) > size {
		rows = rows[:size]
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(rows[len(rows)-1].ID))
	}
	for _, r := range rows {
		e, err := eventProto(r)
		if err != nil {
			return nil, err
		}
		resp.Events = append(resp.Events, e)
	}
	return resp, nil
}

// GetEvent implements GatewayService.GetEvent.
func (s *Server) GetEvent(ctx context.Context, req *gatewayv1.GetEventRequest) (*gatewayv1.GetEventResponse, error) {
	if err := checkEventID(req.GetId()); err != nil {
		return nil, err
	}
	app, err := callerScope(ctx)
	if err != nil {
		return nil, err
	}
	row, deliveries, err := s.store.EventGet(ctx, app, req.GetId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, apperr.NotFound("event %s not found", req.GetId())
	}
	if err != nil {
		return nil, err
	}
	e, err := eventProto(row)
	if err != nil {
		return nil, err
	}
	for _, d := range deliveries {
		e.Deliveries = append(e.Deliveries, deliveryProto(d))
	}
	return &gatewayv1.GetEventResponse{Event: e}, nil
}

// RedeliverEvent implements GatewayService.RedeliverEvent.
func (s *Server) RedeliverEvent(ctx context.Context, req *gatewayv1.RedeliverEventRequest) (*gatewayv1.RedeliverEventResponse, error) {
	if err := checkEventID(req.GetId()); err != nil {
		return nil, err
	}
	appID, err := callerScope(ctx)
	if err != nil {
		return nil, err
	}
	a := auditEntry(ctx, "event.redeliver", req.GetId(), nil)
	row, err := s.store.EventRedeliver(ctx, appID, req.GetId(), &a)
	if errors.Is(err, store.ErrNotFound) {
		return nil, apperr.NotFound("event %s not found", req.GetId())
	}
	if err != nil {
		return nil, err
	}
	s.log.Info("event redelivered", log.EventID(row.ID), log.ApplicationID(row.ApplicationID), zap.Bool("operator", isOperator(ctx)))
	e, err := eventProto(row)
	if err != nil {
		return nil, err
	}
	return &gatewayv1.RedeliverEventResponse{Event: e}, nil
}

// RedriveEvents implements GatewayService.RedriveEvents.
func (s *Server) RedriveEvents(ctx context.Context, req *gatewayv1.RedriveEventsRequest) (*gatewayv1.RedriveEventsResponse, error) {
	since, err := optTimestamp("since", req.GetSince())
	if err != nil {
		return nil, err
	}
	appID, err := listApplication(ctx, req.GetApplicationId(), "events")
	if err != nil {
		return nil, err
	}
	if req.GetValidateOnly() {
		n, err := s.store.EventRedriveCount(ctx, appID, since)
		if err != nil {
			return nil, err
		}
		return &gatewayv1.RedriveEventsResponse{Count: n}, nil
	}
	a := auditEntry(ctx, "events.redrive", redriveTarget(appID, since), nil)
	if appID != "" {
		a = a.With("application_id", appID)
	}
	n, err := s.store.EventRedrive(ctx, appID, since, &a)
	if err != nil {
		return nil, err
	}
	s.log.Info("dead events redriven", log.ApplicationID(appID), zap.Bool("operator", isOperator(ctx)), zap.Int64("count", n))
	return &gatewayv1.RedriveEventsResponse{Count: n}, nil
}

// redriveTarget names the dead events a redrive takes, for its audit entry.
func redriveTarget(appID string, since *time.Time) string {
	target := "dead events of application " + appID
	if appID == store.AnyApplication {
		target = "dead events of every application"
	}
	if since != nil {
		target += " since " + since.UTC().Format(time.RFC3339)
	}
	return target
}

// RotateSigningSecret implements GatewayService.RotateSigningSecret.
func (s *Server) RotateSigningSecret(ctx context.Context, _ *gatewayv1.RotateSigningSecretRequest) (*gatewayv1.RotateSigningSecretResponse, error) {
	fresh, err := webhooks.NewSecret()
	if err != nil {
		return nil, err
	}
	sealed, err := s.box.Seal([]byte(fresh))
	if err != nil {
		return nil, err
	}
	appID := applicationID(ctx)
	until, err := s.store.SigningSecretRotate(ctx, appID, sealed, s.opts.SecretRotationOverlap)
	if err != nil {
		return nil, err
	}
	s.log.Info("signing secret rotated", log.ApplicationID(appID), zap.Bool("previous_kept", until != nil))
	return &gatewayv1.RotateSigningSecretResponse{SigningSecret: fresh, PreviousSecretExpireTime: optTime(until)}, nil
}
