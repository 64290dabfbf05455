// Package stack runs the whole platform for a benchmark as a user would: the six services and the
// dummy adapter as separate processes built from this workspace, on free ports, with a Postgres
// schema and a RabbitMQ queue scope of their own, the dev catalog applied and a webhook receiver
// registered as the dev application's consumer. Close stops every process (SIGTERM), drops the
// schema and deletes the scope's queues.
//
// It follows e2e/stack_test.go, which cannot be imported (a _test file), without the testing.T.
package stack

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/integrations-platform/integrations/pkg/freeport"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db"
	gatewayv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/gateway/v1"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

const modulePrefix = "github.com/integrations-platform/integrations/"

// Programs are the processes of a stack, by name → package, in start order.
var Programs = []struct{ Name, Package string }{
	{"settlement", modulePrefix + "services/settlement"},
	{"dispatcher", modulePrefix + "services/dispatcher"},
	{"adapter-callback", modulePrefix + "services/adapter-callback"},
	{"execution-consumer", modulePrefix + "services/execution-consumer"},
	{"event-router", modulePrefix + "services/event-router"},
	{"gateway", modulePrefix + "services/gateway"},
	{"dummy-adapter", modulePrefix + "cmd/dummy-adapter"},
}

// AppID is the dev catalog's application, which the stack's API key belongs to.
const AppID = "dev-app"

// Capability is the dev catalog's capability served by the dummy adapter.
const Capability = "dummy.echo"

// declareGrace is how long after the last service started (and declared its queues) the queues
// may be deleted: RabbitMQ 3.10's at-least-once dead-letter worker crashes when its queue is
// deleted while it starts (see the hazard note in pkg/mq/names.go).
const declareGrace = 2 * time.Second

// Build compiles every program into a new temporary directory and returns it; the caller removes
// it. root is the workspace root (the directory of go.work).
func Build(ctx context.Context, root string, out io.Writer) (string, error) {
	dir, err := os.MkdirTemp("", "integrations-bench-bin-")
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
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work at or above the working directory: run from the repository (or pass -root)")
		}
		dir = parent
	}
}

// Config says how to run a stack.
type Config struct {
	// Root is the workspace root (for deploy/catalog/dev.yaml).
	Root string
	// BinDir holds the programs (Build).
	BinDir string
	// DatabaseURL is the database the stack's schema is created in (no search_path).
	DatabaseURL string
	// AMQPURL is the broker.
	AMQPURL string
	// Name prefixes the schema and the queue scope ("bench" when empty).
	Name string
	// LogLevel of the services ("info" when empty).
	LogLevel string
	// TimeScale of the services' delays (1 when zero).
	TimeScale float64
	// DatabaseParams are added to the services' database URL (e.g. pool_max_conns=16).
	DatabaseParams url.Values
	// Env is added to every program's environment; ProgramEnv to one program's.
	Env        []string
	ProgramEnv map[string][]string
	// GatewayPprof serves net/http/pprof on the gateway's metrics address (INTEGRATIONS_PPROF).
	GatewayPprof bool
	// Pprof serves net/http/pprof on every service's metrics address ("<name>-metrics" in Addrs).
	Pprof bool
	// Without names programs not to start — for diagnosis only (e.g. the gateway without the
	// dispatcher, to see what the background work costs the accept path); a benchmark runs all.
	Without []string
	// Replicas is the number of instances of each of the six services (1 when zero; the dummy
	// adapter always runs once). With more than one, instance i of program p is named "p#i"
	// (Addrs, log files, Kill, Restart), and Addrs[p] is a TCP proxy that spreads connections
	// over the instances, as a load balancer would.
	Replicas int
	// StartTimeout bounds the wait for each program to report SERVING (20 s when zero).
	StartTimeout time.Duration
	// Log receives progress lines (nothing when nil).
	Log io.Writer
}

