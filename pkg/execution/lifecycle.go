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

// Transition is one move of an execution (S Status) or of an event (S EventStatus:
// EventTransitions).
type Transition[S Status | EventStatus] struct {
	// Name is the move's name, as the services' code and docs call it.
	Name string
	// From are the statuses it leaves from; none for the insert that creates the row.
	From []S
	// To are the statuses it can end in: one, or those its decision picks among; none when the
	// row goes.
	To []S
	// Guard is what else must hold, in words; the store applying it writes it in SQL.
	Guard string
	// By is who applies it.
	By string
}

// The execution's transitions.
var (
	Accept = Transition[Status]{Name: "accept", To: []Status{StatusPending},
		Guard: "a new row (the idempotency key, when given, not seen before)", By: "gateway (async)"}
	AcceptSync = Transition[Status]{Name: "accept sync", To: []Status{StatusRunning},
		Guard: "a new row, at attempt 1 under the sync deadline", By: "gateway (sync)"}
	Withdraw = Transition[Status]{Name: "withdraw", From: []Status{StatusRunning},
		Guard: "a sync accept whose adapter was never reached, attempt 1 not started there: the row deleted, nothing kept", By: "gateway (sync)"}
	Start = Transition[Status]{Name: "start", From: []Status{StatusPending}, To: []Status{StatusRunning},
		Guard: "attempt = n - 1, n ≤ max_attempts, before the deadline", By: "execution-consumer; the dispatcher reads the same guard to publish"}
	Undo = Transition[Status]{Name: "undo", From: []Status{StatusRunning}, To: []Status{StatusPending},
		Guard: "attempt = n, the adapter provably never reached: back to n - 1, attempt n due again", By: "execution-consumer"}
	Renew = Transition[Status]{Name: "renew", From: []Status{StatusRunning}, To: []Status{StatusRunning},
		Guard: "attempt = n, the lease and the deadline not passed (or the adapter accepted the work)", By: "adapter-callback, execution-consumer"}
	Progress = Transition[Status]{Name: "progress", From: []Status{StatusRunning}, To: []Status{StatusRunning},
		Guard: "attempt = n: the report stored, a progress event when the capability declares them", By: "adapter-callback"}
	Settle = Transition[Status]{Name: "settle", From: []Status{StatusRunning}, To: []Status{StatusSucceeded, StatusFailed},
		Guard: "attempt = n: the final status with its completion event, one statement", By: "settlement"}
	Retry = Transition[Status]{Name: "retry", From: []Status{StatusRunning}, To: []Status{StatusPending},
		Guard: "attempt = n failed retryably, n < max_attempts, the next due time before the deadline: a dispatch record for n + 1", By: "settlement"}
	Exhaust = Transition[Status]{Name: "exhaust", From: []Status{StatusRunning}, To: []Status{StatusFailed},
		Guard: "attempt = n failed for good, or no attempt or budget left: failed with its reason and completion event", By: "settlement"}
	Sweep = Transition[Status]{Name: "sweep", From: []Status{StatusRunning}, To: []Status{StatusPending, StatusFailed},
		Guard: "the lease or the deadline passed a grace ago: retry or exhaust as a timeout", By: "settlement's sweeper"}
	Strand = Transition[Status]{Name: "strand", From: []Status{StatusPending}, To: []Status{StatusFailed},
		Guard: "the deadline passed a grace ago and no dispatch record waits", By: "settlement's sweeper"}
	Cancel = Transition[Status]{Name: "cancel", From: []Status{StatusPending, StatusRunning}, To: []Status{StatusCancelled},
		Guard: "not settled; the status and attempt the caller read", By: "gateway through settlement"}
)

// Transitions lists the execution's transitions.
var Transitions = []Transition[Status]{Accept, AcceptSync, Withdraw, Start, Undo, Renew, Progress, Settle, Retry, Exhaust, Sweep, Strand, Cancel}

// EventStatus is an event's delivery status as stored (integration_events.delivery_status).
type EventStatus string

// The event's delivery statuses.
const (
	EventPending   EventStatus = "pending"
	EventDelivered EventStatus = "delivered"
	EventDead      EventStatus = "dead"
)

// The event's transitions.
var (
	EventCreate = Transition[EventStatus]{Name: "event create", To: []EventStatus{EventPending},
		Guard: "with the settlement or progress report that makes it", By: "settlement, adapter-callback"}
	EventClaim = Transition[EventStatus]{Name: "event claim", From: []EventStatus{EventPending}, To: []EventStatus{EventPending},
		Guard: "no earlier event of the execution pending; the claim expired or never made", By: "event-router (relay, recovery)"}
	EventDeliver = Transition[EventStatus]{Name: "event deliver", From: []EventStatus{EventPending}, To: []EventStatus{EventDelivered},
		Guard: "the consumer answered 2xx (or OK); attempts as claimed", By: "event-router"}
	EventRetry = Transition[EventStatus]{Name: "event retry", From: []EventStatus{EventPending}, To: []EventStatus{EventPending},
		Guard: "a failed delivery with attempts left: the next attempt's time", By: "event-router"}
	EventDie = Transition[EventStatus]{Name: "event die", From: []EventStatus{EventPending}, To: []EventStatus{EventDead},
		Guard: "a failed delivery with no attempt left", By: "event-router"}
	EventRedeliver = Transition[EventStatus]{Name: "event redeliver", From: []EventStatus{EventPending, EventDelivered, EventDead}, To: []EventStatus{EventPending},
		Guard: "asked by the application or an operator: a fresh budget, the history kept", By: "gateway"}
	EventSuperseded = Transition[EventStatus]{Name: "event superseded", From: []EventStatus{EventPending}, To: []EventStatus{EventPending},
		Guard: "a progress event not yet claimed, replaced by a newer report", By: "adapter-callback"}
)

// EventTransitions lists the event's transitions.
var EventTransitions = []Transition[EventStatus]{EventCreate, EventClaim, EventDeliver, EventRetry, EventDie, EventRedeliver, EventSuperseded}

// FromSQL is the SQL condition that column (e.g. "e.status", "delivery_status") is one of t's
// source statuses.
func (t Transition[S]) FromSQL(column string) string {
	return inSQL(column, t.From)
}

// ToSQL is t's target status as a SQL literal; t must have exactly one.
func (t Transition[S]) ToSQL() string {
	if len(t.To) != 1 {
		panic(fmt.Sprintf("execution: transition %q has %d targets: name the one with Literal", t.Name, len(t.To)))
	}
	return Literal(t.To[0])
}

// Literal is a status as a SQL string literal.
func Literal[S Status | EventStatus | AttemptOutcome](status S) string {
	return "'" + strings.ReplaceAll(string(status), "'", "''") + "'"
}

func inSQL[S Status | EventStatus](column string, statuses []S) string {
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
