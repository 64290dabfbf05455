package store

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The list queries read the JSON documents as NULL: if execution.Columns or eventColumns change
// shape, the replacement must still have taken.
func TestListColumnsLeaveDocumentsOut(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 3, strings.Count(listColumns, "NULL::jsonb"), listColumns)
	assert.NotContains(t, listColumns, "payload")
	assert.NotContains(t, listColumns, "result")
	assert.NotContains(t, listColumns, "progress")
	assert.Contains(t, eventListColumns, "- 'result'")
	assert.Equal(t, strings.Count(eventColumns, ","), strings.Count(eventListColumns, ","))
}
