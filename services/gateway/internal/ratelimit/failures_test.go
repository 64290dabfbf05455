package ratelimit

import (
	"context"
	"hash/crc32"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/apikey"
	"github.com/integrations-platform/integrations/pkg/apperr"
	errorsv1 "github.com/integrations-platform/integrations/pkg/gen/integrations/errors/v1"
)

var (
	errWrong = apperr.Unauthenticated("unknown API key")
	attacker = netip.MustParseAddr("192.0.2.1")
	owner    = netip.MustParseAddr("192.0.2.2")
)

// failuresOn is a limiter of 10 failures a minute on a clock the test moves, over n replicas.
func failuresOn(n int) (*Failures, *fixed) {
	f := &fixed{replicas: n, now: time.Unix(1_700_000_000, 0)}
	l := NewFailures(10, time.Minute, func() int { f.mu.Lock(); defer f.mu.Unlock(); return f.replicas }, nil)
	l.now = func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
	return l, f
}

// tally counts the answers of attempts: 401s, 429s (and the last refusal's delay), successes.
type tally struct {
	unauthenticated, limited, ok int
	retryAfter                   time.Duration
	limit                        string
}

func (t *tally) add(err error) {
	e, _ := apperr.As(err)
	switch {
	case err == nil:
		t.ok++
	case e != nil && e.Kind == apperr.KindUnauthenticated:
		t.unauthenticated++
	case e != nil && e.Kind == apperr.KindResourceExhausted && e.Reason == errorsv1.ErrorReason_TOO_MANY_AUTH_FAILURES.String():
		t.limited++
		t.retryAfter, t.limit = e.RetryAfter, e.Metadata["limit"]
	default:
		panic(err)
	}
}

func attempt(l *Failures, src netip.Addr, token string, right bool) error {
	return l.Guard(context.Background(), src, token, func() error {
		if right {
			return nil
		}
		return errWrong
	})
}

func TestFailuresPerSourceThenRetryAfterThenBack(t *testing.T) {
	l, clock := failuresOn(1)
	var got tally
	for range 100 {
		got.add(attempt(l, attacker, "wrong", false))
	}
	require.Equal(t, 10, got.unauthenticated, "the burst of failures is answered 401")
	require.Equal(t, 90, got.limited)
	require.Equal(t, "source", got.limit)
	require.Equal(t, 6*time.Second, got.retryAfter, "10 a minute: the next in 6 s")

	require.Error(t, attempt(l, attacker, "right", true), "the source is refused even with a right key: nothing is verified")
	require.NoError(t, attempt(l, owner, "right", true), "another address is unaffected")
	var other tally
	other.add(attempt(l, owner, "wrong", false))
	require.Equal(t, 1, other.unauthenticated, "another address has its own budget")

	clock.advance(6 * time.Second)
	var back tally
	back.add(attempt(l, attacker, "wrong", false))
	back.add(attempt(l, attacker, "wrong", false))
	require.Equal(t, tally{unauthenticated: 1, limited: 1, retryAfter: 6 * time.Second, limit: "source"}, back, "one failure back per 6 s")
	require.NoError(t, l.Check(owner, "x"))
	require.Error(t, l.Check(attacker, "x"), "Check answers as Guard would")
}

func TestSuccessesCostNoBudget(t *testing.T) {
	l, _ := failuresOn(1)
	for range 1000 {
		require.NoError(t, attempt(l, owner, "right", true))
	}
	var got tally
	for range 11 {
		got.add(attempt(l, owner, "wrong", false))
	}
	require.Equal(t, 10, got.unauthenticated, "a thousand successes took nothing")
}

func TestOtherErrorsAreNoFailures(t *testing.T) {
	l, _ := failuresOn(1)
	for range 50 {
		err := l.Guard(context.Background(), attacker, "t", func() error { return apperr.New(apperr.KindUnavailable, "DOWN", "postgres down") })
		require.Error(t, err)
		e, _ := apperr.As(err)
		require.Equal(t, apperr.KindUnavailable, e.Kind)
	}
	require.NoError(t, l.Check(attacker, "t"))
}

