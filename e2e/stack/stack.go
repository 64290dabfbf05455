// Package stack runs the whole platform as a user would: the six services and the dummy adapter
// as separate processes built from this workspace (Build), on free loopback ports, with mTLS on
// every internal hop, a Postgres schema and a queue scope of their own and the dev catalog
// applied. The e2e suite and the benchmarks both run it: New prepares a stack and Launch starts
// the programs a scenario names (e2e, through a testing.T wrapper in e2e/stack_test.go); Start
// starts every program, replicas behind a proxy, and registers a webhook receiver (bench). Close
// stops every process, drops a schema the stack created and deletes the scope's queues.
//
// It is a package of the e2e module, not a _test file, so that bench can import it; it needs no
// testing.T and returns its errors.
package stack

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db"
	"github.com/integrations-platform/integrations/pkg/freeport"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// ModulePrefix is the import path every program of the workspace starts with.
const ModulePrefix = "github.com/integrations-platform/integrations/"

// Programs are the processes of a stack, by name → package, in start order.
var Programs = []struct{ Name, Package string }{
	{"settlement", ModulePrefix + "services/settlement"},
	{"dispatcher", ModulePrefix + "services/dispatcher"},
	{"adapter-callback", ModulePrefix + "services/adapter-callback"},
	{"execution-consumer", ModulePrefix + "services/execution-consumer"},
	{"event-router", ModulePrefix + "services/event-router"},
	{"gateway", ModulePrefix + "services/gateway"},
	{"dummy-adapter", ModulePrefix + "cmd/dummy-adapter"},
}

const (
	// AppID is the dev catalog's application, which the stack's API key belongs to.
	AppID = "dev-app"
	// Capability is the dev catalog's capability served by the dummy adapter.
	Capability = "dummy.echo"
)

// declareGrace is how long after the last launch (a service declaring its queues) the queues may
// be deleted: RabbitMQ 3.10's at-least-once dead-letter worker crashes when its queue is deleted
// while it starts (see the hazard note in pkg/mq/rabbitmq.go). It waits for the broker, not for
// anything of the stack's.
const declareGrace = 2 * time.Second

// clientFacing are the programs whose port is the clients' (applications', adapters'), not the
// platform's own: plain, or TLS with server authentication (Config.PublicTLS), never mTLS.
var clientFacing = map[string]bool{"gateway": true, "adapter-callback": true}

// Build compiles every program into a new temporary directory and returns it; the caller removes
// it. root is the workspace root (the directory of go.work).
func Build(ctx context.Context, root string, out io.Writer) (string, error) {
	dir, err := os.MkdirTemp("", "integrations-stack-bin-")
	if err != nil {
		return "", err
	}
	args := []string{"build", "-o", dir + "/"}
	for _, p := range Programs {
		args = append(args, p.Package)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("build services: %w", err)
	}
	return dir, nil
}

// FindRoot returns the workspace root: the nearest directory at or above the working directory
// that holds go.work.
func FindRoot() (string, error) {
	dir, err := os.Getwd()
	for ; err == nil; dir = filepath.Dir(dir) {
		if _, serr := os.Stat(filepath.Join(dir, "go.work")); serr == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			err = errors.New("no go.work at or above the working directory: run from the repository (or pass -root)")
		}
	}
	return "", err
}

// Broker is the message broker a stack runs on: a provider of the port (mq.ProviderRabbitMQ when
// empty) and its URL ($INTEGRATIONS_AMQP_URL or the local RabbitMQ when empty, for RabbitMQ).
type Broker struct{ Provider, URL string }

// STOMP is the STOMP broker of $INTEGRATIONS_STOMP_URL (scripts/deps.sh up stomp starts an
// ActiveMQ and writes it to .run/deps.env); an error when it is not set.
func STOMP() (Broker, error) {
	u := os.Getenv("INTEGRATIONS_STOMP_URL")
	if u == "" {
		return Broker{}, errors.New("INTEGRATIONS_STOMP_URL is not set: a STOMP stack needs a STOMP broker " +
			"(scripts/deps.sh up stomp && set -a && . .run/deps.env && set +a)")
	}
	return Broker{Provider: mq.ProviderSTOMP, URL: u}, nil
}

