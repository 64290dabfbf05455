package client_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
	"github.com/integrations-platform/integrations/sdk/go/client"
)

func TestReasonOutcomePendingIsTheEnums(t *testing.T) {
	t.Parallel()
	require.Equal(t, errorsv1.ErrorReason_OUTCOME_PENDING.String(), client.ReasonOutcomePending)
}
