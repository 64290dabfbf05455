// The retry rules of the outcome reporter and the automatic lease renewal, on a fake clock: each
// sleep advances it at once, so the schedule is checked without waiting for it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import grpc from '@grpc/grpc-js';
import { ErrorInfo, BadRequest, Status, errorReason, typeURL } from '../src/proto.js';
import { report, classify, Verdict, DELIVER_FLOOR_MS } from '../src/outcome.js';
import { renewLoop, deliver, attemptGone, MIN_RENEW_EVERY_MS } from '../src/server.js';

function fakeClock(start = 1_000_000) {
  const c = { t: start, slept: [], now: () => c.t, random: () => 0.5 };
  c.sleep = async (ms) => { c.slept.push(ms); c.t += ms; };
  return c;
}

// A grpc-js error as a callback service answers it, with an optional ErrorInfo reason or a
// BadRequest naming a field.
function grpcError(code, { reason, field, details = 'refused' } = {}) {
  const any = [];
  if (reason) any.push({ type_url: typeURL.ErrorInfo, value: ErrorInfo.encode({ reason, domain: 'integrations' }).finish() });
  if (field) any.push({ type_url: typeURL.BadRequest, value: BadRequest.encode({ field_violations: [{ field, description: 'bad' }] }).finish() });
  const metadata = new grpc.Metadata();
  if (any.length) metadata.set('grpc-status-details-bin', Buffer.from(Status.encode({ code, message: details, details: any }).finish()));
  return Object.assign(new Error(details), { code, details, metadata });
}

const s = grpc.status;

test('classify: which answers are retried, which end the report', () => {
  for (const code of [s.UNAVAILABLE, s.DEADLINE_EXCEEDED, s.RESOURCE_EXHAUSTED, s.ABORTED, s.INTERNAL, s.UNKNOWN, s.CANCELLED]) {
    assert.equal(classify(grpcError(code)), 'retry', `code ${code}`);
  }
  assert.equal(classify(new Error('socket hang up')), 'retry', 'no status: a transport failure');
  for (const reason of ['ALREADY_SETTLED', 'STALE_ATTEMPT', 'STATUS_MISMATCH', 'NO_LONGER_APPLICABLE']) {
    assert.equal(classify(grpcError(s.ABORTED, { reason })), 'moved_on', reason);
  }
  assert.equal(classify(grpcError(s.NOT_FOUND)), 'moved_on');
  assert.equal(classify(grpcError(s.FAILED_PRECONDITION, { reason: 'SYNC_EXECUTION' })), 'moved_on');
  assert.equal(classify(grpcError(s.INVALID_ARGUMENT, { field: 'succeeded.result' })), 'result_refused');
  assert.equal(classify(grpcError(s.INVALID_ARGUMENT, { details: 'result holds NaN' })), 'result_refused');
  assert.equal(classify(grpcError(s.INVALID_ARGUMENT, { field: 'attempt', details: 'result' })), 'refused', 'a field named: the field decides');
  assert.equal(classify(grpcError(s.UNAUTHENTICATED, { reason: 'INVALID_CALLBACK' })), 'refused');
  assert.equal(classify(grpcError(s.PERMISSION_DENIED, { reason: 'FOREIGN_EXECUTION' })), 'refused');
});

test('errorReason: the reasons are the proto enum\'s (integrations.errors.v1.ErrorReason)', () => {
  for (const reason of ['ALREADY_SETTLED', 'NO_LONGER_APPLICABLE', 'PLATFORM_TOKEN_REFUSED']) {
    assert.equal(errorReason(reason), reason);
  }
  for (const name of ['ALREADY_DONE', 'already_settled', 'ERROR_REASON_UNSPECIFIED', 'toString']) {
    assert.throws(() => errorReason(name), /not a reason/, name);
  }
});

test('report: retried with backoff from 100 ms by 1.5 up to 2 s, until the lease, never a count of tries', async () => {
  const clock = fakeClock();
  const until = clock.now() + 20_000;
  let tries = 0;
  const r = await report(async () => { tries++; throw grpcError(s.UNAVAILABLE); }, { until, clock });
  assert.equal(r.verdict, Verdict.EXPIRED);
  assert.equal(r.error.code, s.UNAVAILABLE);
  assert.equal(r.tries, tries);
  // random() 0.5 is the middle of the jitter: the intervals themselves.
  assert.deepEqual(clock.slept.slice(0, 9).map(Math.round), [100, 150, 225, 338, 506, 759, 1139, 1709, 2000]);
  assert.ok(clock.slept.slice(9, -1).every((ms) => ms === 2000), 'capped at 2 s');
  assert.equal(clock.now(), until, 'gives up only when the lease ends');
  assert.ok(tries > 10, `${tries} tries in 20 s`);
});

test('report: jitter stays within ±50 %', async () => {
  for (const rnd of [0, 0.999]) {
    const clock = fakeClock();
    clock.random = () => rnd;
    let n = 0;
    await report(async () => { if (++n < 3) throw grpcError(s.INTERNAL); }, { until: clock.now() + 10_000, clock });
    const [a, b] = clock.slept;
    assert.ok(a >= 50 && a < 150 && b >= 75 && b < 225, `${a} ${b}`);
  }
});