// Stack is a running platform.
type Stack struct {
	cfg Config
	// Schema is the stack's Postgres schema; SchemaURL connects with search_path set to it.
	Schema    string
	SchemaURL string
	// DB is a small pool on the schema for the harness's own queries.
	DB *pgxpool.Pool
	// Scope is the stack's RabbitMQ queue scope.
	Scope string
	// APIKey is the dev application's API key.
	APIKey string
	// Addrs are the programs' gRPC addresses by name, and "gateway-http", "gateway-metrics".
	Addrs map[string]string
	// RESTURL is the gateway's REST base URL ("http://host:port").
	RESTURL string
	// Receiver is the dev application's webhook consumer; SigningSecret signs its deliveries.
	Receiver      *Receiver
	SigningSecret string
	// PlatformKey is the platform's token signing key (the dummy adapter verifies its tokens): the
	// same-work River peer signs its adapter calls with it, as the platform does.
	PlatformKey ed25519.PrivateKey
	// LogDir holds one log file per program.
	LogDir string

	admin      *pgxpool.Pool
	env        []string
	procs      map[string]*process
	instances  map[string][]string // program → its instance names
	proxies    []*proxy
	started    time.Time
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
	// expected is set before the harness ends the process on purpose (Kill, Terminate).
	expected atomic.Bool
}

// Start creates the schema, applies the migrations and the catalog, starts every program and
// waits until each is SERVING, then registers the webhook receiver. On error everything started
// is stopped and removed again; the error carries the log tails of the programs.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Name == "" {
		cfg.Name = "bench"
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "info"
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 20 * time.Second
	}
	if cfg.Replicas < 1 {
		cfg.Replicas = 1
	}
	s := &Stack{cfg: cfg, Addrs: map[string]string{}, procs: map[string]*process{}, instances: map[string][]string{}}
	if err := s.start(ctx); err != nil {
		tails := s.LogTails()
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("%w\n%s", err, tails)
	}
	return s, nil
}

func (s *Stack) logf(format string, args ...any) {
	if s.cfg.Log != nil {
		fmt.Fprintf(s.cfg.Log, "stack: "+format+"\n", args...)
	}
}

