// Package e2e holds the end-to-end tests: they build the six services, the dummy adapter and
// run them as separate processes against the machine's real Postgres and RabbitMQ, each test run
// with its own schema and queue scope.
package e2e