// Config says how to run a stack.
type Config struct {
	// Root is the workspace root (for deploy/catalog/dev.yaml); BinDir holds the programs (Build).
	Root, BinDir string
	// DatabaseURL is the database (no search_path). Schema names a migrated schema there that the
	// caller owns (e2e's come from dbtest); when empty the stack creates one, migrates it, and
	// drops it on Close. DatabaseParams are added to the services' URL (e.g. pool_max_conns=16).
	DatabaseURL, Schema string
	DatabaseParams      url.Values
	Broker              Broker
	// Name prefixes a created schema and the queue scope ("bench" when empty).
	Name string
	// LogLevel and TimeScale of the services ("info" and 1 when zero).
	LogLevel  string
	TimeScale float64
	// Env is added to every program's environment, ProgramEnv to one instance's by name (Replicas'
	// instances get their program's): they become the Stack's, read at each launch.
	Env        []string
	ProgramEnv map[string][]string
	// TLSDir holds the CA and the services' certificates (devca), made if need be (a directory of
	// the stack's own when empty); PublicTLS serves TLS on the client-facing listeners too.
	TLSDir    string
	PublicTLS bool
	// GatewayPprof serves net/http/pprof on the gateway's metrics address, Pprof on every service's.
	GatewayPprof, Pprof bool
	// Without names programs Start leaves out, for diagnosis only (e.g. the gateway without the
	// dispatcher, to see what the background work costs the accept path).
	Without []string
	// Replicas is the number of instances of each of the six services (1 when zero; the dummy
	// adapter runs once): instance i of program p is named "p#i", and Addrs[p] is a TCP proxy that
	// spreads connections over the instances, as a load balancer would.
	Replicas int
	// StartTimeout bounds the wait for each program to report SERVING (20 s when zero).
	StartTimeout time.Duration
	// Log receives progress lines (nothing when nil).
	Log io.Writer
}

// Stack is a platform: its schema, queue scope, addresses and processes.
type Stack struct {
	// Env and ProgramEnv: see Config; a caller may add to them before a launch.
	Env        []string
	ProgramEnv map[string][]string
	// Schema is the stack's Postgres schema, SchemaURL connects to it, DB is a small pool on it
	// for the harness's own queries; Scope is the queue scope.
	Schema, SchemaURL, Scope string
	DB                       *pgxpool.Pool
	// APIKey is the dev application's, AdapterCredential the dummy adapter's (for calling
	// adapter-callback as it would), PlatformKey signs the platform's tokens to the adapter.
	APIKey, AdapterCredential string
	PlatformKey               ed25519.PrivateKey
	// Addrs are the instances' gRPC addresses by name, the gateways' REST "<name>-http" and the
	// services' "<name>-metrics"; RESTURL is the gateway's REST base URL.
	Addrs   map[string]string
	RESTURL string
	// Receiver is the dev application's webhook consumer, SigningSecret signs its deliveries (Start).
	Receiver      *Receiver
	SigningSecret string
	// LogDir holds one log file per instance.
	LogDir string

	cfg        Config
	tlsDir     string
	admin      *pgxpool.Pool // set when the stack created its schema
	env        []string      // every program's, before Env
	programOf  map[string]string
	instances  map[string][]string // program → its instance names
	procs      map[string]*process
	proxies    []*proxy
	lastLaunch time.Time
	mu         sync.Mutex
	closeOnce  sync.Once
	closeErr   error
	stopping   bool
	unexpected []string
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	// expected is set before the harness ends the process on purpose (Kill, Terminate, Close).
	expected atomic.Bool
}