func (s *Stack) start(ctx context.Context) error {
	var err error
	if s.LogDir, err = os.MkdirTemp("", "integrations-bench-logs-"); err != nil {
		return err
	}
	// A throwaway CA: the services run mTLS on every internal hop, as in production.
	if _, err := devca.Ensure(s.tlsDir()); err != nil {
		return err
	}
	// The schema.
	if s.admin, err = db.Open(ctx, s.cfg.DatabaseURL); err != nil {
		return fmt.Errorf("benchmark database: %w", err)
	}
	s.Schema = s.cfg.Name + "_" + time.Now().UTC().Format("20060102t150405") + "_" + randomHex(3)
	s.Scope = s.cfg.Name + "." + s.Schema
	if _, err := s.admin.Exec(ctx, "CREATE SCHEMA "+s.Schema); err != nil {
		s.Schema = "" // nothing to drop
		return fmt.Errorf("create schema: %w", err)
	}
	if s.SchemaURL, err = WithSearchPath(s.cfg.DatabaseURL, s.Schema); err != nil {
		return err
	}
	if _, err := db.Migrate(ctx, s.SchemaURL); err != nil {
		return err
	}
	if s.DB, err = openPool(ctx, s.SchemaURL, 2); err != nil {
		return err
	}
	s.logf("schema %s migrated, queue scope %s, logs in %s", s.Schema, s.Scope, s.LogDir)

	// Addresses, secrets, environment.
	for _, p := range Programs {
		if s.Addrs[p.Name], err = freeAddr(); err != nil {
			return err
		}
		s.instances[p.Name] = []string{p.Name}
		if s.cfg.Replicas > 1 && p.Name != "dummy-adapter" {
			s.instances[p.Name] = nil
			for i := 1; i <= s.cfg.Replicas; i++ {
				inst := fmt.Sprintf("%s#%d", p.Name, i)
				s.instances[p.Name] = append(s.instances[p.Name], inst)
				if s.Addrs[inst], err = freeAddr(); err != nil {
					return err
				}
			}
		}
	}
	if s.cfg.Replicas > 1 {
		for _, inst := range s.instances["gateway"] {
			for _, suffix := range []string{"-http", "-metrics"} {
				if s.Addrs[inst+suffix], err = freeAddr(); err != nil {
					return err
				}
			}
		}
	}
	// Every service has a metrics address: the bench reads this stack's own message-port
	// counters there (PortCounters), apart from whatever else the broker carries.
	extra := []string{"gateway-http", "gateway-metrics"}
	for _, p := range Programs {
		if p.Name != "gateway" && strings.HasPrefix(p.Package, modulePrefix+"services/") {
			extra = append(extra, p.Name+"-metrics")
		}
	}
	for _, n := range extra {
		if s.Addrs[n], err = freeAddr(); err != nil {
			return err
		}
	}
	s.RESTURL = "http://" + s.Addrs["gateway-http"]
	s.APIKey = "dev_" + randomHex(16)
	credential := "adc_" + randomHex(16)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	platformPub, platformKey, err := platformtoken.Generate()
	if err != nil {
		return err
	}
	s.PlatformKey = platformKey
	serviceURL := s.SchemaURL
	if len(s.cfg.DatabaseParams) > 0 {
		u, err := url.Parse(serviceURL)
		if err != nil {
			return err
		}
		q := u.Query()
		for k, vs := range s.cfg.DatabaseParams {
			q[k] = vs
		}
		u.RawQuery = q.Encode()
		serviceURL = u.String()
	}
	s.env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"INTEGRATIONS_DATABASE_URL=" + serviceURL,
		"INTEGRATIONS_AMQP_URL=" + s.cfg.AMQPURL,
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
		"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL=" + credential,
		"INTEGRATIONS_PLATFORM_SIGNING_KEY=" + platformtoken.EncodePrivateKey(platformKey),
		"INTEGRATIONS_PLATFORM_PUBLIC_KEYS=" + platformtoken.EncodePublicKey(platformPub),
		"INTEGRATIONS_TLS_CA_FILE=" + devca.CAFile(s.tlsDir()),
	}, s.cfg.Env...)

	// The dev catalog, with this stack's key, adapter address and credential.
	raw, err := os.ReadFile(filepath.Join(s.cfg.Root, "deploy", "catalog", "dev.yaml"))
	if err != nil {
		return err
	}
	c, err := catalog.Parse(raw, func(name string) (string, bool) {
		switch name {
		case "INTEGRATIONS_DEV_API_KEY":
			return s.APIKey, true
		case "INTEGRATIONS_DUMMY_ADAPTER_ADDR":
			return s.Addrs["dummy-adapter"], true
		case "INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL":
			return credential, true
		}
		return "", false
	})
	if err != nil {
		return fmt.Errorf("dev catalog: %w", err)
	}
	if err := catalog.Apply(ctx, s.DB, c); err != nil {
		return fmt.Errorf("apply dev catalog: %w", err)
	}

	// The programs.
	s.started = time.Now()
	var names []string
	for _, p := range Programs {
		if !slices.Contains(s.cfg.Without, p.Name) {
			names = append(names, p.Name)
		}
	}
	if s.cfg.Replicas > 1 {
		if err := s.startProxies(); err != nil {
			return err
		}
	}
	var insts []string
	for _, name := range names {
		insts = append(insts, s.instances[name]...)
	}
	for _, inst := range insts {
		if err := s.launch(inst); err != nil {
			return err
		}
	}
	for _, inst := range insts {
		if err := s.awaitServing(ctx, inst); err != nil {
			return err
		}
	}
	s.logf("%d programs serving after %s (gateway gRPC %s, REST %s)", len(names),
		time.Since(s.started).Round(time.Millisecond), s.Addrs["gateway"], s.RESTURL)

	// The webhook receiver, registered as the application's consumer through the API.
	if s.Receiver, err = NewReceiver(); err != nil {
		return err
	}
	conn, err := s.DialGateway()
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := gatewayv1.NewGatewayServiceClient(conn).SetConsumer(grpcx.WithBearer(cctx, s.APIKey),
		&gatewayv1.SetConsumerRequest{Consumer: &gatewayv1.SetConsumerRequest_Webhook{
			Webhook: &gatewayv1.WebhookConsumer{Url: s.Receiver.URL},
		}})
	if err != nil {
		return fmt.Errorf("register the webhook receiver: %w", err)
	}
	s.SigningSecret = resp.GetSigningSecret()
	s.Receiver.SetSecret(s.SigningSecret)
	return nil
}

