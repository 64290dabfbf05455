package mq

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/integrations-platform/integrations/pkg/tlsx"
)

// amqpTLS is the TLS of an amqps:// URL: its query parameters cacertfile (the CA to verify the
// broker with; the system's roots without it), certfile and keyfile (a client certificate, for
// brokers that require one) and server_name_indication (the name to verify, the URL's host
// without it) — RabbitMQ's URI query parameters. The files are re-read when they change (a
// rotated CA or client certificate is used by the next connection).
type amqpTLS struct {
	src        *tlsx.Source // nil: system roots, no client certificate
	serverName string
}

// newAMQPTLS parses rawURL; nil for amqp:// (plain text). The error names the parameter at
// fault, never the URL (it carries the password).
func newAMQPTLS(rawURL string) (*amqpTLS, error) {
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		return nil, errors.New("mq: Config.URL is not an AMQP URI")
	}
	if uri.Scheme != "amqps" {
		if uri.CACertFile != "" || uri.CertFile != "" {
			return nil, errors.New("mq: cacertfile/certfile in an amqp:// URL: use amqps:// for TLS")
		}
		return nil, nil
	}
	t := &amqpTLS{serverName: uri.ServerName}
	t.serverName = cmp.Or(t.serverName, uri.Host)
	if (uri.CertFile == "") != (uri.KeyFile == "") {
		return nil, errors.New("mq: amqps URL: certfile and keyfile go together")
	}
	files := tlsx.Files{CertFile: uri.CertFile, KeyFile: uri.KeyFile, CAFile: uri.CACertFile}
	if files != (tlsx.Files{}) {
		if t.src, err = tlsx.NewSource(files); err != nil {
			return nil, fmt.Errorf("mq: amqps URL's cacertfile/certfile/keyfile: %w", err)
		}
	}
	return t, nil
}

// config is a fresh configuration for one connection (amqp091-go writes into the one it is given;
// the STOMP provider uses the same for stomp+ssl://).
func (t *amqpTLS) config() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.serverName}
	if t.src != nil {
		cfg.RootCAs = t.src.Pool() // nil without cacertfile: the system's roots
		if t.src.Certificate() != nil {
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return t.src.Certificate(), nil }
		}
	}
	return cfg
}

// newSTOMPTLS is the TLS of a stomp+ssl:// URL, from the same query parameters as an amqps://
// URL's (cacertfile, certfile, keyfile, server_name_indication); nil for stomp:// (plain text),
// where they are refused. The error names the parameter, never the URL.
func newSTOMPTLS(u *url.URL) (*amqpTLS, error) {
	q := u.Query()
	files := tlsx.Files{CertFile: q.Get("certfile"), KeyFile: q.Get("keyfile"), CAFile: q.Get("cacertfile")}
	if u.Scheme != "stomp+ssl" {
		if files != (tlsx.Files{}) || q.Get("server_name_indication") != "" {
			return nil, errors.New("mq: cacertfile/certfile/keyfile/server_name_indication in a stomp:// URL: use stomp+ssl:// for TLS")
		}
		return nil, nil
	}
	t := &amqpTLS{serverName: q.Get("server_name_indication")}
	t.serverName = cmp.Or(t.serverName, u.Hostname())
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, errors.New("mq: stomp+ssl URL: certfile and keyfile go together")
	}
	if files != (tlsx.Files{}) {
		var err error
		if t.src, err = tlsx.NewSource(files); err != nil {
			return nil, fmt.Errorf("mq: stomp+ssl URL's cacertfile/certfile/keyfile: %w", err)
		}
	}
	return t, nil
}
