// Serving AdapterService: the platform token checked before anything runs (a refusal answered
// with the marker, before integrations-received), the handler's answer turned into an outcome,
// and for work that goes on after the call (accepted) the Accepted answer, automatic lease
// renewal, and the outcome delivered through AdapterCallbackService by the reporter's rules.
import { readFileSync } from 'node:fs';
import grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { adapterPackage, adapterService } from './proto.js';
import { structFromJS, structToJS } from './struct.js';
import { Verifier, TOKEN_HEADER } from './token.js';
import { refusalError } from './refusal.js';
import { DELIVER_FLOOR_MS, Verdict, realClock, report } from './outcome.js';

/** The response header that says a verified call arrived and its handler may start. */
export const RECEIVED_HEADER = 'integrations-received';
export const EXECUTE_METHOD = '/integrations.adapter.v1.AdapterService/Execute';
export const CANCEL_METHOD = '/integrations.adapter.v1.AdapterService/Cancel';

/** Failure classes the platform knows (docs/adapter-protocol.md §3). */
export const FailureClass = Object.freeze({
  TRANSIENT: 'transient', PERMANENT: 'permanent', TIMEOUT: 'timeout', UNAVAILABLE: 'unavailable', PROTOCOL: 'protocol',
});

/** Codes the SDK puts on failures it answers for the handler, as the Go SDK's. */
export const SdkCode = Object.freeze({
  HANDLER_PANIC: 'adapter.handler_panic',
  INVALID_RESULT: 'adapter.invalid_result',
  SHUTTING_DOWN: 'adapter.shutting_down',
  NO_CALLBACK_ADDR: 'adapter.no_callback_addr',
  UNKNOWN_CAPABILITY: 'adapter.unknown_capability',
});

/** The lease asked for when accepted() is given none, in ms. */
export const DEFAULT_LEASE_MS = 30_000;
/** How often renewals may run at most, as a granted lease shrinks towards the deadline. */
export const MIN_RENEW_EVERY_MS = 10;

const FAILURE = Symbol('integrations.failure');
const ACCEPTED = Symbol('integrations.accepted');

/**
 * A failed outcome. message is shown to clients: no secrets. retryAfterMs asks that the next
 * attempt start no earlier (e.g. from the provider's Retry-After).
 */
export function fail({ class: cls = FailureClass.PERMANENT, code = '', message = '', retryable = false, retryAfterMs } = {}) {
  return { [FAILURE]: true, class: cls, code, message, retryable, retryAfterMs };
}

/**
 * The answer for long work: in an async execution the call is answered Accepted at once and
 * work(ctx) runs after it, with the lease renewed every third of it while it runs and its result
 * delivered through the Complete callback; ctx.reportProgress reports progress. In a sync
 * execution the platform cannot wait, so work runs within the call and its result is the answer.
 */
export function accepted(work, { leaseMs = DEFAULT_LEASE_MS } = {}) {
  if (typeof work !== 'function') throw new TypeError('accepted(work): work must be a function');
  return { [ACCEPTED]: true, work, leaseMs: leaseMs > 0 ? leaseMs : DEFAULT_LEASE_MS };
}

/** Why work was stopped, as ctx.signal.reason says. */
export class WorkStopped extends Error {
  constructor(why) {
    super(`adapter work stopped: ${why}`);
    this.name = 'WorkStopped';
    this.why = why; // 'cancelled' | 'attempt_gone' | 'deadline' | 'shutdown' | 'call_ended'
  }
}

const durationFromMs = (ms) => ({ seconds: String(Math.trunc(ms / 1000)), nanos: Math.round((ms % 1000) * 1e6) });
const msFromDuration = (d) => Number(d.seconds ?? 0) * 1000 + (d.nanos ?? 0) / 1e6;

