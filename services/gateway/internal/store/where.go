package store

import (
	"strconv"
	"strings"
)

// where builds a WHERE clause from the filters a list request has, one condition per filter
// present, so that each shape of filter has its own SQL text. A single text for every shape —
// "status = $2 OR $2 is empty" — gives Postgres no index condition on a generic plan, which pgx's
// statement cache gets after the fifth execution: a page of dead events then scanned every event
// of the application instead of its dead ones (see docs/capacity.md, "Index and row hygiene").
type where struct {
	conds []string
	args  []any
}

// add appends cond, whose one "?" stands for arg, as the next numbered parameter.
func (w *where) add(cond string, arg any) {
	w.args = append(w.args, arg)
	w.conds = append(w.conds, strings.Replace(cond, "?", "$"+strconv.Itoa(len(w.args)), 1))
}

// param appends arg and returns its placeholder, for a parameter outside the WHERE clause.
func (w *where) param(arg any) string {
	w.args = append(w.args, arg)
	return "$" + strconv.Itoa(len(w.args))
}

func (w *where) String() string { return strings.Join(w.conds, " AND ") }

// clause is "WHERE" and the conditions, or nothing when there are none.
func (w *where) clause() string {
	if len(w.conds) == 0 {
		return ""
	}
	return "WHERE " + w.String()
}
