package chaos

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/integrations-platform/integrations/e2e/stack"
)

// Fault kinds, as counted in the report. A kill names its program: "kill gateway".
const (
	faultCloseBroker = "close broker connections"
	faultKillDB      = "terminate postgres connections"
	faultReceiver500 = "receiver answers 500"
	faultTerm        = "SIGTERM + restart"
)

func killFault(program string) string { return "kill -9 " + program }

// services are the six services, in the order a chaos schedule visits them.
var services = []string{"settlement", "dispatcher", "adapter-callback", "execution-consumer", "event-router", "gateway"}

// chaosSchedule is the chaos mode's round: every service killed once, the adapter twice, and
// the broker's and Postgres' connections cut between them.
func chaosSchedule() []string {
	return []string{
		killFault("settlement"), faultCloseBroker, killFault("dispatcher"), faultKillDB,
		killFault("adapter-callback"), killFault("dummy-adapter"), killFault("execution-consumer"),
		faultCloseBroker, killFault("event-router"), faultKillDB, killFault("gateway"), killFault("dummy-adapter"),
	}
}

// ParseSchedule reads a fault round from short names: a service's name or "adapter" (kill -9
// of it), "broker" (close the run's broker connections), "postgres" (terminate the services'
// backends).
func ParseSchedule(s string) ([]string, error) {
	var out []string
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
		case item == "adapter":
			out = append(out, killFault("dummy-adapter"))
		case item == "broker":
			out = append(out, faultCloseBroker)
		case item == "postgres":
			out = append(out, faultKillDB)
		case slices.Contains(services, item):
			out = append(out, killFault(item))
		default:
			return nil, fmt.Errorf("fault %q: want a service (%s), adapter, broker or postgres", item, strings.Join(services, ", "))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty fault schedule %q", s)
	}
	return out, nil
}

// rabbit runs rabbitmqctl on the broker's node, on this run's vhost only.
type rabbit struct {
	bin, node string
	vhost     string
	user      string
}

func newRabbit(amqpURL, vhost string) (*rabbit, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("amqp url: %w", err)
	}
	r := &rabbit{bin: os.Getenv("INTEGRATIONS_RABBITMQCTL"), node: os.Getenv("INTEGRATIONS_RABBITMQ_NODE"), vhost: vhost, user: u.User.Username()}
	if r.bin == "" {
		r.bin = "rabbitmqctl"
	}
	if r.user == "" {
		r.user = "guest"
	}
	return r, nil
}

func (r *rabbit) ctl(ctx context.Context, args ...string) (string, error) {
	if r.node != "" {
		args = append([]string{"-n", r.node}, args...)
	}
	out, err := exec.CommandContext(ctx, r.bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %w: %.300s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// createVhost makes the run's own vhost, so that every broker fault and check touches only this
// run's connections and queues: other tests share the broker.
func (r *rabbit) createVhost(ctx context.Context) error {
	if _, err := r.ctl(ctx, "add_vhost", r.vhost); err != nil {
		return err
	}
	_, err := r.ctl(ctx, "set_permissions", "-p", r.vhost, r.user, ".*", ".*", ".*")
	return err
}

func (r *rabbit) deleteVhost(ctx context.Context) error {
	_, err := r.ctl(ctx, "delete_vhost", r.vhost)
	return err
}

// closeConnections closes every connection of the run's vhost from the broker's side and
// returns how many: one rabbitmqctl call (each costs ~1 s), filtering by vhost on the node, so
// that no connection of another vhost — other tests share the broker — is touched.
func (r *rabbit) closeConnections(ctx context.Context) (int, error) {
	expr := fmt.Sprintf(`Ps = [proplists:get_value(pid, I) || I <- rabbit_networking:connection_info_all([pid, vhost]), proplists:get_value(vhost, I) =:= <<"%s">>], `+
		`[rabbit_networking:close_connection(P, "chaos: broker connections closed") || P <- Ps], length(Ps).`, r.vhost)
	out, err := r.ctl(ctx, "eval", expr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return 0, fmt.Errorf("rabbitmqctl eval: unexpected answer %.200q", out)
	}
	return n, nil
}

// queue is one queue of the run's vhost.
type queue struct {
	name     string
	messages int
}

func (r *rabbit) queues(ctx context.Context) ([]queue, error) {
	out, err := r.ctl(ctx, "list_queues", "-p", r.vhost, "-q", "--no-table-headers", "name", "messages")
	if err != nil {
		return nil, err
	}
	var qs []queue
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		qs = append(qs, queue{name: f[0], messages: n})
	}
	return qs, nil
}

// faults fires a schedule of faults and counts what fired.
type faults struct {
	st     *stack.Stack
	rabbit *rabbit
	// appName is the services' Postgres application_name: only their backends are terminated.
	appName string
	log     func(format string, args ...any)

	mu    sync.Mutex
	fired map[string]int
	errs  []string
	// kills are when each program was killed (for telling repeats a kill explains).
	kills []kill
	// terms are the rolling restart's SIGTERMs.
	terms []term
	turn  map[string]int // program → next instance to hit
}

type kill struct {
	program string
	at      time.Time
}

type term struct {
	instance string
	took     time.Duration
	inTime   bool
	start    time.Time
}

func (f *faults) count(kind string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.errs = append(f.errs, fmt.Sprintf("%s: %v", kind, err))
		return
	}
	f.fired[kind]++
}