// startProxies puts a proxy on each program's address in front of its instances.
func (s *Stack) startProxies() error {
	front := func(addr string, insts []string, suffix string) error {
		var backends []string
		for _, inst := range insts {
			backends = append(backends, s.Addrs[inst+suffix])
		}
		p, err := newProxy(addr, backends)
		if err != nil {
			return fmt.Errorf("proxy on %s: %w", addr, err)
		}
		s.proxies = append(s.proxies, p)
		return nil
	}
	for _, p := range Programs {
		if insts := s.instances[p.Name]; len(insts) > 1 {
			if err := front(s.Addrs[p.Name], insts, ""); err != nil {
				return err
			}
		}
	}
	// The REST API too; a metrics address belongs to one instance, so gateway-metrics is the first's.
	s.Addrs["gateway-metrics"] = s.Addrs[s.instances["gateway"][0]+"-metrics"]
	return front(s.Addrs["gateway-http"], s.instances["gateway"], "-http")
}

// ProgramOf is the program an instance name belongs to ("settlement#2" → "settlement").
func ProgramOf(instance string) string {
	p, _, _ := strings.Cut(instance, "#")
	return p
}

// Instances returns the instance names of a program (one, the program's own name, unless
// Config.Replicas > 1).
func (s *Stack) Instances(program string) []string {
	return slices.Clone(s.instances[program])
}

func (s *Stack) launch(name string) error {
	program := ProgramOf(name)
	env := append(slices.Clone(s.env), "INTEGRATIONS_GRPC_ADDR="+s.Addrs[name])
	if slices.Contains(devca.Services, program) {
		env = append(env, "INTEGRATIONS_TLS_CERT_FILE="+devca.CertFile(s.tlsDir(), program),
			"INTEGRATIONS_TLS_KEY_FILE="+devca.KeyFile(s.tlsDir(), program))
	}
	if program == "gateway" {
		http := s.Addrs["gateway-http"]
		if a, ok := s.Addrs[name+"-http"]; ok {
			http = a
		}
		env = append(env, "INTEGRATIONS_HTTP_ADDR="+http)
	}
	if addr, ok := s.Addrs[name+"-metrics"]; ok {
		env = append(env, "INTEGRATIONS_METRICS_ADDR="+addr)
		if s.cfg.Pprof || (program == "gateway" && s.cfg.GatewayPprof) {
			env = append(env, "INTEGRATIONS_PPROF=true")
		}
	}
	env = append(env, s.cfg.ProgramEnv[program]...)
	// Appended to: a restarted instance keeps the log of its earlier lives.
	logFile, err := os.OpenFile(filepath.Join(s.LogDir, name+".log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.cfg.BinDir, program))
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start %s: %w", name, err)
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
	s.procs[name] = p
	s.lastLaunch = time.Now()
	s.mu.Unlock()
	return nil
}

func (s *Stack) take(instance string) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[instance]
	if p == nil {
		return nil, fmt.Errorf("%s is not running", instance)
	}
	delete(s.procs, instance)
	p.expected.Store(true)
	return p, nil
}

// Kill ends an instance with SIGKILL — no shutdown at all, as in a crash — and waits for it to
// be gone.
func (s *Stack) Kill(instance string) error {
	p, err := s.take(instance)
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", instance, err)
	}
	<-p.done
	return nil
}

// Terminate sends an instance SIGTERM, as a deploy does, and waits up to timeout for it to exit
// (then kills it); it returns how long the exit took and whether it was in time.
func (s *Stack) Terminate(instance string, timeout time.Duration) (time.Duration, bool, error) {
	p, err := s.take(instance)
	if err != nil {
		return 0, false, err
	}
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, false, fmt.Errorf("terminate %s: %w", instance, err)
	}
	select {
	case <-p.done:
		return time.Since(start), true, nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return time.Since(start), false, nil
	}
}

