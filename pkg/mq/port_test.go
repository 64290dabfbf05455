package mq

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProviderOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, provider, url string
		want                string
		err                 string
	}{
		{"amqp by scheme", "", "amqp://guest:secret@127.0.0.1:5672/", ProviderRabbitMQ, ""},
		{"amqps by scheme", "", "amqps://guest:secret@rabbit.internal:5671/", ProviderRabbitMQ, ""},
		{"stomp by scheme", "", "stomp://admin:secret@127.0.0.1:61613", ProviderSTOMP, ""},
		{"stomp+ssl by scheme", "", "stomp+ssl://admin:secret@mq.internal:61614", ProviderSTOMP, ""},
		{"rabbitmq named", ProviderRabbitMQ, "amqp://guest:secret@127.0.0.1:5672/", ProviderRabbitMQ, ""},
		{"stomp named", ProviderSTOMP, "stomp://admin:secret@127.0.0.1:61613", ProviderSTOMP, ""},
		{"rabbitmq with a stomp URL", ProviderRabbitMQ, "stomp://admin:secret@127.0.0.1:61613",
			"", `Config.Provider "rabbitmq" does not take Config.URL's scheme "stomp"`},
		{"stomp with an amqp URL", ProviderSTOMP, "amqp://guest:secret@127.0.0.1:5672/",
			"", `Config.Provider "stomp" does not take Config.URL's scheme "amqp"`},
		{"unknown provider", "kafka", "amqp://guest:secret@127.0.0.1:5672/", "", `Config.Provider "kafka" is not one of`},
		{"unknown scheme", "", "http://guest:secret@127.0.0.1:5672/", "", `Config.URL's scheme "http" is not one of`},
		{"empty URL", ProviderRabbitMQ, "", "", "Config.URL is empty"},
		{"not a URL", "", "amqp://guest:secret@[::1", "", "Config.URL is not a valid URL"},
	} {
		got, err := ProviderOf(tc.provider, tc.url)
		if tc.err == "" {
			require.NoError(t, err, tc.name)
			assert.Equal(t, tc.want, got, tc.name)
			continue
		}
		require.Error(t, err, tc.name)
		assert.ErrorContains(t, err, tc.err, tc.name)
		assert.NotContains(t, err.Error(), "secret", "%s: the URL's password must not leak into errors", tc.name)
	}
}

// TestDialChoosesTheProvider: Dial refuses what ProviderOf refuses, gives a STOMP for a stomp://
// URL (the URL's password never in an error) and a RabbitMQ for an amqp:// URL.
func TestDialChoosesTheProvider(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err := Dial(ctx, Config{Provider: ProviderSTOMP, URL: "stomp://admin:secret@127.0.0.1:1", Scope: "x"})
	require.Error(t, err, "nothing listens on port 1")
	assert.NotContains(t, err.Error(), "secret")
	_, err = Dial(ctx, Config{Provider: ProviderSTOMP, URL: testURL(), Scope: "x"})
	assert.ErrorContains(t, err, "Config.Provider")
	_, err = Dial(ctx, Config{URL: stompTestURL(t) + "?schedule=later", Scope: "x"})
	assert.ErrorContains(t, err, "schedule parameter")

	s, err := Dial(ctx, Config{URL: stompTestURL(t) + "?schedule=artemis", Scope: "mqtest-dial"})
	require.NoError(t, err)
	assert.IsType(t, &stompDriver{}, s.(*port).drv)
	assert.Equal(t, stompScheduleArtemis, s.(*port).drv.(*stompDriver).schedule)
	assert.Equal(t, "mqtest-dial.work", s.QueueName("work"))
	require.NoError(t, s.CloseContext(ctx))

	b, err := Dial(ctx, Config{URL: testURL(), Scope: "mqtest-dial", Provider: ProviderRabbitMQ})
	require.NoError(t, err)
	assert.IsType(t, &rabbitDriver{}, b.(*port).drv)
	assert.Equal(t, "mqtest-dial.work", b.QueueName("work"))
	require.NoError(t, b.CloseContext(ctx))
}
