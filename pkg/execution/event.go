package execution

// An event's body as delivered to the application's consumer (docs/architecture.md §8), built in SQL by the
// statement that writes the event, from the execution row it has just updated — so the event and
// the change it reports are one write. Optional members are absent, not null; jsonb orders the
// keys.

// EventBodySQL is an event's body: its id and type (SQL expressions), its timestamp — at, a
// timestamptz expression, in RFC 3339 with its fraction's trailing zeros trimmed, as Go's
// time.RFC3339Nano writes it — and its data (a jsonb expression).
func EventBodySQL(id, typ, at, data string) string {
	return `jsonb_build_object('id', ` + id + `, 'type', ` + typ + `,
		'timestamp', to_char(` + at + ` AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
			|| rtrim(rtrim(to_char(` + at + ` AT TIME ZONE 'UTC', '.US'), '0'), '.') || 'Z',
		'data', ` + data + `)`
}

// CompletedDataSQL is an execution.completed event's data, from the settled executions row r:
// the final status, the attempt, the idempotency key, the result or the failure (its empty
// texts absent), and the sequence — the event's place among its execution's events, after its
// progress events (r.event_seq, which the settling statement has just advanced).
func CompletedDataSQL(r string) string {
	return `jsonb_build_object('execution_id', ` + r + `.id, 'capability', ` + r + `.capability, 'mode', ` + r + `.mode,
			'status', ` + r + `.status, 'attempt', ` + r + `.attempt, 'sequence', ` + r + `.event_seq)
		|| CASE WHEN ` + r + `.idempotency_key IS NULL THEN '{}'::jsonb
			ELSE jsonb_build_object('idempotency_key', ` + r + `.idempotency_key) END
		|| CASE WHEN ` + r + `.result IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('result', ` + r + `.result) END
		|| CASE WHEN ` + r + `.failure_reason IS NULL AND ` + r + `.failure_class IS NULL THEN '{}'::jsonb
			ELSE jsonb_build_object('failure', jsonb_strip_nulls(jsonb_build_object(
				'class', nullif(` + r + `.failure_class, ''), 'reason', nullif(` + r + `.failure_reason, ''),
				'code', nullif(` + r + `.failure_code, ''), 'message', nullif(` + r + `.failure_message, '')))) END`
}

// ProgressDataSQL is an execution.progress event's data, from the executions row r the report
// has just updated and progress, the report (a jsonb expression).
func ProgressDataSQL(r, progress string) string {
	return `jsonb_build_object('execution_id', ` + r + `.id, 'capability', ` + r + `.capability, 'attempt', ` + r + `.attempt,
			'sequence', ` + r + `.event_seq, 'progress', ` + progress + `)`
}