// Restart starts an instance that Kill or Terminate ended and waits until it is SERVING.
func (s *Stack) Restart(ctx context.Context, instance string) error {
	if err := s.launch(instance); err != nil {
		return err
	}
	return s.awaitServing(ctx, instance)
}

// tlsDir holds the stack's CA and the services' certificates (devca).
func (s *Stack) tlsDir() string { return filepath.Join(s.LogDir, "tls") }

func (s *Stack) awaitServing(ctx context.Context, name string) error {
	var opts []grpc.DialOption
	if program := ProgramOf(name); slices.Contains(devca.Services, program) && !clientFacing[program] {
		// mTLS port: verified against the stack's CA, no client certificate (health is open).
		in, err := grpcx.NewInternal(tlsx.Files{CAFile: devca.CAFile(s.tlsDir())})
		if err != nil {
			return err
		}
		opts = append(opts, in.DialOption(program))
	}
	conn, err := grpcx.Dial(s.Addrs[name], opts...)
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
		select {
		case <-s.procDone(name):
			return fmt.Errorf("%s exited during start-up", name)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not serving after %s (last error %v)", name, s.cfg.StartTimeout, err)
		}
		time.Sleep(50 * time.Millisecond) // polling a health endpoint: there is no event to await
	}
}

func (s *Stack) procDone(name string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.procs[name]; p != nil {
		return p.done
	}
	closed := make(chan struct{})
	close(closed)
	return closed
}

// clientFacing are the programs whose port is the clients', plain on the stack's loopback
// addresses; the other services' ports are mTLS.
var clientFacing = map[string]bool{"gateway": true, "adapter-callback": true}

// DialGateway returns a gRPC client connection to the gateway.
func (s *Stack) DialGateway(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpcx.Dial(s.Addrs["gateway"], opts...)
}

// PprofURL is the gateway's net/http/pprof base ("" unless Config.GatewayPprof).
func (s *Stack) PprofURL() string {
	if !s.cfg.GatewayPprof && !s.cfg.Pprof {
		return ""
	}
	return s.PprofURLOf("gateway")
}

// PprofURLOf is a service's net/http/pprof base URL ("" if it has no metrics address of its own).
func (s *Stack) PprofURLOf(name string) string {
	addr, ok := s.Addrs[name+"-metrics"]
	if !ok {
		return ""
	}
	return "http://" + addr + "/debug/pprof"
}

// Check reports a program that exited while it should be running.
func (s *Stack) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unexpected) > 0 {
		return errors.New(strings.Join(s.unexpected, "; "))
	}
	return nil
}

// PIDs returns the process ids of the running programs by name.
func (s *Stack) PIDs() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for n, p := range s.procs {
		out[n] = p.cmd.Process.Pid
	}
	return out
}

