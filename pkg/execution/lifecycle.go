package execution

import (
	"fmt"
	"strings"
)

// The execution's lifecycle, in one place: every move the services make, named, with the statuses
// it leaves from, the one it goes to, what else must hold (its guard, which each store writes as
// the rest of its WHERE clause) and who applies it. The stores write a transition's source and
// target with From and To, never as literals of their own (TestNoStatusLiteralsOutsideTheLifecycle
// holds them to it), so that a reader finds every status change of an execution by the
// transition's name.
//
//	accept            → pending   (sync: → running, Start's guard at once)
//	running  → withdraw           (sync, the adapter never reached: the row deleted)
//	pending  → start  → running
//	running  → undo   → pending   (the adapter was never reached: the same attempt again)
//	running  → renew  → running   (the lease extended)
//	running  → settle → succeeded | failed (the adapter's outcome)
//	running  → retry  → pending   (a failed attempt with attempts and budget left)
//	running  → exhaust → failed   (a failed attempt with none left)
//	running  → sweep  → pending | failed (the lease or the deadline ran out: retry or exhaust)
//	pending  → strand → failed    (the deadline passed with no attempt left to start)
//	pending | running → cancel → cancelled
//
// The event's own lifecycle is EventTransitions.

// Transition is one move of an execution (or of an event: EventTransitions).
type Transition struct {
	// Name is the move's name, as the services' code and docs call it.
	Name string
	// From are the statuses it leaves from; none for the insert that creates the row.
	From []string
	// To are the statuses it can end in: one, or those its decision picks among; none when the
	// row goes.
	To []string
	// Guard is what else must hold, in words; the store applying it writes it in SQL.
	Guard string
	// By is who applies it.
	By string
}

// The execution's transitions.
var (
	Accept = Transition{Name: "accept", To: []string{StatusPending},
		Guard: "a new row (the idempotency key, when given, not seen before)", By: "gateway (async)"}
	AcceptSync = Transition{Name: "accept sync", To: []string{StatusRunning},
		Guard: "a new row, at attempt 1 under the sync deadline", By: "gateway (sync)"}
	Withdraw = Transition{Name: "withdraw", From: []string{StatusRunning},
		Guard: "a sync accept whose adapter was never reached, attempt 1 not started there: the row deleted, nothing kept", By: "gateway (sync)"}
	Start = Transition{Name: "start", From: []string{StatusPending}, To: []string{StatusRunning},
		Guard: "attempt = n - 1, n ≤ max_attempts, before the deadline", By: "execution-consumer; the dispatcher reads the same guard to publish"}
	Undo = Transition{Name: "undo", From: []string{StatusRunning}, To: []string{StatusPending},
		Guard: "attempt = n, the adapter provably never reached: back to n - 1, attempt n due again", By: "execution-consumer"}
	Renew = Transition{Name: "renew", From: []string{StatusRunning}, To: []string{StatusRunning},
		Guard: "attempt = n, the lease and the deadline not passed (or the adapter accepted the work)", By: "adapter-callback, execution-consumer"}
	Progress = Transition{Name: "progress", From: []string{StatusRunning}, To: []string{StatusRunning},
		Guard: "attempt = n: the report stored, a progress event when the capability declares them", By: "adapter-callback"}
	Settle = Transition{Name: "settle", From: []string{StatusRunning}, To: []string{StatusSucceeded, StatusFailed},
		Guard: "attempt = n: the final status with its completion event, one statement", By: "settlement"}
	Retry = Transition{Name: "retry", From: []string{StatusRunning}, To: []string{StatusPending},
		Guard: "attempt = n failed retryably, n < max_attempts, the next due time before the deadline: a dispatch record for n + 1", By: "settlement"}
	Exhaust = Transition{Name: "exhaust", From: []string{StatusRunning}, To: []string{StatusFailed},
		Guard: "attempt = n failed for good, or no attempt or budget left: failed with its reason and completion event", By: "settlement"}
	Sweep = Transition{Name: "sweep", From: []string{StatusRunning}, To: []string{StatusPending, StatusFailed},
		Guard: "the lease or the deadline passed a grace ago: retry or exhaust as a timeout", By: "settlement's sweeper"}
	Strand = Transition{Name: "strand", From: []string{StatusPending}, To: []string{StatusFailed},
		Guard: "the deadline passed a grace ago and no dispatch record waits", By: "settlement's sweeper"}
	Cancel = Transition{Name: "cancel", From: []string{StatusPending, StatusRunning}, To: []string{StatusCancelled},
		Guard: "not settled; the status and attempt the caller read", By: "gateway through settlement"}
)

// Transitions lists the execution's transitions.
var Transitions = []Transition{Accept, AcceptSync, Withdraw, Start, Undo, Renew, Progress, Settle, Retry, Exhaust, Sweep, Strand, Cancel}

// Event delivery statuses as stored (integration_events.delivery_status).
const (
	EventPending   = "pending"
	EventDelivered = "delivered"
	EventDead      = "dead"
)

// The event's transitions.
var (
	EventCreate = Transition{Name: "event create", To: []string{EventPending},
		Guard: "with the settlement or progress report that makes it", By: "settlement, adapter-callback"}
	EventClaim = Transition{Name: "event claim", From: []string{EventPending}, To: []string{EventPending},
		Guard: "no earlier event of the execution pending; the claim expired or never made", By: "event-router (relay, recovery)"}
	EventDeliver = Transition{Name: "event deliver", From: []string{EventPending}, To: []string{EventDelivered},
		Guard: "the consumer answered 2xx (or OK); attempts as claimed", By: "event-router"}
	EventRetry = Transition{Name: "event retry", From: []string{EventPending}, To: []string{EventPending},
		Guard: "a failed delivery with attempts left: the next attempt's time", By: "event-router"}
	EventDie = Transition{Name: "event die", From: []string{EventPending}, To: []string{EventDead},
		Guard: "a failed delivery with no attempt left", By: "event-router"}
	EventRedeliver = Transition{Name: "event redeliver", From: []string{EventPending, EventDelivered, EventDead}, To: []string{EventPending},
		Guard: "asked by the application or an operator: a fresh budget, the history kept", By: "gateway"}
	EventSuperseded = Transition{Name: "event superseded", From: []string{EventPending}, To: []string{EventPending},
		Guard: "a progress event not yet claimed, replaced by a newer report", By: "adapter-callback"}
)

// EventTransitions lists the event's transitions.
var EventTransitions = []Transition{EventCreate, EventClaim, EventDeliver, EventRetry, EventDie, EventRedeliver, EventSuperseded}

// FromSQL is the SQL condition that column (e.g. "e.status", "delivery_status") is one of t's
// source statuses.
func (t Transition) FromSQL(column string) string {
	return inSQL(column, t.From)
}

// ToSQL is t's target status as a SQL literal; t must have exactly one.
func (t Transition) ToSQL() string {
	if len(t.To) != 1 {
		panic(fmt.Sprintf("execution: transition %q has %d targets: name the one with Literal", t.Name, len(t.To)))
	}
	return Literal(t.To[0])
}

// Literal is a status as a SQL string literal.
func Literal(status string) string {
	return "'" + strings.ReplaceAll(status, "'", "''") + "'"
}

func inSQL(column string, statuses []string) string {
	switch len(statuses) {
	case 0:
		panic("execution: a transition without source statuses has no FromSQL")
	case 1:
		return column + " = " + Literal(statuses[0])
	}
	lits := make([]string, len(statuses))
	for i, s := range statuses {
		lits[i] = Literal(s)
	}
	return column + " IN (" + strings.Join(lits, ", ") + ")"
}
