package dummy_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The knobs of the hostile-input suite answer results the platform must refuse.
func TestUnstorableResultKnobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resp, err := b.execute(t, call{payload: script(map[string]any{"result_nul": true})})
	require.NoError(t, err)
	require.Equal(t, "a\x00b", resp.GetCompleted().GetResult().GetFields()["nul"].GetStringValue())

	resp, err = b.execute(t, call{payload: script(map[string]any{"result_depth": 70.0})})
	require.NoError(t, err)
	depth := 1
	for s := resp.GetCompleted().GetResult(); len(s.GetFields()) > 0; s = s.GetFields()["a"].GetStructValue() {
		depth++
	}
	require.Equal(t, 70, depth)

	resp, err = b.execute(t, call{payload: script(map[string]any{"result_depth": 1e6})})
	require.NoError(t, err)
	require.Contains(t, resp.GetFailed().GetMessage(), "at most 100000")
}