// Backlog counts what the stack has still to do: executions not settled and events not yet
// delivered (or dead).
func (s *Stack) Backlog(ctx context.Context) (executions, events int64, err error) {
	err = s.DB.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM executions WHERE settled_at IS NULL),
		(SELECT count(*) FROM integration_events WHERE delivery_status = 'pending')`).Scan(&executions, &events)
	return executions, events, err
}

// Drain waits until the stack has settled every execution and delivered every event, polling,
// for at most timeout, and returns how long it took.
func (s *Stack) Drain(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		ex, ev, err := s.Backlog(ctx)
		if err != nil {
			return time.Since(start), err
		}
		if ex == 0 && ev == 0 {
			return time.Since(start), nil
		}
		if err := s.Check(); err != nil {
			return time.Since(start), err
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("backlog not drained after %s: %d executions unsettled, %d events undelivered", timeout, ex, ev)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// LogTails returns the last lines of every program's log, for a failure report.
func (s *Stack) LogTails() string {
	if s.LogDir == "" {
		return ""
	}
	var b strings.Builder
	var insts []string
	for _, p := range Programs {
		insts = append(insts, s.instances[p.Name]...)
	}
	for _, inst := range insts {
		p := struct{ Name string }{inst}
		raw, err := os.ReadFile(filepath.Join(s.LogDir, p.Name+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		fmt.Fprintf(&b, "--- %s (%s) ---\n%s\n", p.Name, filepath.Join(s.LogDir, p.Name+".log"), strings.Join(lines, "\n"))
	}
	return b.String()
}

// Close stops every program with SIGTERM (SIGKILL after 20 s), drops the schema, deletes the
// scope's queues and removes the log directory. Safe to call more than once.
func (s *Stack) Close() error { return s.close(false) }

// CloseKeepLogs is Close, leaving the log directory in place.
func (s *Stack) CloseKeepLogs() error { return s.close(true) }

func (s *Stack) close(keepLogs bool) error {
	s.closeOnce.Do(func() {
		var errs []error
		s.mu.Lock()
		s.stopping = true
		procs := s.procs
		s.procs = map[string]*process{}
		s.mu.Unlock()
		var wg sync.WaitGroup
		for _, p := range procs {
			wg.Add(1)
			go func() { defer wg.Done(); stop(p) }()
		}
		wg.Wait()
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
				} else {
					s.logf("dropped schema %s", s.Schema)
				}
			}
			s.admin.Close()
		}
		if !s.started.IsZero() {
			s.mu.Lock()
			last := s.lastLaunch
			s.mu.Unlock()
			if wait := time.Until(last.Add(declareGrace)); wait > 0 {
				time.Sleep(wait)
			}
			if err := deleteQueues(ctx, s.cfg.AMQPURL, s.Scope, s.cfg.TimeScale); err != nil {
				errs = append(errs, err)
			} else {
				s.logf("deleted the queues of scope %s", s.Scope)
			}
		}
		if !keepLogs && s.LogDir != "" {
			_ = os.RemoveAll(s.LogDir)
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

func stop(p *process) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func deleteQueues(ctx context.Context, amqpURL, scope string, scale float64) error {
	b, err := mq.Dial(ctx, mq.Config{URL: amqpURL, Scope: scope, TimeScale: scale})
	if err != nil {
		return fmt.Errorf("delete queues of %s: %w", scope, err)
	}
	defer b.Close() //nolint:errcheck // at exit
	if err := b.DeleteRoutes(ctx, routes.Executions, routes.Events); err != nil {
		return fmt.Errorf("delete queues of %s: %w", scope, err)
	}
	return nil
}

// WithSearchPath returns url with search_path set to schema.
func WithSearchPath(raw, schema string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("database url: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func openPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(ctx, cfg)
}

// freeAddr returns a loopback address for a program the stack starts (see pkg/freeport).
func freeAddr() (string, error) { return freeport.Addr() }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// httpServe serves h on a free loopback port and returns the server and its base URL.
func httpServe(h http.Handler) (*http.Server, string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return srv, "http://" + l.Addr().String(), nil
}

// Env returns the environment every program of the stack gets (before its own additions).
func (s *Stack) Env() []string { return slices.Clone(s.env) }

// PortCounters sums the message port's counters (integrations_mq_messages_total) of this stack's
// services by route and event ("executions/published"…): what this stack's own processes sent
// and settled, which the broker's global counters (cost.ReadMQ) cannot tell apart from other
// users of the same broker. A service restarted since starts again from zero.
func (s *Stack) PortCounters(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	for name, addr := range s.Addrs {
		if !strings.HasSuffix(name, "-metrics") {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %w", name, err)
		}
		raw, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %w", name, err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			rest, ok := strings.CutPrefix(line, "integrations_mq_messages_total{")
			if !ok {
				continue
			}
			labels, value, ok := strings.Cut(rest, "} ")
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				continue
			}
			var route, event string
			for _, kv := range strings.Split(labels, ",") {
				k, val, _ := strings.Cut(kv, "=")
				val = strings.Trim(val, `"`)
				switch k {
				case "route":
					route = val
				case "event":
					event = val
				}
			}
			out[route+"/"+event] += v
		}
	}
	return out, nil
}
