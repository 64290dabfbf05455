// Package log builds the zap logger every service uses: JSON lines, static messages, typed
// fields. The fields that name the platform's things live here, one key for one meaning across
// every service: execution_id, attempt (an execution's), deliveries (a broker message's),
// delivery_attempt (an event's, to its consumer), event_id, application_id.
package log

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a JSON logger at the given level, naming the service on every line.
func New(service, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	cfg.Sampling = nil
	logger, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return logger.With(zap.String("service", service)), nil
}

// ExecutionID is the field naming an execution.
func ExecutionID(id string) zap.Field { return zap.String("execution_id", id) }

// Attempt is the field numbering an execution's attempt (executions.attempt): "attempt" means
// that and nothing else in every service's logs.
func Attempt(n int32) zap.Field { return zap.Int32("attempt", n) }

// Deliveries is the field counting how many times the broker has delivered a message (1 the
// first time; mq.Message.Attempt), not an execution's attempt.
func Deliveries(n int) zap.Field { return zap.Int("deliveries", n) }

// DeliveryAttempt is the field numbering an event's delivery attempt to its consumer (a webhook
// POST or a gRPC call), not an execution's attempt.
func DeliveryAttempt(n int) zap.Field { return zap.Int("delivery_attempt", n) }

// EventID is the field naming a completion event.
func EventID(id string) zap.Field { return zap.String("event_id", id) }

// ApplicationID is the field naming an application.
func ApplicationID(id string) zap.Field { return zap.String("application_id", id) }
