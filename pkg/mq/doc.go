// Package mq is the message port: the only code in the project that talks to RabbitMQ.
//
// A handler returns a [Result] and the port settles the delivery from it; handlers never ack.
//
//   - [Ack]: the work is done; the delivery is acknowledged.
//   - [Fail]: transient. A copy goes to the route's holding queue for the next delay level, with
//     x-delivery-attempt incremented; the holding queue's TTL dead-letters it back to the work
//     queue. Past the route's [RetryPolicy] the copy goes to "<queue>.dlq" instead.
//   - [Reject]: permanent; a copy goes straight to "<queue>.dlq".
//   - the zero Result, a panic, or a handler whose context was cancelled: the delivery is returned
//     to the broker (nack with requeue) and will be delivered again.
//
// Every copy (retry or dead letter) is confirmed by the broker before the original is acked, so a
// connection that dies in between can duplicate a message but never lose it. Consumers must
// therefore be idempotent on [Message.ID].
//
// Topology, per route, all quorum queues under one scope prefix:
//
//	<scope>.<route>                  the work queue
//	<scope>.<route>.retry.<n>ms      one holding queue per distinct (scaled) delay
//	<scope>.<route>.dlq              dead letters, inspectable and redrivable
//
// One holding queue per delay level is what keeps a short delay from waiting behind a long one:
// RabbitMQ only expires messages at the head of a queue.
//
// amqp091-go's experimental automatic recovery stays off (Config.Recovery is nil): it would
// re-deliver on a new channel while our workers still hold delivery tags of the old one. The port
// reconnects itself and tracks which channel each delivery came from; a settlement for a replaced
// channel is counted as superseded and left to the broker's redelivery.
package mq