func (f *faults) nextInstance(program string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	insts := f.st.Instances(program)
	i := f.turn[program] % len(insts)
	f.turn[program]++
	return insts[i]
}

// fire runs one fault to its end (a killed program is running again when it returns).
func (f *faults) fire(ctx context.Context, kind string) {
	switch {
	case strings.HasPrefix(kind, "kill -9 "):
		program := strings.TrimPrefix(kind, "kill -9 ")
		inst := f.nextInstance(program)
		f.mu.Lock()
		f.kills = append(f.kills, kill{program: program, at: time.Now()})
		f.mu.Unlock()
		if err := f.st.Kill(inst); err != nil {
			f.count(kind, err)
			return
		}
		// Down for a moment, as a crashed pod is before its restart.
		time.Sleep(200 * time.Millisecond)
		f.count(kind, f.st.Launch(ctx, inst))
		f.log("%s (%s), restarted", kind, inst)
	case kind == faultCloseBroker:
		n, err := f.rabbit.closeConnections(ctx)
		if err == nil && n == 0 {
			err = fmt.Errorf("no connection of vhost %s to close", f.rabbit.vhost)
		}
		f.count(kind, err)
		f.log("%s: %d", kind, n)
	case kind == faultKillDB:
		var n int
		err := f.st.DB.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, f.appName).Scan(&n)
		if err == nil && n == 0 {
			err = fmt.Errorf("no backend named %s to terminate", f.appName)
		}
		f.count(kind, err)
		f.log("%s: %d", kind, n)
	default:
		f.count(kind, fmt.Errorf("unknown fault"))
	}
}

// rolling sends every instance of every service SIGTERM in turn, restarting each before the
// next, as a rolling deploy does.
func (f *faults) rolling(ctx context.Context, timeout time.Duration) {
	for _, program := range services {
		for _, inst := range f.st.Instances(program) {
			if ctx.Err() != nil {
				return
			}
			start := time.Now()
			exit, err := f.st.Terminate(inst, timeout)
			if err == nil {
				err = f.st.Launch(ctx, inst)
			}
			f.count(faultTerm, err)
			f.mu.Lock()
			f.terms = append(f.terms, term{instance: inst, took: exit.Took, inTime: exit.InTime, start: start})
			f.mu.Unlock()
			f.log("SIGTERM %s: exited after %s (in time: %v), restarted", inst, exit.Took.Round(time.Millisecond), exit.InTime)
		}
	}
}

func (f *faults) firedCopy() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.fired)
}

// kinds returns the distinct kinds of a schedule, sorted.
func kinds(schedule []string) []string {
	out := slices.Clone(schedule)
	slices.Sort(out)
	return slices.Compact(out)
}
