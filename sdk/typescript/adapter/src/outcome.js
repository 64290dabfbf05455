// The outcome reporter's rules, as the Go SDK's (sdk/go/outcome, used by sdk/go/adapter's deliver):
//   - a retryable answer (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED without a
//     moved-on reason, INTERNAL, UNKNOWN, CANCELLED, or no status at all: a transport failure) is
//     retried with exponential backoff — 100 ms growing by 1.5 with ±50 % jitter to at most 2 s —
//     until the attempt's lease ends (at least 10 s from the first try), never a fixed number of
//     tries: the outcome is the only record of the provider's work;
//   - a moved-on reason (ALREADY_SETTLED, STALE_ATTEMPT, STATUS_MISMATCH, NO_LONGER_APPLICABLE) or
//     NOT_FOUND / FAILED_PRECONDITION ends it: someone else decided, final and not an error;
//   - INVALID_ARGUMENT on the result is "result refused": report a protocol failure instead;
//   - anything else is a refusal for good.
import grpc from '@grpc/grpc-js';
import { decodeStatus, errorReason } from './proto.js';
import { STATUS_DETAILS_KEY } from './refusal.js';

export const Verdict = Object.freeze({
  RECORDED: 'recorded', MOVED_ON: 'moved_on', RESULT_REFUSED: 'result_refused', REFUSED: 'refused', EXPIRED: 'expired',
});

/** The least time an outcome is retried for, when the lease is about to end or is over. */
export const DELIVER_FLOOR_MS = 10_000;

const movedOnReasons = new Set(['ALREADY_SETTLED', 'STALE_ATTEMPT', 'STATUS_MISMATCH', 'NO_LONGER_APPLICABLE'].map(errorReason));
const { status } = grpc;
const retryCodes = new Set([status.UNAVAILABLE, status.DEADLINE_EXCEEDED, status.RESOURCE_EXHAUSTED, status.ABORTED,
  status.INTERNAL, status.UNKNOWN, status.CANCELLED]);

/** The rich details of a grpc-js error: {errorInfos, fieldViolations}, empty when there are none. */
export function detailsOf(err) {
  const raw = err?.metadata?.get?.(STATUS_DETAILS_KEY)?.[0];
  if (!raw) return { errorInfos: [], fieldViolations: [] };
  try {
    return decodeStatus(Buffer.from(raw));
  } catch {
    return { errorInfos: [], fieldViolations: [] };
  }
}

/** The ErrorInfo reason of a grpc-js error, or ''. */
export function reasonOf(err) {
  return detailsOf(err).errorInfos[0]?.reason ?? '';
}

/** What an error means for a report: 'retry', 'moved_on', 'result_refused' or 'refused'. */
export function classify(err) {
  if (typeof err?.code !== 'number') return 'retry';
  if (movedOnReasons.has(reasonOf(err))) return 'moved_on';
  if (retryCodes.has(err.code)) return 'retry';
  if (err.code === status.NOT_FOUND || err.code === status.FAILED_PRECONDITION) return 'moved_on';
  if (err.code === status.INVALID_ARGUMENT && resultField(err)) return 'result_refused';
  return 'refused';
}

// An INVALID_ARGUMENT is about the result when a field violation names it or, naming no field,
// its message does.
function resultField(err) {
  const { fieldViolations } = detailsOf(err);
  if (fieldViolations.length > 0) return fieldViolations.some((v) => v.field.includes('result'));
  return String(err.details ?? err.message ?? '').includes('result');
}

/** The real clock and timers; tests give their own. */
export const realClock = {
  now: () => Date.now(),
  /** Resolves after ms, or at once when signal aborts. */
  sleep: (ms, signal) => new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(() => { signal?.removeEventListener('abort', done); resolve(); }, ms);
    const done = () => { clearTimeout(t); resolve(); };
    signal?.addEventListener('abort', done, { once: true });
  }),
  random: Math.random,
};

/**
 * Runs fn(deadlineMs) until it succeeds, an error is final by the rules, or until (a time in ms
 * on clock) comes. fn gets the deadline of its try (5 s, never past until). stop() true ends it
 * between tries (verdict MOVED_ON). Returns {verdict, error, tries}.
 */
export async function report(fn, { until, clock = realClock, callTimeoutMs = 5000, initialMs = 100, maxMs = 2000,
  multiplier = 1.5, jitter = 0.5, stop = () => false, classify: classifyErr = classify, onRetry } = {}) {
  let interval = initialMs;
  let last;
  for (let tries = 1; ; tries++) {
    if (stop()) return { verdict: Verdict.MOVED_ON, error: undefined, tries: tries - 1 };
    const now = clock.now();
    if (until !== undefined && now >= until) return { verdict: Verdict.EXPIRED, error: last, tries: tries - 1 };
    try {
      await fn(Math.min(now + callTimeoutMs, until ?? Infinity));
      return { verdict: Verdict.RECORDED, error: undefined, tries };
    } catch (err) {
      last = err;
      switch (classifyErr(err)) {
        case 'moved_on': return { verdict: Verdict.MOVED_ON, error: undefined, tries };
        case 'result_refused': return { verdict: Verdict.RESULT_REFUSED, error: err, tries };
        case 'refused': return { verdict: Verdict.REFUSED, error: err, tries };
        default: break;
      }
    }
    const wait = interval * (1 - jitter + 2 * jitter * clock.random());
    interval = Math.min(interval * multiplier, maxMs);
    if (until !== undefined && clock.now() + wait >= until) {
      // The next try would come after the lease: wait for the lease to end, as the Go reporter's
      // backoff does when its context ends, and give up.
      await clock.sleep(Math.max(0, until - clock.now()));
      return { verdict: Verdict.EXPIRED, error: last, tries };
    }
    onRetry?.(last, wait, tries);
    await clock.sleep(wait);
  }
}
