package mq

import (
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
)

// IsConnectionError reports whether err says the broker could not take a message now: the
// Broker is closed, a publish was not confirmed (the channel closed first) or was nacked, or the
// connection or channel was closed (an *amqp.Error, amqp.ErrClosed among them). A message
// returned as unroutable is not: that is a missing declaration, a bug. grpcx.ToStatus answers
// every such error UNAVAILABLE.
func IsConnectionError(err error) bool {
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrUnconfirmed) || errors.Is(err, ErrNacked) {
		return true
	}
	var amqpErr *amqp.Error
	return errors.As(err, &amqpErr)
}