test('report: success after outages is recorded; a moved-on answer, a refusal and a refused result end it at once', async () => {
  let clock = fakeClock();
  let n = 0;
  let r = await report(async () => { if (++n < 4) throw grpcError(s.UNAVAILABLE); }, { until: clock.now() + 10_000, clock });
  assert.deepEqual([r.verdict, r.tries], [Verdict.RECORDED, 4]);
  for (const [err, verdict] of [
    [grpcError(s.ABORTED, { reason: 'NO_LONGER_APPLICABLE' }), Verdict.MOVED_ON],
    [grpcError(s.UNAUTHENTICATED, { reason: 'INVALID_CALLBACK' }), Verdict.REFUSED],
    [grpcError(s.INVALID_ARGUMENT, { field: 'succeeded.result' }), Verdict.RESULT_REFUSED],
  ]) {
    clock = fakeClock();
    r = await report(async () => { throw err; }, { until: clock.now() + 10_000, clock });
    assert.deepEqual([r.verdict, r.tries, clock.slept.length], [verdict, 1, 0], err.details);
  }
});

test('report: each try gets 5 s, never past the lease', async () => {
  const clock = fakeClock();
  const deadlines = [];
  await report(async (d) => { deadlines.push(d - clock.now()); throw grpcError(s.UNAVAILABLE); }, { until: clock.now() + 6000, clock });
  assert.equal(deadlines[0], 5000);
  assert.ok(deadlines.at(-1) <= 6000 - clock.slept.slice(0, -1).reduce((a, b) => a + b, 0));
});

// A Callbacks stand-in for the renewal loop and delivery.
function fakeCallbacks(clock, { leaseMs = 30_000, renew, complete } = {}) {
  const cb = {
    executionId: 'e', attempt: 1, leaseMs, grantedMs: 0, leaseEnd: clock.now() + leaseMs, renewals: [], completes: [],
    renewEvery() {
      const lease = this.grantedMs > 0 && this.grantedMs < this.leaseMs ? this.grantedMs : this.leaseMs;
      return Math.max(lease / 3, MIN_RENEW_EVERY_MS);
    },
    async renew(ms) { this.renewals.push(clock.now()); await renew?.(this, ms); },
    async complete(outcome) { this.completes.push(outcome); await complete?.(this, outcome); },
  };
  return cb;
}
const quiet = { debug() {}, info() {}, warn() {}, error() {} };

test('renewal: the first at once, then every third of the lease, of the granted one when shorter', async () => {
  const clock = fakeClock(0);
  const stop = new AbortController();
  const cb = fakeCallbacks(clock, {
    leaseMs: 30_000,
    renew: (c) => {
      if (c.renewals.length === 3) c.grantedMs = 9000; // the platform caps it
      if (c.renewals.length === 6) stop.abort();
    },
  });
  await renewLoop(cb, stop.signal, { clock, log: quiet });
  assert.deepEqual(cb.renewals, [10, 10_010, 20_010, 23_010, 26_010, 29_010]);
});

test('renewal: an outage is retried on schedule; a refusal stops the work and the loop', async () => {
  const clock = fakeClock(0);
  let gone = null;
  const cb = fakeCallbacks(clock, {
    leaseMs: 3000,
    renew: (c) => {
      if (c.renewals.length <= 2) throw grpcError(s.UNAVAILABLE);
      throw grpcError(s.ABORTED, { reason: 'NO_LONGER_APPLICABLE' });
    },
  });
  await renewLoop(cb, new AbortController().signal, { clock, log: quiet, onGone: (err) => { gone = err; } });
  assert.deepEqual(cb.renewals, [10, 1010, 2010]);
  assert.equal(gone.code, s.ABORTED);
  for (const code of [s.INVALID_ARGUMENT, s.UNAUTHENTICATED, s.PERMISSION_DENIED, s.NOT_FOUND, s.FAILED_PRECONDITION, s.ABORTED]) {
    assert.ok(attemptGone(grpcError(code)), `code ${code}`);
  }
  for (const code of [s.UNAVAILABLE, s.DEADLINE_EXCEEDED, s.INTERNAL, s.RESOURCE_EXHAUSTED]) assert.ok(!attemptGone(grpcError(code)));
});

test('delivery: retried until the lease, at least 10 s; a refused result becomes a protocol failure', async () => {
  let clock = fakeClock(0);
  let cb = fakeCallbacks(clock, { leaseMs: 1000, complete: () => { throw grpcError(s.UNAVAILABLE); } });
  let r = await deliver(cb, { succeeded: { result: { fields: {} } } }, { clock, log: quiet });
  assert.equal(r.verdict, Verdict.EXPIRED);
  assert.equal(clock.now(), DELIVER_FLOOR_MS, 'a lease about to end: the floor');

  clock = fakeClock(0);
  cb = fakeCallbacks(clock, { leaseMs: 60_000, complete: () => { throw grpcError(s.UNAVAILABLE); } });
  await deliver(cb, { succeeded: { result: { fields: {} } } }, { clock, log: quiet });
  assert.equal(clock.now(), 60_000, 'until the lease ends');

  clock = fakeClock(0);
  cb = fakeCallbacks(clock, {
    complete: (_c, o) => { if (o.succeeded) throw grpcError(s.INVALID_ARGUMENT, { field: 'succeeded.result', details: 'result: NaN' }); },
  });
  r = await deliver(cb, { succeeded: { result: { fields: {} } } }, { clock, log: quiet });
  assert.equal(r.verdict, Verdict.RECORDED);
  assert.equal(cb.completes.length, 2);
  assert.deepEqual({ ...cb.completes[1].failed, message: undefined },
    { class: 'protocol', code: 'adapter.invalid_result', retryable: false, message: undefined });

  clock = fakeClock(0);
  let cancelled = false;
  cb = fakeCallbacks(clock, { complete: () => { cancelled = true; throw grpcError(s.UNAVAILABLE); } });
  r = await deliver(cb, { failed: {} }, { clock, log: quiet, stopped: () => cancelled });
  assert.deepEqual([r.verdict, cb.completes.length], [Verdict.MOVED_ON, 1], 'a cancellation ends the delivery between tries');
});
