package safetext

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTruncate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 600) // 2 bytes each
	got := Truncate(long, 1023)
	assert.True(t, utf8.ValidString(got), "cut on a rune boundary")
	assert.Len(t, got, 1022)
	assert.Equal(t, "abc", Truncate("a\x00b\x00c", 10), "NUL bytes removed")
	assert.Equal(t, "a\uFFFDb", Truncate("a\xffb", 10), "invalid bytes replaced")
	assert.Equal(t, "short", Truncate("short", 10))
}

func TestErrorDropsURL(t *testing.T) {
	t.Parallel()
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/hooks/SECRET-TOKEN?sig=abc", nil)
	require.NoError(t, err)
	_, err = http.DefaultClient.Do(req)
	require.Error(t, err)
	got := Error(err, 512)
	assert.NotContains(t, got, "SECRET-TOKEN")
	assert.NotContains(t, got, "sig=abc")
	assert.Contains(t, got, "Post request")
	assert.Equal(t, "plain", Error(errors.New("plain"), 512))
	assert.Equal(t, "", Error(nil, 512))
}
