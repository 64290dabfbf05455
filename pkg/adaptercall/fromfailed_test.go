package adaptercall

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	adapterv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/adapter/v1"
	"github.com/integrations-platform/integrations/pkg/jsonbound"
)

// An adapter's failure texts are stored: whatever it sends comes out storable and bounded.
func TestFromFailedCleansTexts(t *testing.T) {
	t.Parallel()
	out := FromFailed(&adapterv1.Failed{Class: "perm\x00anent", Code: strings.Repeat("c\xff", 500), Message: "m\x00"})
	for _, v := range []string{out.Failure.Class, out.Failure.Code, out.Failure.Message} {
		require.Empty(t, jsonbound.Problem(v), "%q", v)
	}
	require.LessOrEqual(t, len(out.Failure.Code), maxCode)
}
