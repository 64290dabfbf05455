package config

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/integrations-platform/integrations/pkg/safetext"
)

// The dependencies' transport: Postgres and RabbitMQ carry the platform's payloads and their
// passwords, so a connection to anything but a loopback address must be TLS that verifies the
// server — sslmode=verify-full or verify-ca, amqps:// — unless the deployment declares that its
// network encrypts (a service mesh), with INTEGRATIONS_DEPENDENCY_PLAINTEXT. Development on
// 127.0.0.1 (make run, the e2e stacks, the benchmarks) needs neither.

const plaintextHint = "or INTEGRATIONS_DEPENDENCY_PLAINTEXT=true if the network between them encrypts (a service mesh)"

// checkDependencyTLS refuses a non-loopback Postgres without a verifying sslmode and a
// non-loopback RabbitMQ over amqp://. getenv is os.Getenv: pgx reads PGHOST and PGSSLMODE when
// the URL does not say. The URLs are never quoted in an error (they hold passwords); hosts are.
func checkDependencyTLS(databaseURL, amqpURL string, getenv func(string) string) []error {
	var errs []error
	if err := checkPostgresTLS(databaseURL, getenv); err != nil {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DATABASE_URL: %w", err))
	}
	if err := checkAMQPTLS(amqpURL); err != nil {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_AMQP_URL: %w", err))
	}
	return errs
}

func checkPostgresTLS(dsn string, getenv func(string) string) error {
	settings, hosts, err := parsePostgres(dsn)
	if err != nil {
		return err
	}
	if h, ok := settings["host"]; ok { // a host parameter overrides the URL's, as in pgx
		hosts = splitHosts(h)
	}
	if len(hosts) == 0 && getenv("PGHOST") != "" {
		hosts = splitHosts(getenv("PGHOST"))
	}
	remote := ""
	for _, h := range hosts {
		if !localPostgresHost(h) {
			remote = h
			break
		}
	}
	if remote == "" {
		return nil // loopback, a Unix socket, or pgx's default (a local socket or localhost)
	}
	mode, ok := settings["sslmode"]
	if !ok {
		mode = getenv("PGSSLMODE")
	}
	if mode == "verify-full" || mode == "verify-ca" {
		return nil
	}
	mode = cmp.Or(mode, "prefer (the default)")
	return fmt.Errorf("the host %q is not a loopback address and sslmode is %s, which does not verify the server: "+
		"set sslmode=verify-full (with sslrootcert for a private CA), %s", safetext.Truncate(remote, 100), safetext.Truncate(mode, 40), plaintextHint)
}

// parsePostgres returns a connection string's settings and the hosts of its URL form.
func parsePostgres(dsn string) (map[string]string, []string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, nil, errors.New("not a valid URL, so its TLS cannot be checked")
		}
		settings := map[string]string{}
		for k, v := range u.Query() {
			settings[k] = v[len(v)-1]
		}
		return settings, splitHosts(u.Host), nil
	}
	settings, err := parseKeywordValue(dsn)
	return settings, nil, err
}

// parseKeywordValue parses libpq's keyword/value form: key=value pairs separated by spaces, a
// value in single quotes with backslash escapes.
func parseKeywordValue(s string) (map[string]string, error) {
	bad := errors.New("neither a postgres:// URL nor a valid keyword=value string, so its TLS cannot be checked")
	out := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t\n\r")
		if s == "" {
			return out, nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, bad
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t\n\r")
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			s = s[1:]
			closed := false
			for len(s) > 0 {
				c := s[0]
				s = s[1:]
				if c == '\\' && len(s) > 0 {
					val.WriteByte(s[0])
					s = s[1:]
					continue
				}
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return nil, bad
			}
		} else {
			for len(s) > 0 && !strings.ContainsRune(" \t\n\r", rune(s[0])) {
				if s[0] == '\\' && len(s) > 1 {
					s = s[1:]
				}
				val.WriteByte(s[0])
				s = s[1:]
			}
		}
		out[key] = val.String()
	}
}

func splitHosts(h string) []string {
	var out []string
	for _, part := range strings.Split(h, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// localPostgresHost says whether a host (with or without its port) is a Unix socket's directory
// or a loopback address.
func localPostgresHost(h string) bool {
	if strings.HasPrefix(h, "/") {
		return true
	}
	return loopbackHost(hostOf(h))
}

func hostOf(hostport string) string {
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		return host
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
}

func loopbackHost(host string) bool { return IsLoopback(net.JoinHostPort(host, "0")) }

func checkAMQPTLS(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a valid URL, so its TLS cannot be checked")
	}
	switch u.Scheme {
	case "amqps":
		return nil // verified against cacertfile or the system's roots (pkg/mq)
	case "amqp":
	default:
		return nil // pkg/mq refuses other schemes when it dials
	}
	host := u.Hostname()
	if host == "" || loopbackHost(host) {
		return nil // amqp091's default host is localhost
	}
	return fmt.Errorf("the host %q is not a loopback address and amqp:// is plain text: use amqps:// (see README, TLS), %s",
		safetext.Truncate(host, 100), plaintextHint)
}

// checkSTOMPTLS is checkAMQPTLS for a STOMP broker: stomp+ssl:// or a loopback host.
func checkSTOMPTLS(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a valid URL, so its TLS cannot be checked")
	}
	if u.Scheme != "stomp" {
		return nil // stomp+ssl, or a scheme checkBroker already refused
	}
	host := u.Hostname()
	if host == "" || loopbackHost(host) {
		return nil
	}
	return fmt.Errorf("the host %q is not a loopback address and stomp:// is plain text: use stomp+ssl://, %s",
		safetext.Truncate(host, 100), plaintextHint)
}

// schemeOf is a URL's scheme, "" when it is not a URL.
func schemeOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme
}
