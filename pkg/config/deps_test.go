package config

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDependencyTLS: Postgres and RabbitMQ on a non-loopback host need TLS that verifies the
// server, or the explicit opt-out; loopback (every launcher's 127.0.0.1) and Unix sockets need
// nothing. The error names the variable and the host, never the URL's password.
func TestDependencyTLS(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	const amqpLocal = "amqp://guest:guest@127.0.0.1:5672/"
	for dsn, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/integrations?sslmode=disable":                "",
		"postgres://postgres@localhost/test":                                             "",
		"postgres://postgres@[::1]:5432/test?sslmode=disable":                            "",
		"postgres:///integrations?host=/var/run/postgresql":                              "",
		"host=/tmp dbname=x sslmode=disable":                                             "",
		"postgres://u:s3cret@db.internal:5432/x?sslmode=verify-full&sslrootcert=/ca.pem": "",
		"postgres://u:s3cret@db.internal/x?sslmode=verify-ca":                            "",
		"host=db.internal sslmode=verify-full":                                           "",
		"postgres://u:s3cret@db.internal:5432/x":                                         `"db.internal:5432" is not a loopback address and sslmode is prefer (the default)`,
		"postgres://u:s3cret@db.internal/x?sslmode=disable":                              "sslmode is disable",
		"postgres://u:s3cret@db.internal/x?sslmode=require":                              "sslmode is require",
		"postgres://u:s3cret@db.internal/x?sslmode=prefer":                               "sslmode is prefer",
		"postgres://u:s3cret@127.0.0.1,db.internal/x?sslmode=disable":                    `"db.internal"`,
		"postgres://u:s3cret@127.0.0.1/x?host=db.internal&sslmode=disable":               `"db.internal"`,
		"host=db.internal password=s3cret sslmode=disable":                               `"db.internal"`,
		"host='db.internal' password='s3 cret' sslmode = 'require'":                      "sslmode is require",
		"postgres://u:s3cret@10.0.0.5:5432/x?sslmode=disable":                            `"10.0.0.5:5432"`,
		"postgres://u:s3cret@db%zz/x":                                                    "not a valid URL",
		"host='db.internal password=s3cret":                                              "nor a valid keyword=value",
	} {
		errs := checkDependencyTLS(dsn, amqpLocal, getenv)
		if want == "" {
			assert.Empty(t, errs, dsn)
			continue
		}
		require.Len(t, errs, 1, dsn)
		msg := errs[0].Error()
		assert.True(t, strings.HasPrefix(msg, "INTEGRATIONS_DATABASE_URL: "), msg)
		assert.Contains(t, msg, want, dsn)
		if !strings.Contains(want, "valid") {
			assert.Contains(t, msg, "INTEGRATIONS_DEPENDENCY_PLAINTEXT=true", dsn)
		}
		assert.NotContains(t, msg, "s3cret", "the password is not echoed")
	}

	// pgx reads PGHOST and PGSSLMODE when the string does not say.
	env["PGHOST"] = "db.internal"
	assert.Len(t, checkDependencyTLS("postgres:///x", amqpLocal, getenv), 1, "PGHOST is the host")
	env["PGSSLMODE"] = "verify-full"
	assert.Empty(t, checkDependencyTLS("postgres:///x", amqpLocal, getenv), "PGSSLMODE is the mode")
	assert.Len(t, checkDependencyTLS("postgres:///x?sslmode=disable", amqpLocal, getenv), 1, "the string's sslmode wins")
	clear(env)

	const pgLocal = "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"
	for u, want := range map[string]string{
		amqpLocal:                       "",
		"amqp://guest:guest@localhost/": "",
		"amqp:///":                      "",
		"amqps://u:s3cret@rabbitmq:5671/?cacertfile=/ca.pem": "",
		"amqp://u:s3cret@rabbitmq:5672/":                     `"rabbitmq" is not a loopback address and amqp:// is plain text`,
		"amqp://u:s3cret@10.1.2.3/":                          `"10.1.2.3"`,
	} {
		errs := checkDependencyTLS(pgLocal, u, getenv)
		if want == "" {
			assert.Empty(t, errs, u)
			continue
		}
		require.Len(t, errs, 1, u)
		assert.True(t, strings.HasPrefix(errs[0].Error(), "INTEGRATIONS_AMQP_URL: "), errs[0].Error())
		assert.Contains(t, errs[0].Error(), want, u)
		assert.NotContains(t, errs[0].Error(), "s3cret")
	}
}

// TestDependencyPlaintextOptOut: loading refuses plain dependencies off loopback, naming both
// variables, and accepts them with INTEGRATIONS_DEPENDENCY_PLAINTEXT=true; the defaults load.
func TestDependencyPlaintextOptOut(t *testing.T) {
	_, err := Load[Common]()
	require.NoError(t, err, "the defaults are loopback")
	t.Setenv("INTEGRATIONS_DATABASE_URL", "postgres://u:p@postgres.integrations.svc:5432/integrations?sslmode=require")
	t.Setenv("INTEGRATIONS_AMQP_URL", "amqp://u:p@rabbitmq.integrations.svc:5672/")
	_, err = Load[Common]()
	assert.ErrorContains(t, err, "INTEGRATIONS_DATABASE_URL: the host")
	assert.ErrorContains(t, err, "INTEGRATIONS_AMQP_URL: the host")
	t.Setenv("INTEGRATIONS_DEPENDENCY_PLAINTEXT", "true")
	_, err = Load[Common]()
	assert.NoError(t, err)
}

