package flagx

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestListsAreParsedAndCheckedAlike(t *testing.T) {
	require.Equal(t, []string{"a", "b"}, List(" a, ,b ,"))

	n, err := Ints("1, 16,64")
	require.NoError(t, err)
	require.Equal(t, []int{1, 16, 64}, n)
	_, err = Ints("1,0")
	require.ErrorContains(t, err, `"0" is not a positive integer`)
	_, err = Ints(" , ")
	require.ErrorContains(t, err, "empty list")

	f, err := Floats("100,2.5")
	require.NoError(t, err)
	require.Equal(t, []float64{100, 2.5}, f)
	_, err = Floats("-1")
	require.ErrorContains(t, err, `"-1" is not a positive number`)

	c, err := Choices("closed,pipelined", "pipelined", "closed")
	require.NoError(t, err)
	require.Equal(t, []string{"closed", "pipelined"}, c, "in the order given")
	_, err = Set("river,x", "river", "temporal")
	require.ErrorContains(t, err, `unknown "x" (river, temporal)`)
	s, err := Set("river", "river", "temporal")
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"river": true}, s)

	t.Setenv("FLAGX_TEST", "")
	require.Equal(t, "def", EnvOr("FLAGX_TEST", "def"))
	t.Setenv("FLAGX_TEST", "set")
	require.Equal(t, "set", EnvOr("FLAGX_TEST", "def"))
}
