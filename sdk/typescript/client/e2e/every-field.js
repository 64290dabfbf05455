// Run by e2e/client_typescript_test.go against a running stack: through the client and the
// generated types, read every field of the answers of invoke (async and sync), get, list (every
// page), timeline, cancel, events (list, get, redeliver, redrive) and consumer registration and
// rotation, holding each to the OpenAPI document's schema (e2e/schema.js); receive the webhooks on
// a server of its own and verify them with verifyWebhook. At the end, every field of every schema
// reached must have been seen at least once, but for the few listed in notSent with a reason.
//
// Environment: INTEGRATIONS_URL, INTEGRATIONS_API_KEY, INTEGRATIONS_OPENAPI_JSON (the document as
// JSON), the capabilities ECHO (async and sync) and PROGRESS (async, progress_events), and
// GRPC_CA_FILE, a PEM CA certificate for the gRPC consumer registered with ca_pem.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { Client, IntegrationsError, verifyWebhook } from '../src/index.js';
import { Walker } from './schema.js';

/** @typedef {import('../index.js').Execution} Execution */
/** @typedef {import('../index.js').WebhookEvent} WebhookEvent */

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const client = new Client({ baseUrl: env('INTEGRATIONS_URL'), apiKey: env('INTEGRATIONS_API_KEY') });
const walker = new Walker(JSON.parse(readFileSync(env('INTEGRATIONS_OPENAPI_JSON'), 'utf8')));
const echo = process.env.ECHO ?? 'dummy.echo';
const progressCapability = process.env.PROGRESS ?? 'dummy.progress';
const run = randomUUID().slice(0, 8);

// Fields no answer of this run is sure to carry, and why (one may still turn up, e.g. an event
// caught pending between deliveries). Anything else unseen fails the run.
const notSent = {
  'Attempt.late_time': 'only after an adapter reports an outcome for an attempt that has ended',
  'Event.dead_time': 'only on an event whose every delivery failed',
  'Event.next_attempt_time': 'only while an event waits for its next attempt: seen only when a list catches one pending',
  'TimelineEntry.progress': 'the capability reports progress only on the cancelled execution, whose timeline is not read',
};

/** A webhook receiver: every delivery verified with the client's helper, kept by execution. */
function receiver() {
  /** @type {{event: WebhookEvent, id: string}[]} */
  const got = [];
  const failures = [];
  let secrets = /** @type {string[]} */ ([]);
  let wake = () => {};
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      try {
        const event = verifyWebhook(Buffer.concat(chunks), req.headers, secrets);
        got.push({ event, id: String(req.headers['webhook-id']) });
        res.writeHead(204).end();
      } catch (err) {
        failures.push(String(err));
        res.writeHead(401).end();
      }
      wake();
    });
  });
  return {
    server,
    failures,
    setSecrets(s) { secrets = s; },
    /** until answers the first delivery for which pred holds, waiting for it (no sleeps: woken by each delivery). */
    async until(pred, what, ms = 60_000) {
      const deadline = Date.now() + ms;
      for (;;) {
        assert.deepEqual(failures, [], 'every delivery verifies');
        const hit = got.find(pred);
        if (hit) return hit;
        const left = deadline - Date.now();
        assert.ok(left > 0, `no delivery: ${what}`);
        await new Promise((resolve) => { wake = resolve; setTimeout(resolve, Math.min(left, 1000)); });
      }
    },
    count: (pred) => got.filter(pred).length,
  };
}