// FuzzDependencyTLS: whatever the host and sslmode of a Postgres URL, the check does not panic,
// never quotes the URL's password, and lets a non-verifying mode through only to a local host.
func FuzzDependencyTLS(f *testing.F) {
	for _, s := range [][2]string{{"db.internal:5432", "disable"}, {"127.0.0.1", "prefer"}, {"[::1]:5432", ""},
		{"10.0.0.1,127.0.0.1", "verify-full"}, {"%zz", "require"}, {"db", "verify-ca&host=/tmp"}} {
		f.Add(s[0], s[1])
	}
	const password = "pw-7f3a9c"
	f.Fuzz(func(t *testing.T, host, mode string) {
		if strings.Contains(host+mode, password) {
			return
		}
		dsn := "postgres://u:" + password + "@" + host + "/x?sslmode=" + mode
		errs := checkDependencyTLS(dsn, "amqp://127.0.0.1/", func(string) string { return "" })
		for _, err := range errs {
			if strings.Contains(err.Error(), password) {
				t.Fatalf("%q: the password is in %q", dsn, err)
			}
		}
		settings, hosts, err := parsePostgres(dsn)
		if err != nil || len(errs) > 0 {
			return
		}
		if h, ok := settings["host"]; ok {
			hosts = splitHosts(h)
		}
		if m := settings["sslmode"]; m != "verify-full" && m != "verify-ca" {
			for _, h := range hosts {
				if !localPostgresHost(h) {
					t.Fatalf("%q: %s is remote and sslmode %q, yet accepted", dsn, h, m)
				}
			}
		}
	})
}

// TestBrokerChoice: INTEGRATIONS_BROKER picks the URL the port dials; a kind the port has not, a
// STOMP broker without its URL, a URL of the other kind's scheme and a plain stomp:// off loopback
// are refused at load, naming the variable and never quoting the URL.
func TestBrokerChoice(t *testing.T) {
	// make test exports the STOMP broker's URL (deps.sh up stomp); this test starts from neither.
	for _, k := range []string{"INTEGRATIONS_BROKER", "INTEGRATIONS_STOMP_URL"} {
		t.Setenv(k, "") // restored after the test
		require.NoError(t, os.Unsetenv(k))
	}
	c, err := Load[Common]()
	require.NoError(t, err)
	assert.Equal(t, BrokerRabbitMQ, c.Broker, "the default")
	assert.Equal(t, c.AMQPURL, c.BrokerURL())

	t.Setenv("INTEGRATIONS_BROKER", "kafka")
	_, err = Load[Common]()
	assert.ErrorContains(t, err, `INTEGRATIONS_BROKER: "kafka" is not one of "rabbitmq", "stomp"`)

	t.Setenv("INTEGRATIONS_BROKER", "stomp")
	t.Setenv("INTEGRATIONS_STOMP_URL", "") // make test's environment has one (scripts/deps.sh up stomp)
	_, err = Load[Common]()
	assert.ErrorContains(t, err, `INTEGRATIONS_STOMP_URL: required when INTEGRATIONS_BROKER is "stomp"`)

	t.Setenv("INTEGRATIONS_STOMP_URL", "amqp://u:s3cret@127.0.0.1:5672/")
	_, err = Load[Common]()
	assert.ErrorContains(t, err, `INTEGRATIONS_STOMP_URL: the scheme "amqp" is not stomp or stomp+ssl`)
	assert.NotContains(t, err.Error(), "s3cret")

	t.Setenv("INTEGRATIONS_STOMP_URL", "stomp://u:s3cret@activemq.integrations.svc:61613")
	_, err = Load[Common]()
	assert.ErrorContains(t, err, `INTEGRATIONS_STOMP_URL: the host "activemq.integrations.svc" is not a loopback address and stomp:// is plain text`)
	assert.NotContains(t, err.Error(), "s3cret")

	t.Setenv("INTEGRATIONS_STOMP_URL", "stomp://u:s3cret@127.0.0.1:61613?schedule=soon")
	_, err = Load[Common]()
	assert.ErrorContains(t, err, `INTEGRATIONS_STOMP_URL: the schedule parameter "soon" is not classic or artemis`)
	t.Setenv("INTEGRATIONS_STOMP_URL", "stomp://u:s3cret@127.0.0.1:61613?schedule=artemis&x=1")
	_, err = Load[Common]()
	assert.ErrorContains(t, err, `INTEGRATIONS_STOMP_URL: query parameters other than schedule, cacertfile`)
	t.Setenv("INTEGRATIONS_STOMP_URL", "stomp://u:s3cret@127.0.0.1:61613?schedule=artemis")
	_, err = Load[Common]()
	require.NoError(t, err)

	t.Setenv("INTEGRATIONS_STOMP_URL", "stomp+ssl://u:s3cret@activemq.integrations.svc:61614")
	c, err = Load[Common]()
	require.NoError(t, err)
	assert.Equal(t, "stomp+ssl://u:s3cret@activemq.integrations.svc:61614", c.BrokerURL())

	t.Setenv("INTEGRATIONS_BROKER", "rabbitmq")
	t.Setenv("INTEGRATIONS_AMQP_URL", "stomp://u:s3cret@127.0.0.1:61613")
	_, err = Load[Common]()
	assert.ErrorContains(t, err, `INTEGRATIONS_AMQP_URL: the scheme "stomp" is not amqp or amqps (INTEGRATIONS_BROKER is "rabbitmq")`)
}