/** A logger writing one JSON line per entry to stderr: static messages, typed fields. */
export function jsonLogger(level = 'info') {
  const levels = { debug: 0, info: 1, warn: 2, error: 3 };
  const min = levels[level] ?? 1;
  const out = {};
  for (const [name, n] of Object.entries(levels)) {
    out[name] = n < min ? () => {} : (msg, fields = {}) => {
      process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level: name, msg, ...fields })}\n`);
    };
  }
  return out;
}

/**
 * The Callbacks of one accepted attempt: progress, lease renewal, and the completion (sent by the
 * SDK). Bound to the execution, attempt and callback token; sends the credential on every call.
 */
export class Callbacks {
  constructor({ client, credential, executionId, attempt, callbackToken, leaseMs, clock = realClock, inline = false }) {
    Object.assign(this, { client, credential, executionId, attempt, callbackToken, clock, inline });
    this.leaseMs = leaseMs; // asked for
    this.grantedMs = 0; // last granted (0: none yet)
    this.leaseEnd = clock.now() + leaseMs; // until a renewal says what was granted
  }

  #call(method, req, deadline) {
    const md = new grpc.Metadata();
    if (this.credential) md.set('authorization', `Bearer ${this.credential}`);
    const ids = { execution_id: this.executionId, attempt: this.attempt, callback_token: this.callbackToken };
    return new Promise((resolve, reject) => {
      this.client[method]({ ...ids, ...req }, md, { deadline: new Date(deadline ?? this.clock.now() + 5000) },
        (err, resp) => (err ? reject(err) : resolve(resp)));
    });
  }

  /** Stores progress (a JSON object) on the execution. Does nothing within a sync call. */
  async reportProgress(progress) {
    if (this.inline) return;
    await this.#call('ReportProgress', { progress: structFromJS(progress) });
  }

  /**
   * Extends the lease to ms from now (0: the capability's); the automatic renewal then keeps
   * asking for it. Does nothing within a sync call.
   */
  async renewLease(ms) {
    if (this.inline) return;
    if (ms > 0) this.leaseMs = ms;
    await this.renew(ms);
  }

  async renew(ms, deadline) {
    // Counted from before the call: the platform grants from its now, which is no earlier.
    const asked = this.clock.now();
    const resp = await this.#call('RenewLease', { lease: durationFromMs(ms) }, deadline);
    if (resp?.lease) {
      this.grantedMs = msFromDuration(resp.lease);
      this.leaseEnd = asked + this.grantedMs;
    } else if (resp?.lease_expire_time) {
      this.leaseEnd = msFromDuration(resp.lease_expire_time);
      this.grantedMs = this.leaseEnd - this.clock.now();
    }
  }

  /** The time to the next automatic renewal: a third of the lease asked, or granted if shorter. */
  renewEvery() {
    const lease = this.grantedMs > 0 && this.grantedMs < this.leaseMs ? this.grantedMs : this.leaseMs;
    return Math.max(lease / 3, MIN_RENEW_EVERY_MS);
  }

  async complete(outcome, deadline) {
    return this.#call('Complete', outcome, deadline);
  }
}

const goneCodes = new Set([grpc.status.INVALID_ARGUMENT, grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED,
  grpc.status.NOT_FOUND, grpc.status.FAILED_PRECONDITION, grpc.status.ABORTED]);

/** Whether a renewal's error says the attempt is over (a refusal, not an outage). */
export function attemptGone(err) {
  return typeof err?.code === 'number' && goneCodes.has(err.code);
}

/**
 * Renews cb's lease until signal aborts: first at once (the granted lease is learnt only from an
 * answer), then every third of it, so that two renewals in a row may fail before it ends. A
 * refusal calls onGone and ends the loop.
 */
export async function renewLoop(cb, signal, { clock = realClock, log = jsonLogger('warn'), onGone = () => {} } = {}) {
  for (let first = true; ; first = false) {
    await clock.sleep(first ? MIN_RENEW_EVERY_MS : cb.renewEvery(), signal);
    if (signal.aborted) return;
    try {
      await cb.renew(cb.leaseMs, clock.now() + cb.leaseMs / 3);
      log.debug('lease renewed', { execution_id: cb.executionId, attempt: cb.attempt, lease_ms: cb.leaseMs });
    } catch (err) {
      if (signal.aborted) return;
      if (attemptGone(err)) {
        log.warn('lease renewal refused; stopping background work', { execution_id: cb.executionId, attempt: cb.attempt, code: err.code });
        onGone(err);
        return;
      }
      log.warn('lease renewal failed', { execution_id: cb.executionId, attempt: cb.attempt, code: err?.code });
    }
  }
}

/**
 * Delivers an outcome through Complete by the reporter's rules, until the lease ends (at least
 * DELIVER_FLOOR_MS from now). A result the platform refuses is delivered instead as a permanent
 * protocol failure. stopped() true (the execution was cancelled) ends it between tries.
 */
export async function deliver(cb, outcome, { clock = realClock, log = jsonLogger('warn'), stopped = () => false } = {}) {
  const until = Math.max(cb.leaseEnd, clock.now() + DELIVER_FLOOR_MS);
  const ids = { execution_id: cb.executionId, attempt: cb.attempt };
  for (;;) {
    const name = outcome.succeeded ? 'succeeded' : 'failed';
    const r = await report((deadline) => cb.complete(outcome, deadline), {
      until, clock, stop: stopped,
      onRetry: (err, wait, tries) => log.warn('outcome report failed; retrying', { ...ids, tries, code: err?.code, backoff_ms: Math.round(wait) }),
    });
    if (r.verdict === Verdict.RESULT_REFUSED && outcome.succeeded) {
      log.warn('adapter result refused by the platform; delivering a protocol failure', { ...ids, code: r.error?.code });
      outcome = { failed: failedOf(fail({ class: FailureClass.PROTOCOL, code: SdkCode.INVALID_RESULT,
        message: `adapter result refused: ${String(r.error?.details ?? '').slice(0, 512)}` })) };
      continue;
    }
    const level = r.verdict === Verdict.RECORDED || r.verdict === Verdict.MOVED_ON ? 'info' : 'error';
    log[level](r.verdict === Verdict.RECORDED ? 'outcome delivered' : 'outcome not delivered',
      { ...ids, outcome: name, verdict: r.verdict, tries: r.tries, code: r.error?.code });
    return r;
  }
}

function failedOf(f) {
  const out = { class: f.class || (f.retryable ? FailureClass.TRANSIENT : FailureClass.PERMANENT), code: f.code ?? '',
    message: f.message ?? '', retryable: !!f.retryable };
  if (f.retryAfterMs > 0) out.retry_after = durationFromMs(f.retryAfterMs);
  return out;
}

// The grpc.health.v1 messages, defined by field number.
const health = protobuf.Root.fromJSON({ nested: { grpc: { nested: { health: { nested: { v1: { nested: {
  HealthCheckRequest: { fields: { service: { type: 'string', id: 1 } } },
  HealthCheckResponse: { fields: { status: { type: 'int32', id: 1 } } },
} } } } } } } });
const HealthReq = health.lookupType('grpc.health.v1.HealthCheckRequest');
const HealthResp = health.lookupType('grpc.health.v1.HealthCheckResponse');
const healthService = {
  Check: {
    path: '/grpc.health.v1.Health/Check', requestStream: false, responseStream: false,
    requestSerialize: (m) => Buffer.from(HealthReq.encode(m).finish()),
    requestDeserialize: (b) => HealthReq.toObject(HealthReq.decode(b)),
    responseSerialize: (m) => Buffer.from(HealthResp.encode(m).finish()),
    responseDeserialize: (b) => HealthResp.toObject(HealthResp.decode(b)),
  },
};
const SERVING = 1;
const NOT_SERVING = 2;

/**
 * Starts an adapter: see index.d.ts for the options. Resolves to {port, address, server, close}.
 */
export async function serve(options) {
  const o = { address: '127.0.0.1:0', logLevel: 'info', ...options };
  const log = o.logger ?? jsonLogger(o.logLevel);
  const clock = o.clock ?? realClock;
  const capabilities = o.capabilities ?? {};
  if (Object.keys(capabilities).length === 0) throw new Error('serve: at least one capability is required');
  let verifier = null;
  if (!o.insecureSkipPlatformAuth) {
    verifier = new Verifier(o.adapterId, o.publicKeys, { now: clock.now });
  } else {
    log.warn('platform token checks are off: anyone who reaches this adapter can run its handler');
  }
  let client = null;
  if (o.callbackAddr) {
    const Ctor = grpc.loadPackageDefinition(adapterPackage()).integrations.adapter.v1.AdapterCallbackService;
    const creds = o.callbackCaFile ? grpc.credentials.createSsl(readFileSync(o.callbackCaFile))
      : o.callbackTls ? grpc.credentials.createSsl() : grpc.credentials.createInsecure();
    client = new Ctor(o.callbackAddr, creds);
  }

  /** Work in progress by attempt ("id/attempt") → set of AbortControllers. */
  const work = new Map();
  const background = new Set();
  let closing = false;
  let healthStatus = SERVING;
  let lastRefusalLog = 0;
  let unlogged = 0;

  const track = (key, ctl) => {
    if (!work.has(key)) work.set(key, new Set());
    work.get(key).add(ctl);
    return () => { work.get(key)?.delete(ctl); if (work.get(key)?.size === 0) work.delete(key); };
  };

  const authenticate = (call, method, type) => {
    if (!verifier) return null;
    const values = call.metadata.get(TOKEN_HEADER);
    const token = values.length === 1 ? String(values[0]) : '';
    try {
      verifier.verify(token, { method, type, request: call.request });
      return null;
    } catch (err) {
      // At most one line a second: anyone who reaches the port can cause a refusal.
      const now = clock.now();
      if (now - lastRefusalLog >= 1000) {
        log.warn('call refused: platform token', { method, execution_id: String(call.request?.execution_id ?? '').slice(0, 64),
          attempt: call.request?.attempt ?? 0, check: err.check, refused_unlogged: unlogged });
        lastRefusalLog = now;
        unlogged = 0;
      } else {
        unlogged++;
      }
      return refusalError(err);
    }
  };

  // Runs a handler or work function, turning a throw or an invalid answer into a failure.
  const run = async (fn, ctx, payload, ids) => {
    try {
      const res = await fn(ctx, payload);
      if (res === null || typeof res !== 'object' || Array.isArray(res)) {
        log.error('adapter handler returned an invalid result', { ...ids, reason: 'not an object, fail() or accepted()' });
        return fail({ class: FailureClass.PERMANENT, code: SdkCode.INVALID_RESULT, message: 'adapter returned an invalid result' });
      }
      return res;
    } catch (err) {
      // The error may quote the payload: it goes to the log only, never into the failure message.
      log.error('adapter handler threw', { ...ids, error: String(err?.stack ?? err) });
      return fail({ class: FailureClass.PERMANENT, code: SdkCode.HANDLER_PANIC, message: 'adapter handler panicked' });
    }
  };

  // The outcome message (Completed or Failed) of a handler's answer.
  const outcomeOf = (res, ids) => {
    if (res[FAILURE]) return { failed: failedOf(res) };
    try {
      return { completed: { result: structFromJS(res) } };
    } catch (err) {
      log.error('adapter result is not representable as JSON', { ...ids, error: err.message });
      return { failed: failedOf(fail({ class: FailureClass.PERMANENT, code: SdkCode.INVALID_RESULT,
        message: 'adapter result is not representable as JSON' })) };
    }
  };

  const runBackground = async (ctl, cb, res, ctx, payload, ids, untrack) => {
    const stopRenewing = new AbortController();
    const renewing = renewLoop(cb, stopRenewing.signal, { clock, log,
      onGone: () => ctl.abort(new WorkStopped('attempt_gone')) });
    let out = await run(res.work, ctx, payload, ids);
    // Renewal stops before the outcome goes out: no renewal follows the completion.
    stopRenewing.abort();
    await renewing;
    const why = ctl.signal.reason?.why;
    if (why === 'attempt_gone' || why === 'cancelled') {
      log.info(why === 'cancelled' ? 'background work stopped: the execution was cancelled'
        : 'background work abandoned: the attempt is no longer open', ids);
      untrack();
      return;
    }
    if (out[ACCEPTED]) {
      out = fail({ class: FailureClass.PERMANENT, code: SdkCode.INVALID_RESULT, message: 'adapter returned an invalid result' });
    }
    const o2 = outcomeOf(out, ids);
    const outcome = o2.completed ? { succeeded: o2.completed } : { failed: o2.failed };
    try {
      await deliver(cb, outcome, { clock, log, stopped: () => ctl.signal.reason?.why === 'cancelled' });
    } finally {
      untrack();
    }
  };

  const execute = async (call, callback) => {
    const refusal = authenticate(call, EXECUTE_METHOD, 'ExecuteRequest');
    if (refusal) { callback(refusal); return; }
    // Before any work: a call that then breaks without this header ran nothing.
    const received = new grpc.Metadata();
    received.set(RECEIVED_HEADER, '1');
    call.sendMetadata(received);

    const req = call.request;
    const ids = { execution_id: req.execution_id ?? '', attempt: req.attempt ?? 0, capability: req.capability ?? '' };
    const mode = req.mode === 2 ? 'sync' : 'async';
    let deadline = null;
    if (req.deadline_in) deadline = clock.now() + msFromDuration(req.deadline_in);
    else if (req.deadline_time) deadline = msFromDuration(req.deadline_time);
    const ctl = new AbortController();
    let timer;
    if (deadline !== null) timer = setTimeout(() => ctl.abort(new WorkStopped('deadline')), Math.max(0, deadline - clock.now()));
    const untrack = track(`${ids.execution_id}/${ids.attempt}`, ctl);
    const payload = structToJS(req.payload);
    const ctx = {
      executionId: ids.execution_id, attempt: ids.attempt, capability: ids.capability, mode,
      deadline: deadline === null ? null : new Date(deadline), signal: ctl.signal, log,
      reportProgress: async () => {}, renewLease: async () => {},
    };
    const handler = capabilities[ids.capability];
    let res = handler ? await run(handler, ctx, payload, ids)
      : fail({ class: FailureClass.PERMANENT, code: SdkCode.UNKNOWN_CAPABILITY, message: `this adapter does not serve ${ids.capability}` });
    let answer;
    let detached = false;
    if (res[ACCEPTED]) {
      if (mode === 'sync') {
        res = await run(res.work, ctx, payload, ids);
        if (res[ACCEPTED]) res = fail({ class: FailureClass.PERMANENT, code: SdkCode.INVALID_RESULT, message: 'adapter returned an invalid result' });
      } else if (closing) {
        res = fail({ class: FailureClass.UNAVAILABLE, code: SdkCode.SHUTTING_DOWN, message: 'adapter is shutting down', retryable: true });
      } else if (!client) {
        log.error('cannot start background work: no callback address configured', ids);
        res = fail({ class: FailureClass.UNAVAILABLE, code: SdkCode.NO_CALLBACK_ADDR, message: 'adapter cannot reach the callback service', retryable: true });
      } else {
        const cb = new Callbacks({ client, credential: o.credential, executionId: ids.execution_id, attempt: ids.attempt,
          callbackToken: req.callback_token ?? '', leaseMs: res.leaseMs, clock });
        ctx.reportProgress = (p) => cb.reportProgress(p);
        ctx.renewLease = (ms) => cb.renewLease(ms);
        answer = { accepted: { lease: durationFromMs(res.leaseMs) } };
        detached = true;
        const p = runBackground(ctl, cb, res, ctx, payload, ids, () => { clearTimeout(timer); untrack(); })
          .catch((err) => log.error('background work failed', { ...ids, error: String(err) }))
          .finally(() => background.delete(p));
        background.add(p);
      }
    }
    if (!detached) {
      clearTimeout(timer);
      untrack();
      answer = outcomeOf(res, ids);
    }
    log.debug('execute answered', { ...ids, outcome: Object.keys(answer)[0] });
    callback(null, answer);
  };

  const cancel = (call, callback) => {
    const refusal = authenticate(call, CANCEL_METHOD, 'CancelRequest');
    if (refusal) { callback(refusal); return; }
    const key = `${call.request.execution_id ?? ''}/${call.request.attempt ?? 0}`;
    const ctls = work.get(key) ?? new Set();
    for (const ctl of ctls) ctl.abort(new WorkStopped('cancelled'));
    log.info('cancel requested', { execution_id: call.request.execution_id ?? '', attempt: call.request.attempt ?? 0, stopped: ctls.size > 0 });
    callback(null, { stopped: ctls.size > 0 });
  };

  const server = new grpc.Server();
  server.addService(adapterService(), {
    Execute: (call, callback) => { execute(call, callback).catch((err) => callback({ code: grpc.status.INTERNAL, details: String(err) })); },
    Cancel: cancel,
  });
  server.addService(healthService, { Check: (_call, callback) => callback(null, { status: healthStatus }) });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync(o.address, grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
  });
  const host = o.address.slice(0, o.address.lastIndexOf(':'));
  log.info('adapter serving', { address: `${host}:${port}`, capabilities: Object.keys(capabilities) });

  /**
   * Stops taking calls; running background work may finish for graceMs, is then aborted
   * ('shutdown') and may still deliver its outcome for 2 s more.
   */
  const close = async ({ graceMs = 10_000 } = {}) => {
    closing = true;
    healthStatus = NOT_SERVING;
    await new Promise((resolve) => server.tryShutdown(() => resolve()));
    const all = () => Promise.allSettled([...background]);
    const timeout = (ms) => new Promise((resolve) => { const t = setTimeout(resolve, ms); t.unref?.(); });
    await Promise.race([all(), timeout(graceMs)]);
    for (const ctls of work.values()) for (const ctl of ctls) ctl.abort(new WorkStopped('shutdown'));
    await Promise.race([all(), timeout(2000)]);
    client?.close();
  };
  return { port, address: `${host}:${port}`, server, close };
}
