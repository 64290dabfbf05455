// Package config loads a service's settings from the environment. Every setting has a variable
// named INTEGRATIONS_*, a documented default where one is safe, and validation that fails fast
// with the variable's name.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/integrations-platform/integrations/pkg/lifecycle"
	"github.com/integrations-platform/integrations/pkg/safetext"
	"github.com/integrations-platform/integrations/pkg/secret"
	"github.com/integrations-platform/integrations/pkg/tlsx"
)

// Common holds the settings every service shares.
type Common struct {
	LogLevel    string `env:"INTEGRATIONS_LOG_LEVEL" envDefault:"info"`
	DatabaseURL string `env:"INTEGRATIONS_DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/integrations?sslmode=disable"`
	// DatabaseMaxConns sizes the service's connection pool; 0 keeps the URL's pool_max_conns or
	// the service's own default.
	DatabaseMaxConns int    `env:"INTEGRATIONS_DATABASE_MAX_CONNS" envDefault:"0"`
	AMQPURL          string `env:"INTEGRATIONS_AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	// Broker is the message port's provider: "rabbitmq" (INTEGRATIONS_AMQP_URL) or "stomp"
	// (INTEGRATIONS_STOMP_URL, a STOMP 1.2 broker such as ActiveMQ).
	Broker      string  `env:"INTEGRATIONS_BROKER" envDefault:"rabbitmq"`
	STOMPURL    string  `env:"INTEGRATIONS_STOMP_URL"`
	QueueScope  string  `env:"INTEGRATIONS_QUEUE_SCOPE" envDefault:"integrations"`
	TimeScale   float64 `env:"INTEGRATIONS_TIME_SCALE" envDefault:"1"`
	MetricsAddr string  `env:"INTEGRATIONS_METRICS_ADDR"`
	// Pprof serves net/http/pprof on the metrics address too: for diagnosis, off by default.
	Pprof bool `env:"INTEGRATIONS_PPROF" envDefault:"false"`
	// GRPCReflection serves the gRPC reflection service on the service's gRPC port (grpcurl
	// without .proto files): for development, off by default.
	GRPCReflection bool `env:"INTEGRATIONS_GRPC_REFLECTION" envDefault:"false"`
	// A shutdown, measured from SIGTERM: health NOT_SERVING for the drain window while the service
	// still works, then no new calls or messages taken; in-flight work cancelled at the soft
	// timeout; the process gone by the shutdown timeout (see pkg/lifecycle). Not time-scaled: they
	// are about load balancers and Kubernetes, which run on the wall clock. The drain window and
	// the soft timeout, when unset, are derived from the shutdown timeout (see deriveShutdown).
	DrainWindow         time.Duration `env:"INTEGRATIONS_DRAIN_WINDOW"`
	ShutdownSoftTimeout time.Duration `env:"INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT"`
	ShutdownTimeout     time.Duration `env:"INTEGRATIONS_SHUTDOWN_TIMEOUT" envDefault:"15s"`
	// DependencyPlaintext allows Postgres without sslmode=verify-full/verify-ca and RabbitMQ over
	// amqp:// to non-loopback hosts: for a network that encrypts on its own (a service mesh's
	// mTLS). Off, such URLs are refused (see checkDependencyTLS).
	DependencyPlaintext bool `env:"INTEGRATIONS_DEPENDENCY_PLAINTEXT" envDefault:"false"`
}

// Shared is the shared settings of a settings struct that embeds Common (pkg/service reads
// them from any service's settings).
func (c Common) Shared() Common { return c }

// SecretKeys is the key that seals webhook signing secrets at rest (32 bytes, base64), and the
// one before a rotation, which still opens secrets sealed under it: embedded in the settings of
// the services that hold signing secrets (the gateway and the event router).
type SecretKeys struct {
	SecretKey         string `env:"INTEGRATIONS_SECRET_KEY,required"`
	SecretKeyPrevious string `env:"INTEGRATIONS_SECRET_KEY_PREVIOUS"`
}

// Box is the keys' secret.Box; the error names INTEGRATIONS_SECRET_KEY.
func (c SecretKeys) Box() (*secret.Box, error) {
	return secret.NewBox("INTEGRATIONS_SECRET_KEY", c.SecretKey, c.SecretKeyPrevious)
}

// InternalTLS is a service's identity on the internal hops (mTLS between the platform's
// services; embedded in each of the six services' settings, not in Common: the dummy adapter and
// the demo consumer are outside the platform): its certificate — URI SAN spiffe://integrations/<service> — and key, and the internal
// CA its peers' certificates are verified against. The files are re-read when they change.
// Required: only loopback development may turn mTLS off, with INTEGRATIONS_INTERNAL_PLAINTEXT.
type InternalTLS struct {
	TLSCertFile string `env:"INTEGRATIONS_TLS_CERT_FILE"`
	TLSKeyFile  string `env:"INTEGRATIONS_TLS_KEY_FILE"`
	TLSCAFile   string `env:"INTEGRATIONS_TLS_CA_FILE"`
	// InternalPlaintext turns the internal hops' mTLS off; refused unless every internal address
	// the service listens on or dials is a loopback one (see CheckInternalPlaintext).
	InternalPlaintext bool `env:"INTEGRATIONS_INTERNAL_PLAINTEXT" envDefault:"false"`
}

// InternalFiles is the identity's files for grpcx.NewInternal; zero when mTLS is off.
func (c InternalTLS) InternalFiles() tlsx.Files {
	if c.InternalPlaintext {
		return tlsx.Files{}
	}
	return tlsx.Files{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, CAFile: c.TLSCAFile}
}

// Validate checks that the identity's files are named, unless mTLS is off.
func (c InternalTLS) Validate() error {
	if c.InternalPlaintext {
		return nil
	}
	var missing []string
	for name, v := range map[string]string{
		"INTEGRATIONS_TLS_CERT_FILE": c.TLSCertFile, "INTEGRATIONS_TLS_KEY_FILE": c.TLSKeyFile, "INTEGRATIONS_TLS_CA_FILE": c.TLSCAFile,
	} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("%s: internal mTLS needs INTEGRATIONS_TLS_CERT_FILE, INTEGRATIONS_TLS_KEY_FILE and INTEGRATIONS_TLS_CA_FILE "+
		"(or INTEGRATIONS_INTERNAL_PLAINTEXT=true, on loopback addresses only)", strings.Join(missing, ", "))
}

// CheckInternalPlaintext refuses plaintext internal hops on any address that is not loopback:
// addrs maps a variable's name to its address (host:port). Nil when mTLS is on.
func (c InternalTLS) CheckInternalPlaintext(addrs map[string]string) error {
	if !c.InternalPlaintext {
		return nil
	}
	var errs []error
	for _, name := range sortedKeys(addrs) {
		if !IsLoopback(addrs[name]) {
			errs = append(errs, fmt.Errorf("%s: %q is not a loopback address, and INTEGRATIONS_INTERNAL_PLAINTEXT is true: "+
				"set INTEGRATIONS_TLS_CERT_FILE, INTEGRATIONS_TLS_KEY_FILE and INTEGRATIONS_TLS_CA_FILE", name, addrs[name]))
		}
	}
	return errors.Join(errs...)
}

// PublicTLS is the certificate of a service's client-facing listeners (the gateway's REST and
// gRPC ports, adapter-callback's port): served whenever it is configured. Without it a listener
// must be on a loopback address (development) or explicitly declared plaintext — behind a mesh or
// load balancer that terminates TLS — with INTEGRATIONS_PUBLIC_PLAINTEXT.
type PublicTLS struct {
	PublicCertFile  string `env:"INTEGRATIONS_PUBLIC_TLS_CERT_FILE"`
	PublicKeyFile   string `env:"INTEGRATIONS_PUBLIC_TLS_KEY_FILE"`
	PublicPlaintext bool   `env:"INTEGRATIONS_PUBLIC_PLAINTEXT" envDefault:"false"`
}

// PublicTLSEnabled says whether the client-facing listeners serve TLS.
func (c PublicTLS) PublicTLSEnabled() bool { return c.PublicCertFile != "" }

// PublicFiles is the certificate's files for tlsx.NewSource.
func (c PublicTLS) PublicFiles() tlsx.Files {
	return tlsx.Files{CertFile: c.PublicCertFile, KeyFile: c.PublicKeyFile}
}

// PublicSource loads the certificate, reloaded on change; nil without one (plaintext).
func (c PublicTLS) PublicSource(opts ...tlsx.Option) (*tlsx.Source, error) {
	if !c.PublicTLSEnabled() {
		return nil, nil
	}
	return tlsx.NewSource(c.PublicFiles(), opts...)
}

// Check validates the settings for the listeners in addrs (a variable's name → its address).
func (c PublicTLS) Check(addrs map[string]string) error {
	if (c.PublicCertFile == "") != (c.PublicKeyFile == "") {
		return errors.New("INTEGRATIONS_PUBLIC_TLS_CERT_FILE, INTEGRATIONS_PUBLIC_TLS_KEY_FILE: set both or neither")
	}
	if c.PublicTLSEnabled() || c.PublicPlaintext {
		return nil
	}
	var errs []error
	for _, name := range sortedKeys(addrs) {
		if !IsLoopback(addrs[name]) {
			errs = append(errs, fmt.Errorf("%s: %q is not a loopback address and has no certificate: set INTEGRATIONS_PUBLIC_TLS_CERT_FILE "+
				"and INTEGRATIONS_PUBLIC_TLS_KEY_FILE, or INTEGRATIONS_PUBLIC_PLAINTEXT=true behind a TLS-terminating proxy", name, addrs[name]))
		}
	}
	return errors.Join(errs...)
}

// IsLoopback says whether addr (host:port) is on a loopback address: 127.0.0.0/8, ::1 or
// localhost. An empty host (":8080", all interfaces) is not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Zone() == "" && ip.Unmap().IsLoopback()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Unset shutdown phases are derived from the shutdown timeout T: the drain window is
// min(maxDefaultDrain, T/3), the soft timeout 2T/3 — 5 s and 10 s for the default 15 s. Fixed
// defaults would break an upgrade: a deployment that set only INTEGRATIONS_SHUTDOWN_TIMEOUT to
// 10 s or less, valid before the phases existed, would fail validation against a fixed 10 s
// soft timeout. Only values set explicitly can be inconsistent, and the error names them.
const maxDefaultDrain = 5 * time.Second

// deriveShutdown fills the drain window and soft timeout that the environment leaves unset
// (lookup is os.LookupEnv; an empty value counts as unset), keeping them consistent with the
// phases that are set: a derived drain is no longer than an explicit soft timeout, a derived
// soft timeout no shorter than an explicit drain window.
func (c *Common) deriveShutdown(lookup func(string) (string, bool)) {
	set := func(name string) bool { v, ok := lookup(name); return ok && v != "" }
	hard := c.ShutdownTimeout
	drainSet, softSet := set("INTEGRATIONS_DRAIN_WINDOW"), set("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT")
	if !drainSet {
		c.DrainWindow = max(min(maxDefaultDrain, (hard/3).Truncate(time.Millisecond)), 0)
		if softSet {
			c.DrainWindow = max(min(c.DrainWindow, c.ShutdownSoftTimeout), 0)
		}
	}
	if !softSet {
		c.ShutdownSoftTimeout = max((hard * 2 / 3).Truncate(time.Millisecond), c.DrainWindow, 0)
	}
}

// shutdownDeriver is Common's deriveShutdown, promoted to every settings struct embedding it.
type shutdownDeriver interface {
	deriveShutdown(lookup func(string) (string, bool))
}

// Shutdown is the shutdown's timeouts for lifecycle.New.
func (c Common) Shutdown() lifecycle.Timeouts {
	return lifecycle.Timeouts{Drain: c.DrainWindow, Soft: c.ShutdownSoftTimeout, Hard: c.ShutdownTimeout}
}

// Validate checks the shared settings.
func (c Common) Validate() error {
	var errs []error
	if c.TimeScale <= 0 || c.TimeScale > 1 {
		errs = append(errs, fmt.Errorf("INTEGRATIONS_TIME_SCALE: %v must be in (0, 1]", c.TimeScale))
	}
	errs = append(errs, Between("INTEGRATIONS_DATABASE_MAX_CONNS", c.DatabaseMaxConns, 0, 1000))
	switch {
	case c.ShutdownTimeout <= 0:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SHUTDOWN_TIMEOUT: %v must be positive", c.ShutdownTimeout))
	case c.DrainWindow < 0:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DRAIN_WINDOW: %v must not be negative", c.DrainWindow))
	case c.DrainWindow >= c.ShutdownTimeout:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_DRAIN_WINDOW: %v must be less than INTEGRATIONS_SHUTDOWN_TIMEOUT (%v)",
			c.DrainWindow, c.ShutdownTimeout))
	case c.ShutdownSoftTimeout < c.DrainWindow:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT: %v must be at least INTEGRATIONS_DRAIN_WINDOW (%v)",
			c.ShutdownSoftTimeout, c.DrainWindow))
	case c.ShutdownSoftTimeout >= c.ShutdownTimeout:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_SHUTDOWN_SOFT_TIMEOUT: %v must be less than INTEGRATIONS_SHUTDOWN_TIMEOUT (%v)",
			c.ShutdownSoftTimeout, c.ShutdownTimeout))
	}
	errs = append(errs, c.checkBroker()...)
	if !c.DependencyPlaintext {
		errs = append(errs, checkDependencyTLS(c.DatabaseURL, c.AMQPURL, os.Getenv)...)
		if c.Broker == BrokerSTOMP {
			if err := checkSTOMPTLS(c.STOMPURL); err != nil {
				errs = append(errs, fmt.Errorf("INTEGRATIONS_STOMP_URL: %w", err))
			}
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("INTEGRATIONS_LOG_LEVEL: %q is not one of debug, info, warn, error", c.LogLevel))
	}
	return errors.Join(errs...)
}

// The values of INTEGRATIONS_BROKER (pkg/mq's providers: mq.ProviderRabbitMQ, mq.ProviderSTOMP).
const (
	BrokerRabbitMQ = "rabbitmq"
	BrokerSTOMP    = "stomp"
)

// checkBroker checks INTEGRATIONS_BROKER and that the URL it reads has the scheme of its kind.
// pkg/mq checks the same again when it dials; here it fails before anything starts, naming the
// variable. The URLs are never quoted (they hold passwords).
func (c Common) checkBroker() []error {
	switch c.Broker {
	case BrokerRabbitMQ:
		if s := schemeOf(c.AMQPURL); s != "amqp" && s != "amqps" {
			return []error{fmt.Errorf("INTEGRATIONS_AMQP_URL: the scheme %q is not amqp or amqps (INTEGRATIONS_BROKER is %q)",
				safetext.Truncate(s, 20), c.Broker)}
		}
	case BrokerSTOMP:
		if c.STOMPURL == "" {
			return []error{errors.New("INTEGRATIONS_STOMP_URL: required when INTEGRATIONS_BROKER is \"stomp\" (e.g. stomp://user:password@127.0.0.1:61613)")}
		}
		if s := schemeOf(c.STOMPURL); s != "stomp" && s != "stomp+ssl" {
			return []error{fmt.Errorf("INTEGRATIONS_STOMP_URL: the scheme %q is not stomp or stomp+ssl", safetext.Truncate(s, 20))}
		}
		// The port's query parameters (pkg/mq's STOMP provider reads them): the broker's
		// scheduled-delivery header, and stomp+ssl://'s TLS files as in an amqps:// URL.
		if u, err := url.Parse(c.STOMPURL); err == nil {
			q := u.Query()
			if v := q.Get("schedule"); v != "" && v != "classic" && v != "artemis" {
				return []error{fmt.Errorf("INTEGRATIONS_STOMP_URL: the schedule parameter %q is not classic or artemis", safetext.Truncate(v, 20))}
			}
			for _, k := range []string{"schedule", "cacertfile", "certfile", "keyfile", "server_name_indication"} {
				q.Del(k)
			}
			if len(q) > 0 {
				return []error{errors.New("INTEGRATIONS_STOMP_URL: query parameters other than schedule, cacertfile, certfile, keyfile and server_name_indication are not known")}
			}
		}
	default:
		return []error{fmt.Errorf("INTEGRATIONS_BROKER: %q is not one of %q, %q", safetext.Truncate(c.Broker, 40), BrokerRabbitMQ, BrokerSTOMP)}
	}
	return nil
}

// BrokerURL is the URL of the broker INTEGRATIONS_BROKER names: INTEGRATIONS_STOMP_URL for
// "stomp", INTEGRATIONS_AMQP_URL otherwise.
func (c Common) BrokerURL() string {
	if c.Broker == BrokerSTOMP {
		return c.STOMPURL
	}
	return c.AMQPURL
}

// Scale shrinks a duration by the configured time scale (INTEGRATIONS_TIME_SCALE), so that
// tests and demos run a schedule of minutes and hours in seconds.
func (c Common) Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.TimeScale)
}

// The checks of one setting: each is nil when the value v of the variable name is acceptable,
// else an error naming the variable, its value and the rule. errors.Join drops the nils.

// Positive refuses a v that is not above zero.
func Positive[T int | time.Duration](name string, v T) error {
	if v <= 0 {
		return fmt.Errorf("%s: %v must be positive", name, v)
	}
	return nil
}

// AtLeast refuses a v below lo.
func AtLeast[T int | time.Duration](name string, v, lo T) error {
	if v < lo {
		return fmt.Errorf("%s: %v must be at least %s", name, v, bound(lo))
	}
	return nil
}

// Between refuses a v outside [lo, hi].
func Between[T int | time.Duration](name string, v, lo, hi T) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s: %v must be between %s and %s", name, v, bound(lo), bound(hi))
	}
	return nil
}

// bound is a limit as a person writes it: 24h, not 24h0m0s.
func bound[T int | time.Duration](v T) string {
	s := fmt.Sprint(v)
	if _, ok := any(v).(time.Duration); ok {
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
	}
	return s
}

// Validator is implemented by settings structs that check themselves after loading.
type Validator interface {
	Validate() error
}

// Load parses the environment into a T and validates it. The error names every variable that is
// missing or malformed.
func Load[T any]() (T, error) {
	var cfg T
	if err := env.Parse(&cfg); err != nil {
		return cfg, fmt.Errorf("configuration: %w", err)
	}
	if d, ok := any(&cfg).(shutdownDeriver); ok {
		d.deriveShutdown(os.LookupEnv)
	}
	if v, ok := any(&cfg).(Validator); ok {
		if err := v.Validate(); err != nil {
			return cfg, fmt.Errorf("configuration: %w", err)
		}
	}
	return cfg, nil
}
