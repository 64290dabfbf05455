package server

import (
	"context"
	"errors"
	"time"

	"github.com/integrations-platform/integrations/pkg/apperr"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/webhook"
)

// resolveTimeout bounds the courtesy lookup of a consumer's host name at registration: a slow
// DNS answer costs the caller this much at most, and then the name is accepted.
const resolveTimeout = 2 * time.Second

// addressPolicy is the one rule for consumer endpoints (pkg/webhook), as configured. The event
// router applies the same policy before every attempt and on every connection.
func (s *Server) addressPolicy() webhook.Policy {
	return webhook.Policy{AllowPrivate: s.opts.WebhookAllowPrivate, AllowHTTP: s.opts.WebhookAllowHTTP, Deny: s.opts.WebhookDeny}
}

// checkConsumer validates a SetConsumer request: one consumer, with an endpoint the address
// policy accepts; INVALID_ARGUMENT naming the field otherwise.
func (s *Server) checkConsumer(ctx context.Context, req *gatewayv1.SetConsumerRequest) error {
	switch c := req.GetConsumer().(type) {
	case *gatewayv1.SetConsumerRequest_Webhook:
		return s.checkWebhookURL(ctx, c.Webhook.GetUrl())
	case *gatewayv1.SetConsumerRequest_Grpc:
		if err := s.checkGRPCTarget(ctx, c.Grpc.GetTarget()); err != nil {
			return err
		}
		return s.checkGRPCTransport(c.Grpc)
	default:
		return apperr.Invalid("consumer", "required: {\"webhook\": {\"url\": \"https://...\"}} or {\"grpc\": {\"target\": \"host:port\"}}")
	}
}

// checkWebhookURL refuses, as webhook.url, a URL the address policy refuses, or whose host name
// resolves only to refused addresses.
func (s *Server) checkWebhookURL(ctx context.Context, raw string) error {
	const field = "webhook.url"
	u, err := s.addressPolicy().CheckURL(raw)
	if err != nil {
		return invalidEndpoint(field, err)
	}
	return s.checkResolves(ctx, field, u.Hostname())
}

// checkGRPCTarget refuses, as grpc.target, a target that is not host:port or that the address
// policy refuses, or whose host name resolves only to refused addresses.
func (s *Server) checkGRPCTarget(ctx context.Context, target string) error {
	const field = "grpc.target"
	host, err := s.addressPolicy().CheckTarget(target)
	if err != nil {
		return invalidEndpoint(field, err)
	}
	return s.checkResolves(ctx, field, host)
}

// checkGRPCTransport refuses plaintext where http webhooks are not allowed (grpc.plaintext), and
// a CA bundle that is not PEM certificates, too long, or given with plaintext (grpc.ca_pem):
// plaintext is the same exception as an http webhook, one setting for both, for development.
func (s *Server) checkGRPCTransport(c *gatewayv1.GrpcConsumer) error {
	if c.GetPlaintext() && !s.opts.WebhookAllowHTTP {
		return apperr.Invalid("grpc.plaintext", "plaintext delivery is allowed only with INTEGRATIONS_WEBHOOK_ALLOW_HTTP (development); serve TLS and leave plaintext out")
	}
	if c.CaPem == nil {
		return nil
	}
	if c.GetPlaintext() {
		return apperr.Invalid("grpc.ca_pem", "a CA applies to TLS only; leave it out with plaintext")
	}
	if _, err := webhook.ParseCAPEM(c.GetCaPem()); err != nil {
		return invalidEndpoint("grpc.ca_pem", err)
	}
	return nil
}

// checkResolves is the courtesy check at registration: a name that resolves only to private
// addresses is refused now rather than failing every delivery. A name that does not resolve is
// accepted: the check cannot protect anything (the name's DNS is its owner's to change after
// registration, which is why the event router checks every address it connects to), and
// refusing would make registration depend on this gateway's view of DNS — a record not created
// yet, a resolver outage, split-horizon DNS.
func (s *Server) checkResolves(ctx context.Context, field, host string) error {
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	if err := s.addressPolicy().CheckResolved(ctx, s.opts.Resolver, host); err != nil {
		return invalidEndpoint(field, err)
	}
	return nil
}

// invalidEndpoint is the INVALID_ARGUMENT for a refusal of the address policy. Its message is the
// policy's reason, which never repeats the input.
func invalidEndpoint(field string, err error) error {
	var refused *webhook.RefusedError
	if errors.As(err, &refused) {
		return apperr.Invalid(field, "%s", refused.Reason)
	}
	return apperr.Invalid(field, "not a valid consumer endpoint")
}