// New prepares a stack: its schema (created and migrated unless Config.Schema names one), the dev
// catalog with the stack's API key, adapter address and credential, every program's addresses
// and environment (and with Replicas, the proxies). Nothing runs yet: Launch starts programs. On
// error whatever was made is removed again.
func New(ctx context.Context, cfg Config) (*Stack, error) {
	cfg.Name, cfg.LogLevel = cmp.Or(cfg.Name, "bench"), cmp.Or(cfg.LogLevel, "info")
	cfg.TimeScale, cfg.StartTimeout = cmp.Or(cfg.TimeScale, 1), cmp.Or(cfg.StartTimeout, 20*time.Second)
	if cfg.Broker.Provider = cmp.Or(cfg.Broker.Provider, mq.ProviderRabbitMQ); cfg.Broker.Provider == mq.ProviderRabbitMQ {
		cfg.Broker.URL = cmp.Or(cfg.Broker.URL, os.Getenv("INTEGRATIONS_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	}
	s := &Stack{cfg: cfg, Env: slices.Clone(cfg.Env), ProgramEnv: map[string][]string{}, Addrs: map[string]string{},
		programOf: map[string]string{}, instances: map[string][]string{}, procs: map[string]*process{}}
	maps.Copy(s.ProgramEnv, cfg.ProgramEnv)
	if err := s.prepare(ctx); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

func (s *Stack) prepare(ctx context.Context) error {
	var err error
	if s.LogDir, err = os.MkdirTemp("", "integrations-stack-logs-"); err != nil {
		return err
	}
	s.tlsDir = cmp.Or(s.cfg.TLSDir, filepath.Join(s.LogDir, "tls"))
	if _, err := devca.Ensure(s.tlsDir); err != nil {
		return err
	}
	if err := s.openSchema(ctx); err != nil {
		return err
	}
	s.logf("schema %s, queue scope %s, logs in %s", s.Schema, s.Scope, s.LogDir)
	for _, p := range Programs {
		if err := s.addInstances(p.Name); err != nil {
			return err
		}
	}
	s.RESTURL = s.Scheme() + s.Addrs["gateway-http"]
	if err := s.environment(); err != nil {
		return err
	}
	return s.applyCatalog(ctx)
}

// openSchema creates and migrates the stack's schema, unless the caller gave one, and opens DB.
func (s *Stack) openSchema(ctx context.Context) error {
	var err error
	s.Schema = s.cfg.Schema
	if s.Schema == "" {
		if s.admin, err = db.Open(ctx, s.cfg.DatabaseURL); err != nil {
			return fmt.Errorf("stack database: %w", err)
		}
		name := s.cfg.Name + "_" + time.Now().UTC().Format("20060102t150405") + "_" + randomHex(3)
		if _, err := s.admin.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		s.Schema = name
	}
	s.Scope = s.cfg.Name + "." + s.Schema
	if s.SchemaURL, err = withParams(s.cfg.DatabaseURL, url.Values{"search_path": {s.Schema}}); err != nil {
		return err
	}
	if s.admin != nil {
		if _, err = db.Migrate(ctx, s.SchemaURL); err != nil {
			return err
		}
	}
	s.DB, err = db.Open(ctx, s.SchemaURL, func(c *pgxpool.Config) { c.MaxConns = 2 })
	return err
}

// addInstances names a program's instances and gives them their addresses: the program's own
// name, or with Replicas "p#1"…, behind a proxy on the program's address.
func (s *Stack) addInstances(program string) error {
	if s.cfg.Replicas < 2 || program == "dummy-adapter" {
		return s.AddInstance(program, program)
	}
	for i := 1; i <= s.cfg.Replicas; i++ {
		name := fmt.Sprintf("%s#%d", program, i)
		if err := s.AddInstance(name, program); err != nil {
			return err
		}
		s.ProgramEnv[name] = append(slices.Clone(s.cfg.ProgramEnv[program]), s.ProgramEnv[name]...)
	}
	if program == "gateway" { // a metrics address belongs to one instance: gateway-metrics is the first's
		s.Addrs["gateway-metrics"] = s.Addrs["gateway#1-metrics"]
	}
	for _, suffix := range []string{"", "-http"} {
		var backends []string
		for _, inst := range s.instances[program] {
			if addr, ok := s.Addrs[inst+suffix]; ok {
				backends = append(backends, addr)
			}
		}
		if len(backends) == 0 {
			continue
		}
		addr, err := freeport.Addr()
		if err != nil {
			return err
		}
		p, err := newProxy(addr, backends)
		if err != nil {
			return fmt.Errorf("proxy on %s: %w", addr, err)
		}
		s.Addrs[program+suffix], s.proxies = addr, append(s.proxies, p)
	}
	return nil
}

// AddInstance names an instance of a program (another replica, or one configured apart through
// ProgramEnv) and gives it addresses of its own: gRPC, REST for a gateway, metrics for a service.
// Launch starts it. Adding a name again changes nothing.
func (s *Stack) AddInstance(name, program string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.programOf[name]; ok {
		return nil
	}
	for _, k := range []string{"", "-http", "-metrics"} {
		if k == "-http" && program != "gateway" || k == "-metrics" && !slices.Contains(devca.Services, program) {
			continue
		}
		addr, err := freeport.Addr()
		if err != nil {
			return err
		}
		s.Addrs[name+k] = addr
	}
	s.programOf[name] = program
	s.instances[program] = append(s.instances[program], name)
	return nil
}

// environment sets the secrets and what every program is told.
func (s *Stack) environment() error {
	s.APIKey = "dev_" + randomHex(16)
	s.AdapterCredential = "adc_" + randomHex(16)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	platformPub, platformKey, err := platformtoken.Generate()
	if err != nil {
		return err
	}
	s.PlatformKey = platformKey
	serviceURL, err := withParams(s.SchemaURL, s.cfg.DatabaseParams)
	if err != nil {
		return err
	}
	s.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"INTEGRATIONS_DATABASE_URL=" + serviceURL,
		"INTEGRATIONS_QUEUE_SCOPE=" + s.Scope,
		"INTEGRATIONS_TIME_SCALE=" + fmt.Sprint(s.cfg.TimeScale),
		"INTEGRATIONS_LOG_LEVEL=" + s.cfg.LogLevel,
		"INTEGRATIONS_SECRET_KEY=" + base64.StdEncoding.EncodeToString(key),
		"INTEGRATIONS_WEBHOOK_ALLOW_HTTP=true",
		"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE=true",
		"INTEGRATIONS_DISPATCHER_ADDR=" + s.Addrs["dispatcher"],
		"INTEGRATIONS_SETTLEMENT_ADDR=" + s.Addrs["settlement"],
		"INTEGRATIONS_CALLBACK_ADDR=" + s.Addrs["adapter-callback"],
		"INTEGRATIONS_DUMMY_ADAPTER_ADDR=" + s.Addrs["dummy-adapter"],
		"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL=" + s.AdapterCredential,
		"INTEGRATIONS_PLATFORM_SIGNING_KEY=" + platformtoken.EncodePrivateKey(platformKey),
		"INTEGRATIONS_PLATFORM_PUBLIC_KEYS=" + platformtoken.EncodePublicKey(platformPub),
		"INTEGRATIONS_TLS_CA_FILE=" + devca.CAFile(s.tlsDir),
		"INTEGRATIONS_BROKER=" + s.cfg.Broker.Provider,
	}
	if s.cfg.Broker.Provider == mq.ProviderSTOMP {
		// Nothing of a STOMP stack may still reach RabbitMQ: a closed port makes any use of
		// INTEGRATIONS_AMQP_URL fail instead of quietly working.
		s.env = append(s.env, "INTEGRATIONS_STOMP_URL="+s.cfg.Broker.URL, "INTEGRATIONS_AMQP_URL=amqp://guest:guest@127.0.0.1:1/")
	} else {
		s.env = append(s.env, "INTEGRATIONS_AMQP_URL="+s.cfg.Broker.URL)
	}
	if s.cfg.PublicTLS {
		s.env = append(s.env, "INTEGRATIONS_CALLBACK_CA_FILE="+devca.CAFile(s.tlsDir)) // the dummy adapter's callbacks
	}
	return nil
}

// applyCatalog applies the dev catalog with this stack's key, adapter address and credential.
func (s *Stack) applyCatalog(ctx context.Context) error {
	raw, err := os.ReadFile(filepath.Join(s.cfg.Root, "deploy", "catalog", "dev.yaml"))
	if err != nil {
		return err
	}
	c, err := catalog.Parse(raw, func(name string) (string, bool) {
		v, ok := map[string]string{
			"INTEGRATIONS_DEV_API_KEY":              s.APIKey,
			"INTEGRATIONS_DUMMY_ADAPTER_ADDR":       s.Addrs["dummy-adapter"],
			"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL": s.AdapterCredential,
		}[name]
		return v, ok
	})
	if err != nil {
		return fmt.Errorf("dev catalog: %w", err)
	}
	if err := catalog.Apply(ctx, s.DB, c); err != nil {
		return fmt.Errorf("apply dev catalog: %w", err)
	}
	return nil
}

// Start prepares a stack (New), starts every program but Config.Without and waits until each is
// SERVING, then registers a webhook receiver as the dev application's consumer. On error
// everything is stopped and removed again; the error carries the log tails of the programs.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	s, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	started := time.Now()
	var names []string
	for _, p := range Programs {
		if !slices.Contains(cfg.Without, p.Name) {
			names = append(names, s.instances[p.Name]...)
		}
	}
	if err = s.Launch(ctx, names...); err == nil {
		s.logf("%d instances serving after %s (gateway gRPC %s, REST %s)", len(names),
			time.Since(started).Round(time.Millisecond), s.Addrs["gateway"], s.RESTURL)
		err = s.registerReceiver(ctx)
	}
	if err != nil {
		tails := s.LogTails()
		return nil, fmt.Errorf("%w\n%s", errors.Join(err, s.Close()), tails)
	}
	return s, nil
}

// Launch starts the named instances (a program's name is its one instance unless Replicas) and
// waits until each reports SERVING; an instance Kill or Terminate ended starts again.
func (s *Stack) Launch(ctx context.Context, names ...string) error {
	procs := make([]*process, len(names))
	for i, name := range names {
		var err error
		if procs[i], err = s.launch(name); err != nil {
			return err
		}
	}
	for i, name := range names {
		if err := s.awaitServing(ctx, name, procs[i]); err != nil {
			return err
		}
	}
	return nil
}

// Command is the command that runs an instance, with its environment, not started: what Launch
// starts, for a caller that runs a program by hand (one whose start-up must fail).
func (s *Stack) Command(name string) (*exec.Cmd, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	program, ok := s.programOf[name]
	if !ok || s.procs[name] != nil {
		return nil, fmt.Errorf("%s: no such instance, or running already", name)
	}
	env := slices.Concat(s.env, s.Env, []string{"INTEGRATIONS_GRPC_ADDR=" + s.Addrs[name]})
	if slices.Contains(devca.Services, program) {
		env = append(env, "INTEGRATIONS_TLS_CERT_FILE="+devca.CertFile(s.tlsDir, program),
			"INTEGRATIONS_TLS_KEY_FILE="+devca.KeyFile(s.tlsDir, program))
	}
	if addr, ok := s.Addrs[name+"-http"]; ok {
		env = append(env, "INTEGRATIONS_HTTP_ADDR="+addr)
	}
	if addr, ok := s.Addrs[name+"-metrics"]; ok {
		env = append(env, "INTEGRATIONS_METRICS_ADDR="+addr)
		if s.cfg.Pprof || (program == "gateway" && s.cfg.GatewayPprof) {
			env = append(env, "INTEGRATIONS_PPROF=true")
		}
	}
	if s.cfg.PublicTLS && clientFacing[program] {
		env = append(env, "INTEGRATIONS_PUBLIC_TLS_CERT_FILE="+devca.CertFile(s.tlsDir, devca.Public),
			"INTEGRATIONS_PUBLIC_TLS_KEY_FILE="+devca.KeyFile(s.tlsDir, devca.Public))
	}
	cmd := exec.Command(filepath.Join(s.cfg.BinDir, program))
	cmd.Env = append(env, s.ProgramEnv[name]...)
	cmd.SysProcAttr = sysProcAttr()
	return cmd, nil
}

func (s *Stack) launch(name string) (*process, error) {
	cmd, err := s.Command(name)
	if err != nil {
		return nil, err
	}
	// Appended to: a restarted instance keeps the log of its earlier lives.
	logFile, err := os.OpenFile(s.logFile(name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		s.mu.Lock()
		if !s.stopping && !p.expected.Load() {
			s.unexpected = append(s.unexpected, fmt.Sprintf("%s exited: %v", name, err))
		}
		s.mu.Unlock()
		close(p.done)
	}()
	s.mu.Lock()
	s.procs[name], s.lastLaunch = p, time.Now()
	s.mu.Unlock()
	return p, nil
}

func (s *Stack) awaitServing(ctx context.Context, name string, p *process) error {
	conn, err := s.Dial(name, "")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	client := grpc_health_v1.NewHealthClient(conn)
	deadline := time.Now().Add(s.cfg.StartTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := client.Check(cctx, &grpc_health_v1.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not serving after %s (last error %v)", name, s.cfg.StartTimeout, err)
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up", name)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling a health endpoint: there is no event to await
		}
	}
}

// Dial connects to an instance as its clients do: a client-facing port plainly or with TLS
// (Config.PublicTLS), an internal one with mTLS presenting the certificate of the service as (""
// for none, as a health probe), the dummy adapter plainly.
func (s *Stack) Dial(name, as string) (*grpc.ClientConn, error) {
	s.mu.Lock()
	program := cmp.Or(s.programOf[name], name) // a replicated program's name is its proxy's
	addr := s.Addrs[name]
	s.mu.Unlock()
	var opts []grpc.DialOption
	switch {
	case clientFacing[program]:
		if s.cfg.PublicTLS {
			opt, err := grpcx.PublicDialOption(devca.CAFile(s.tlsDir))
			if err != nil {
				return nil, err
			}
			opts = append(opts, opt)
		}
	case slices.Contains(devca.Services, program):
		files := tlsx.Files{CAFile: devca.CAFile(s.tlsDir)}
		if as != "" {
			files.CertFile, files.KeyFile = devca.CertFile(s.tlsDir, as), devca.KeyFile(s.tlsDir, as)
		}
		in, err := grpcx.NewInternal(files)
		if err != nil {
			return nil, err
		}
		opts = append(opts, in.DialOption(program))
	}
	return grpcx.Dial(addr, opts...)
}

// Scheme is the REST listeners' URL scheme with "://".
func (s *Stack) Scheme() string {
	if s.cfg.PublicTLS {
		return "https://"
	}
	return "http://"
}

// PublicTLS says whether the client-facing listeners serve TLS (Config.PublicTLS).
func (s *Stack) PublicTLS() bool { return s.cfg.PublicTLS }

// BrokerConfig is the message port's configuration to reach the stack's queues as its services do.
func (s *Stack) BrokerConfig() mq.Config {
	return mq.Config{Provider: s.cfg.Broker.Provider, URL: s.cfg.Broker.URL, Scope: s.Scope, TimeScale: s.cfg.TimeScale}
}

// Instances returns the instance names of a program (one, the program's own name, unless
// Replicas or AddInstance).
func (s *Stack) Instances(program string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.instances[program])
}

// Kill ends an instance with SIGKILL — no shutdown at all, as in a crash — and waits for it to
// be gone.
func (s *Stack) Kill(name string) error {
	_, err := s.end(name, syscall.SIGKILL, 0)
	return err
}

// Exit is how an instance ended on SIGTERM: Took from the signal to the exit, InTime false when
// it was killed after the timeout instead.
type Exit struct {
	Took   time.Duration
	InTime bool
	State  *os.ProcessState
}

// Terminate sends an instance SIGTERM, as a deploy does, and waits up to timeout for it to exit
// (then kills it).
func (s *Stack) Terminate(name string, timeout time.Duration) (Exit, error) {
	return s.end(name, syscall.SIGTERM, timeout)
}

// end sends a running instance sig and waits for its exit, up to timeout (0: however long) before
// a SIGKILL.
func (s *Stack) end(name string, sig syscall.Signal, timeout time.Duration) (Exit, error) {
	s.mu.Lock()
	p := s.procs[name]
	delete(s.procs, name)
	s.mu.Unlock()
	if p == nil {
		return Exit{}, fmt.Errorf("%s is not running", name)
	}
	p.expected.Store(true)
	start, exit := time.Now(), Exit{InTime: true}
	_ = p.cmd.Process.Signal(sig) // fails only if it has exited already
	if timeout > 0 {
		select {
		case <-p.done:
		case <-time.After(timeout):
			_ = p.cmd.Process.Kill()
			exit.InTime = false
		}
	}
	<-p.done
	exit.Took, exit.State = time.Since(start), p.cmd.ProcessState
	return exit, nil
}

// StopAll terminates every running instance at once (SIGTERM, SIGKILL after 20 s).
func (s *Stack) StopAll() {
	var wg sync.WaitGroup
	for name := range s.PIDs() {
		wg.Go(func() { _, _ = s.Terminate(name, 20*time.Second) })
	}
	wg.Wait()
}

func (s *Stack) logFile(name string) string { return filepath.Join(s.LogDir, name+".log") }

// Log returns an instance's whole log so far.
func (s *Stack) Log(name string) string {
	b, _ := os.ReadFile(s.logFile(name))
	return string(b)
}

// LogTail returns the last lines of an instance's log.
func (s *Stack) LogTail(name string) string {
	lines := strings.Split(strings.TrimSpace(s.Log(name)), "\n")
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

// LogTails returns the last lines of every instance's log, for a failure report.
func (s *Stack) LogTails() string {
	var b strings.Builder
	for _, p := range Programs {
		for _, name := range s.Instances(p.Name) {
			if _, err := os.Stat(s.logFile(name)); err == nil {
				fmt.Fprintf(&b, "--- %s (%s) ---\n%s\n", name, s.logFile(name), s.LogTail(name))
			}
		}
	}
	return b.String()
}

// Close stops every program (SIGTERM, SIGKILL after 20 s), drops a schema the stack created,
// deletes the scope's queues and removes the log directory. Safe to call more than once.
func (s *Stack) Close() error { return s.close(false) }

// CloseKeepLogs is Close, leaving the log directory in place.
func (s *Stack) CloseKeepLogs() error { return s.close(true) }

func (s *Stack) close(keepLogs bool) error {
	s.closeOnce.Do(func() {
		var errs []error
		s.mu.Lock()
		s.stopping = true
		s.mu.Unlock()
		s.StopAll()
		for _, p := range s.proxies {
			p.Close()
		}
		if s.Receiver != nil {
			s.Receiver.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if s.DB != nil {
			s.DB.Close()
		}
		if s.admin != nil {
			if s.Schema != "" {
				if _, err := s.admin.Exec(ctx, "DROP SCHEMA "+s.Schema+" CASCADE"); err != nil {
					errs = append(errs, fmt.Errorf("drop schema %s: %w", s.Schema, err))
				}
			}
			s.admin.Close()
		}
		if s.Scope != "" {
			errs = append(errs, s.deleteQueues(ctx))
		}
		if !keepLogs && s.LogDir != "" {
			_ = os.RemoveAll(s.LogDir)
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// deleteQueues deletes the scope's queues, once RabbitMQ may (declareGrace).
func (s *Stack) deleteQueues(ctx context.Context) error {
	s.mu.Lock()
	last := s.lastLaunch
	s.mu.Unlock()
	if wait := time.Until(last.Add(declareGrace)); wait > 0 && s.cfg.Broker.Provider == mq.ProviderRabbitMQ {
		time.Sleep(wait)
	}
	port, err := mq.Dial(ctx, s.BrokerConfig())
	if err == nil {
		err = port.DeleteRoutes(ctx, routes.Executions, routes.Events)
		_ = port.Close()
	}
	if err != nil {
		return fmt.Errorf("delete queues of %s: %w", s.Scope, err)
	}
	return nil
}

func (s *Stack) logf(format string, args ...any) {
	if s.cfg.Log != nil {
		fmt.Fprintf(s.cfg.Log, "stack: "+format+"\n", args...)
	}
}

// withParams returns raw with params set in its query.
func withParams(raw string, params url.Values) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("database url: %w", err)
	}
	q := u.Query()
	for k, vs := range params {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
