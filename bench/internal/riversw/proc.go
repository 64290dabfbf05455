package riversw

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/integrations-platform/integrations/bench/internal/flow"
	"github.com/integrations-platform/integrations/bench/internal/load"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// The child process's environment (secrets travel here, never on its command line).
const (
	envDB          = "RIVERSW_DATABASE_URL"
	envSchema      = "RIVERSW_SCHEMA"
	envAdapterID   = "RIVERSW_ADAPTER_ID"
	envAdapterAddr = "RIVERSW_ADAPTER_ADDR"
	envKey         = "RIVERSW_PLATFORM_SIGNING_KEY"
	envReceiver    = "RIVERSW_RECEIVER_URL"
	envSecret      = "RIVERSW_SIGNING_SECRET"
	envCapability  = "RIVERSW_CAPABILITY"
	envGOMAXPROCS  = "GOMAXPROCS"
)

// listeningPrefix starts the line the child writes on its stdout once it serves.
const listeningPrefix = "riversw listening "

// Serve is the child process's main (`bench riversw-serve`): it reads its Config from the
// environment, starts the peer, announces its address on stdout and runs until SIGTERM/SIGINT.
func Serve() error {
	key, err := platformtoken.ParsePrivateKey(os.Getenv(envKey))
	if err != nil {
		return fmt.Errorf("%s: %w", envKey, err)
	}
	c := Config{
		DatabaseURL: os.Getenv(envDB), Schema: os.Getenv(envSchema), Listen: "127.0.0.1:0",
		AdapterID: os.Getenv(envAdapterID), AdapterAddr: os.Getenv(envAdapterAddr), PlatformKey: key,
		ReceiverURL: os.Getenv(envReceiver), SigningSecret: os.Getenv(envSecret), Capability: os.Getenv(envCapability),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	s, err := Start(ctx, c)
	if err != nil {
		return err
	}
	fmt.Println(listeningPrefix + s.Addr)
	<-ctx.Done()
	return s.Close(context.Background())
}

// Process is the peer running as a child process.
type Process struct {
	URL  string // base URL of its HTTP handler
	cmd  *exec.Cmd
	done chan error
}

// PID is the child's process id (its CPU is measured by it).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Launch starts exe riversw-serve with c and waits until it serves.
func Launch(ctx context.Context, exe string, c Config, gomaxprocs int, stderr io.Writer) (*Process, error) {
	cmd := exec.Command(exe, "riversw-serve")
	cmd.Env = append(os.Environ(),
		envDB+"="+c.DatabaseURL, envSchema+"="+c.Schema, envAdapterID+"="+c.AdapterID, envAdapterAddr+"="+c.AdapterAddr,
		envKey+"="+platformtoken.EncodePrivateKey(c.PlatformKey), envReceiver+"="+c.ReceiverURL, envSecret+"="+c.SigningSecret,
		envCapability+"="+c.Capability)
	if gomaxprocs > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", envGOMAXPROCS, gomaxprocs))
	}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start riversw-serve: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), listeningPrefix); ok {
				addr <- a
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { p.done <- cmd.Wait() }()
	select {
	case a := <-addr:
		p.URL = "http://" + a
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("riversw-serve exited before serving: %v", err)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-p.done //nolint:errcheck // the exit of the process just killed
		return nil, errors.New("riversw-serve did not serve within 30 s")
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-p.done //nolint:errcheck // the exit of the process just killed
		return nil, ctx.Err()
	}
}

// Close ends the child (SIGTERM, then SIGKILL after 30 s).
func (p *Process) Close() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("riversw-serve did not stop within 30 s: %v", <-p.done)
	}
}

// Submit returns the end-to-end call of the peer: a POST answered when the job is inserted, then
// the wait for its webhook (tracker, on the receiver the peer delivers to).
func Submit(base string, tracker *flow.Tracker, payload map[string]any) (load.Submit, error) {
	body, err := json.Marshal(map[string]any{"payload": payload})
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	url := base + "/executions"
	return func(ctx context.Context, _ int, _ int64) (func() error, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("accept: %w", err)
		}
		var out struct {
			ExecutionID string `json:"execution_id"`
		}
		derr := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&out)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return nil, fmt.Errorf("accept: %s", resp.Status)
		}
		if derr != nil || out.ExecutionID == "" {
			return nil, fmt.Errorf("accept: unreadable answer: %v", derr)
		}
		return func() error { _, err := tracker.Await(ctx, out.ExecutionID); return err }, nil
	}, nil
}