/** poll reads until pred holds (a deadline, and a pause that grows): for states only polling can see. */
async function poll(read, pred, what, ms = 60_000) {
  const deadline = Date.now() + ms;
  let pause = 20;
  for (;;) {
    const v = await read();
    if (pred(v)) return v;
    assert.ok(Date.now() < deadline, `${what} within ${ms} ms; last: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(500, pause * 1.5);
  }
}

test('the TypeScript client reads every field of the API\'s answers against the running stack', async (t) => {
  const hook = receiver();
  await new Promise((resolve) => hook.server.listen(0, '127.0.0.1', () => resolve(undefined)));
  t.after(() => hook.server.close());
  const address = /** @type {import('node:net').AddressInfo} */ (hook.server.address());
  const url = `http://127.0.0.1:${address.port}/events`;

  // Consumer registration: a gRPC consumer verified against a CA given with it, a plaintext one
  // (the stack allows it, as make run does), then the webhook the run receives on; one signing
  // secret across the three. Then rotation: deliveries from now on verify with the new secret.
  // The gRPC targets are loopback addresses nothing listens on (the stack allows private ones):
  // should the event router deliver to one before the webhook replaces it, it dials no host
  // outside this machine.
  const ca = readFileSync(env('GRPC_CA_FILE'), 'utf8');
  const viaCA = await client.setConsumer({ grpc: { target: '127.0.0.1:9', ca_pem: ca } });
  walker.walk('SetConsumerResponse', viaCA, 'setConsumer grpc, ca_pem');
  assert.deepEqual(viaCA.grpc, { target: '127.0.0.1:9', ca_pem: ca, plaintext: false });
  assert.equal(viaCA.webhook, undefined);
  const plain = await client.setConsumer({ grpc: { target: '127.0.0.1:9', plaintext: true } });
  walker.walk('SetConsumerResponse', plain, 'setConsumer grpc, plaintext');
  assert.equal(plain.grpc?.plaintext, true);
  const consumer = await client.setConsumer({ webhook: { url } });
  walker.walk('SetConsumerResponse', consumer, 'setConsumer');
  assert.match(consumer.signing_secret, /^whsec_/);
  assert.equal(consumer.webhook?.url, url);
  assert.equal(consumer.grpc, undefined);
  assert.equal(plain.signing_secret, viaCA.signing_secret, 'one secret, kept across re-registrations');
  assert.equal(consumer.signing_secret, viaCA.signing_secret, 'one secret, kept across re-registrations');
  const rotated = await client.rotateSigningSecret();
  walker.walk('RotateSigningSecretResponse', rotated, 'rotateSigningSecret');
  assert.notEqual(rotated.signing_secret, consumer.signing_secret);
  hook.setSecrets([rotated.signing_secret]);

  // Sync: settled in the answer, succeeded and failed.
  const sync = await client.invoke(echo, { hello: 'sync' }, { mode: 'sync', idempotencyKey: `${run}-sync` });
  walker.walk('InvokeCapabilityResponse', sync, 'invoke sync');
  assert.equal(sync.execution.status, 'EXECUTION_STATUS_SUCCEEDED');
  assert.equal(sync.execution.mode, 'MODE_SYNC');
  const syncFail = await client.invoke(echo, { dummy: { fail_permanent: true } }, { mode: 'sync' });
  walker.walk('InvokeCapabilityResponse', syncFail, 'invoke sync, failing');
  assert.equal(syncFail.execution.status, 'EXECUTION_STATUS_FAILED');
  assert.equal(syncFail.execution.failure?.reason, 'adapter.permanent');
  const failed = await client.getExecution(syncFail.execution.id);
  walker.walk('Execution', failed, 'getExecution, failed');
  assert.equal(failed.attempts[0]?.failure?.class, 'permanent');

  // Async: 202 pending at attempt 0, then settled; its completion webhook verified.
  const accepted = await client.invoke(echo, { hello: 'async' }, { idempotencyKey: `${run}-async` });
  walker.walk('InvokeCapabilityResponse', accepted, 'invoke async');
  assert.equal(accepted.execution.status, 'EXECUTION_STATUS_PENDING');
  assert.equal(accepted.execution.attempt, 0);
  assert.equal(accepted.url, `/v1/executions/${accepted.execution.id}`);
  const id = accepted.execution.id;
  const settled = await client.wait(id, { timeoutMs: 60_000 });
  walker.walk('Execution', settled, 'wait');
  assert.equal(settled.status, 'EXECUTION_STATUS_SUCCEEDED');
  assert.deepEqual(settled.result?.echo, { hello: 'async' });
  const got = await client.getExecution(id);
  walker.walk('Execution', got, 'getExecution');
  const completed = await hook.until((d) => d.event.data.execution_id === id, `completion of ${id}`);
  walker.walk('ExecutionCompletedEvent', completed.event, 'webhook execution.completed');
  assert.equal(completed.event.type, 'execution.completed');
  if (completed.event.type === 'execution.completed') {
    assert.equal(completed.event.data.status, 'succeeded');
    assert.equal(completed.event.data.idempotency_key, `${run}-async`);
  }

  // The same key with another request: 409, a Status with an ErrorInfo.
  const reused = await client.invoke(echo, { hello: 'other' }, { idempotencyKey: `${run}-async` }).catch((e) => e);
  assert.ok(reused instanceof IntegrationsError, String(reused));
  assert.equal(reused.status, 409);
  assert.equal(reused.reason, 'IDEMPOTENCY_KEY_REUSED');
  assert.equal(reused.retryable, false);
  walker.walk('Status', { code: reused.code, message: reused.message, details: reused.details }, '409');

  // Long work: running with a lease and progress (its progress event verified), then cancelled.
  const long = await client.invoke(progressCapability, { dummy: { complete_later_ms: 120_000, progress_steps: 120 } });
  const longId = long.execution.id;
  const running = await poll(() => client.getExecution(longId), (e) => e.status === 'EXECUTION_STATUS_RUNNING' && !!e.progress && !!e.lease_expire_time, 'running with progress');
  walker.walk('Execution', running, 'getExecution, running');
  const progressed = await hook.until((d) => d.event.type === 'execution.progress' && d.event.data.execution_id === longId, `progress of ${longId}`);
  walker.walk('ExecutionProgressEvent', progressed.event, 'webhook execution.progress');
  const cancelled = await client.cancel(longId);
  walker.walk('Execution', cancelled, 'cancel');
  assert.equal(cancelled.status, 'EXECUTION_STATUS_CANCELLED');
  assert.equal(cancelled.failure?.reason, 'cancelled');
  const again = await client.cancel(longId).catch((e) => e);
  assert.ok(again instanceof IntegrationsError);
  assert.equal(again.reason, 'ALREADY_SETTLED');
  const cancelEvent = await hook.until((d) => d.event.type === 'execution.completed' && d.event.data.execution_id === longId, `completion of ${longId}`);
  walker.walk('ExecutionCompletedEvent', cancelEvent.event, 'webhook execution.completed, cancelled');

  // List: seven executions under one key prefix, three to a page: 3 + 3 + 1, every page walked.
  const ids = new Set();
  for (let i = 0; i < 7; i++) {
    ids.add((await client.invoke(echo, { page: i }, { idempotencyKey: `${run}-page-${i}` })).execution.id);
  }
  const sizes = [];
  let last;
  for await (const page of client.executionPages({ query: `${run}-page-`, page_size: 3 })) {
    walker.walk('ListExecutionsResponse', page, `listExecutions page ${sizes.length + 1}`);
    sizes.push(page.executions.length);
    last = page;
  }
  assert.deepEqual(sizes, [3, 3, 1], 'three pages');
  assert.equal(last?.next_page_token, '');
  const listed = [];
  for await (const e of client.allExecutions({ query: `${run}-page-`, page_size: 3 })) listed.push(e.id);
  assert.deepEqual(new Set(listed), ids);
  assert.equal(listed.length, 7);

  // Timeline of the async execution.
  const timeline = await client.getTimeline(id);
  walker.walk('GetExecutionTimelineResponse', timeline, 'getTimeline');

  // Events: listed (two to a page, every page), one read with its deliveries once delivered,
  // redelivered (same id, verified again), and a redrive previewed.
  let eventPages = 0;
  for await (const page of client.eventPages({ page_size: 2 })) {
    walker.walk('ListEventsResponse', page, `listEvents page ${++eventPages}`);
    for (const ev of page.events) {
      walker.walk(ev.type === 'execution.progress' ? 'ExecutionProgressData' : 'ExecutionCompletedData', ev.data, `listEvents ${ev.type} data`);
    }
  }
  assert.ok(eventPages >= 2, `events on ${eventPages} pages`);
  const eventId = completed.id;
  const delivered = await poll(() => client.getEvent(eventId), (e) => e.status === 'EVENT_STATUS_DELIVERED' && e.deliveries.length > 0, 'the event recorded delivered');
  walker.walk('Event', delivered, 'getEvent');
  walker.walk('ExecutionCompletedData', delivered.data, 'getEvent data');
  assert.equal(delivered.execution_id, id);
  const redelivered = await client.redeliverEvent(eventId);
  walker.walk('Event', redelivered, 'redeliverEvent');
  await hook.until((d) => d.id === eventId && hook.count((x) => x.id === eventId) >= 2, `redelivery of ${eventId}`);
  const redrive = await client.redriveEvents({ validate_only: true });
  walker.walk('RedriveEventsResponse', redrive, 'redriveEvents');
  assert.equal(redrive.count, '0');

  // Every field of every schema reached was present with its type, or is listed as never sent.
  assert.deepEqual(walker.problems, [], 'answers off the document');
  const unseen = walker.unseen().filter((f) => !(f in notSent));
  assert.deepEqual(unseen, [], 'fields of the document no answer carried (add them to a scenario, or to notSent with the reason)');
  const stale = Object.keys(notSent).filter((f) => !walker.defined.has(f));
  assert.deepEqual(stale, [], 'notSent lists a field the document no longer has');
  console.log(`every-field: ${walker.defined.size} fields of ${new Set([...walker.defined].map((f) => f.split('.')[0])).size} schemas, ` +
    `${walker.seen.size} seen present, ${Object.keys(notSent).length} allowed unseen; ${walker.checks} field checks`);
});
