// Package log builds the zap logger every service uses: JSON lines, static messages, typed
// fields. Field constructors for the identifiers that appear on every line live here so that
// their names stay the same across services.
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

// Attempt is the field naming an attempt number.
func Attempt(n int32) zap.Field { return zap.Int32("attempt", n) }

// EventID is the field naming a completion event.
func EventID(id string) zap.Field { return zap.String("event_id", id) }

// ApplicationID is the field naming an application.
func ApplicationID(id string) zap.Field { return zap.String("application_id", id) }
