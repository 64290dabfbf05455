package platformtoken

import (
	"testing"

	"github.com/stretchr/testify/require"

	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
)

func TestRefusalReasonIsTheEnums(t *testing.T) {
	t.Parallel()
	require.Equal(t, errorsv1.ErrorReason_PLATFORM_TOKEN_REFUSED.String(), RefusalReason)
}