// Concurrent wrong attempts from one address: no more verified than it has tokens, whatever
// their number; concurrent right ones from one address all pass.
func TestConcurrentAttemptsVerifyNoMoreThanTheBudget(t *testing.T) {
	l, _ := failuresOn(1)
	var verified atomic.Int64
	var mu sync.Mutex
	var got tally
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			err := l.Guard(context.Background(), attacker, "wrong", func() error {
				verified.Add(1)
				time.Sleep(time.Millisecond) // a verification that takes a while (a key read)
				return errWrong
			})
			mu.Lock()
			got.add(err)
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, int64(10), verified.Load())
	require.Equal(t, 10, got.unauthenticated)
	require.Equal(t, 190, got.limited)

	var oks atomic.Int64
	for range 200 {
		wg.Go(func() {
			if assert.NoError(t, l.Guard(context.Background(), owner, "right", func() error {
				time.Sleep(time.Millisecond)
				return nil
			})) {
				oks.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(200), oks.Load(), "right keys wait for each other's tokens, never refused")
}

// Wrong secrets for one key id from many addresses exhaust the key id's budget; its owner, from
// an address that did not fail, still gets in; an address that failed is refused for the key.
func TestKeyIDFloodDoesNotLockOutItsOwner(t *testing.T) {
	l, _ := failuresOn(1)
	key, err := apikey.Generate()
	require.NoError(t, err)
	forged, err := apikey.Generate()
	require.NoError(t, err)
	wrong := apikey.Prefix + key.ID + forged.Token[len(apikey.Prefix)+apikey.IDLen:] // key's id, another secret
	wrong = wrong[:apikey.Len-apikey.ChecksumLen]
	wrong += crc62(wrong)
	parsed, err := apikey.Parse(wrong)
	require.NoError(t, err)
	require.Equal(t, key.ID, parsed.ID)

	var got tally
	for i := range 30 {
		got.add(attempt(l, netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), wrong, false))
	}
	require.Equal(t, 30, got.unauthenticated, "each fresh address is verified once: no lockout by the key id alone")
	// An address that failed once, then tries the flooded key id again: refused for the key.
	var again tally
	again.add(attempt(l, netip.AddrFrom4([4]byte{198, 51, 100, 0}), wrong, false))
	require.Equal(t, 1, again.limited)
	require.Equal(t, "key", again.limit)
	require.NoError(t, attempt(l, owner, key.Token, true), "the owner, from an address that did not fail, gets in")
}

// crc62 is a generated key's checksum (pkg/apikey): anyone can compute it, so a guesser sends
// well-formed keys.
func crc62(body string) string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	n := crc32.ChecksumIEEE([]byte(body))
	out := make([]byte, apikey.ChecksumLen)
	for i := len(out) - 1; i >= 0; i-- {
		out[i] = alphabet[n%62]
		n /= 62
	}
	return string(out)
}

// Over N replicas each holds ⌈burst ÷ N⌉: a flood spread over them gets about the burst.
func TestFailuresShareAcrossReplicas(t *testing.T) {
	var total tally
	for range 3 {
		l, _ := failuresOn(3)
		for range 100 {
			total.add(attempt(l, attacker, "wrong", false))
		}
	}
	require.Equal(t, 12, total.unauthenticated, "3 × ⌈10 ÷ 3⌉")
}

func TestSourceKeys(t *testing.T) {
	require.Equal(t, sourceKey(netip.MustParseAddr("2001:db8::1")), sourceKey(netip.MustParseAddr("2001:db8::ffff:1")), "one IPv6 /64")
	require.NotEqual(t, sourceKey(netip.MustParseAddr("2001:db8::1")), sourceKey(netip.MustParseAddr("2001:db8:0:1::1")))
	require.Equal(t, sourceKey(netip.MustParseAddr("192.0.2.1")), sourceKey(netip.MustParseAddr("::ffff:192.0.2.1")), "a mapped IPv4 is the IPv4")
	require.Equal(t, netip.MustParseAddr("127.0.0.2"), AddrOf("127.0.0.2:5555"))
	require.Equal(t, netip.MustParseAddr("127.0.0.2"), SourceOf(WithSource(context.Background(), "127.0.0.2:5555")))
	require.Equal(t, "1", RetryAfterSeconds(time.Millisecond))
	require.Equal(t, "7", RetryAfterSeconds(6001*time.Millisecond))
}

// BenchmarkGuardSuccess is what the limiter adds to a successful authentication: a source's
// token held and given back.
func BenchmarkGuardSuccess(b *testing.B) {
	l := NewFailures(10, time.Minute, func() int { return 1 }, nil)
	ok := func() error { return nil }
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = l.Guard(context.Background(), owner, "dev_0123456789abcdef0123456789abcdef", ok)
		}
	})
}
