import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client, IntegrationsError, WaitTimeoutError } from '../src/index.js';
import { scriptedFetch } from './fakeserver.js';

const client = (handlers, opts = {}) => {
  const f = scriptedFetch(handlers);
  return { c: new Client({ baseUrl: 'http://gw.test/', apiKey: 'k1', fetch: f.fetch, ...opts }), calls: f.calls };
};
const exec = (status, extra = {}) => ({ id: 'x1', status, attempt: 0, attempts: [], ...extra });

test('invoke sends the mode, the payload, the key and the Idempotency-Key', async () => {
  const { c, calls } = client([{ status: 202, body: { url: '/v1/executions/x1', execution: exec('EXECUTION_STATUS_PENDING') } }]);
  const answer = await c.invoke('dummy.echo', { a: 1 }, { idempotencyKey: 'order-42' });
  assert.equal(answer.url, '/v1/executions/x1');
  assert.equal(calls[0].method, 'POST');
  assert.equal(calls[0].path, '/v1/capabilities/dummy.echo:invoke');
  assert.deepEqual(calls[0].body, { mode: 'MODE_ASYNC', payload: { a: 1 } });
  assert.equal(calls[0].headers.authorization, 'Bearer k1');
  assert.equal(calls[0].headers['idempotency-key'], 'order-42');
  assert.throws(() => c.invoke('x', {}, { mode: 'later' }), TypeError);
});

test('invoke sync says MODE_SYNC and sends no Idempotency-Key when none is given', async () => {
  const { c, calls } = client([{ body: { url: '/v1/executions/x1', execution: exec('EXECUTION_STATUS_SUCCEEDED') } }]);
  await c.invoke('dummy.echo', {}, { mode: 'sync' });
  assert.equal(calls[0].body.mode, 'MODE_SYNC');
  assert.equal('idempotency-key' in calls[0].headers, false);
});

test('allExecutions reads every page and stops at the empty next_page_token', async () => {
  const { c, calls } = client([
    { body: { executions: [exec('EXECUTION_STATUS_PENDING', { id: 'a' }), exec('EXECUTION_STATUS_PENDING', { id: 'b' })], next_page_token: 't1' } },
    { body: { executions: [exec('EXECUTION_STATUS_PENDING', { id: 'c' }), exec('EXECUTION_STATUS_PENDING', { id: 'd' })], next_page_token: 't2' } },
    { body: { executions: [exec('EXECUTION_STATUS_PENDING', { id: 'e' })], next_page_token: '' } },
  ]);
  const ids = [];
  for await (const e of c.allExecutions({ page_size: 2, status: 'EXECUTION_STATUS_PENDING' })) ids.push(e.id);
  assert.deepEqual(ids, ['a', 'b', 'c', 'd', 'e']);
  assert.deepEqual(calls.map((x) => x.query), [
    { page_size: '2', status: 'EXECUTION_STATUS_PENDING' },
    { page_size: '2', status: 'EXECUTION_STATUS_PENDING', page_token: 't1' },
    { page_size: '2', status: 'EXECUTION_STATUS_PENDING', page_token: 't2' },
  ]);
});

test('eventPages ends after an empty last page', async () => {
  const { c } = client([{ body: { events: [{ id: 'e1' }], next_page_token: 'n' } }, { body: { events: [], next_page_token: '' } }]);
  const sizes = [];
  for await (const p of c.eventPages({ execution_id: 'x1' })) sizes.push(p.events.length);
  assert.deepEqual(sizes, [1, 0]);
});

test('a refusal is an IntegrationsError with status, code, message, details, reason and fields', async () => {
  const details = [
    { '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'ALREADY_SETTLED', domain: 'integrations', metadata: { status: 'EXECUTION_STATUS_SUCCEEDED' } },
    { '@type': 'type.googleapis.com/google.rpc.BadRequest', field_violations: [{ field: 'id', description: 'settled' }] },
  ];
  const { c } = client([{ status: 400, body: { code: 9, message: 'execution is already settled', details } }]);
  const err = await c.cancel('x1').catch((e) => e);
  assert.ok(err instanceof IntegrationsError);
  assert.equal(err.status, 400);
  assert.equal(err.code, 9);
  assert.equal(err.message, 'execution is already settled');
  assert.deepEqual(err.details, details);
  assert.equal(err.reason, 'ALREADY_SETTLED');
  assert.deepEqual(err.fieldViolations, [{ field: 'id', description: 'settled' }]);
  assert.equal(err.retryable, false);
  assert.equal(err.retryAfterMs, undefined);
});

test('429 and 503 are retryable, with Retry-After (or the RetryInfo) in ms', async () => {
  const { c } = client([
    { status: 503, headers: { 'retry-after': '2' }, body: { code: 14, message: 'unavailable', details: [] } },
    { status: 429, body: { code: 8, message: 'slow down', details: [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retry_delay: '1.500s' }] } },
    { status: 401, headers: { 'content-type': 'text/plain' }, body: 'unauthorized\n' },
  ]);
  const a = await c.getExecution('x').catch((e) => e);
  assert.equal(a.retryable, true);
  assert.equal(a.retryAfterMs, 2000);
  const b = await c.getExecution('x').catch((e) => e);
  assert.equal(b.retryable, true);
  assert.equal(b.retryAfterMs, 1500);
  const d = await c.getExecution('x').catch((e) => e);
  assert.equal(d.status, 401);
  assert.equal(d.code, 0);
  assert.equal(d.message, 'unauthorized');
  assert.equal(d.retryable, false);
});

test('OUTCOME_PENDING (a 503) is not retryable: the work ran; it names the execution to wait for', async () => {
  const { c } = client([
    { status: 503, headers: { 'retry-after': '1' }, body: { code: 14, message: 'the attempt ended but its outcome is not recorded yet', details: [
      { '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'OUTCOME_PENDING', domain: 'integrations', metadata: { execution_id: 'ex-9' } },
      { '@type': 'type.googleapis.com/google.rpc.RetryInfo', retry_delay: '1s' },
    ] } },
  ]);
  const err = await c.invoke('dummy.echo', {}, { mode: 'sync' }).catch((e) => e);
  assert.equal(err.status, 503);
  assert.equal(err.reason, 'OUTCOME_PENDING');
  assert.equal(err.executionId, 'ex-9');
  assert.equal(err.retryable, false);
});

test('wait polls until settled, honouring Retry-After on a 503', async () => {
  const { c, calls } = client([
    { body: { execution: exec('EXECUTION_STATUS_PENDING') } },
    { status: 503, headers: { 'retry-after': '0' }, body: { code: 14, message: 'unavailable', details: [] } },
    { body: { execution: exec('EXECUTION_STATUS_RUNNING') } },
    { body: { execution: exec('EXECUTION_STATUS_SUCCEEDED', { result: { ok: true } }) } },
  ]);
  const e = await c.wait('x1', { initialDelayMs: 1, maxDelayMs: 2 });
  assert.equal(e.status, 'EXECUTION_STATUS_SUCCEEDED');
  assert.equal(calls.length, 4);
  assert.ok(calls.every((x) => x.path === '/v1/executions/x1'));
});

test('wait throws WaitTimeoutError with the last execution at its deadline, and a non-retryable error at once', async () => {
  const pending = () => ({ body: { execution: exec('EXECUTION_STATUS_PENDING') } });
  const { c } = client(Array.from({ length: 1000 }, pending));
  const err = await c.wait('x1', { timeoutMs: 30, initialDelayMs: 5, maxDelayMs: 5 }).catch((e) => e);
  assert.ok(err instanceof WaitTimeoutError, String(err));
  assert.equal(err.execution.status, 'EXECUTION_STATUS_PENDING');

  const { c: c2 } = client([{ status: 404, body: { code: 5, message: 'execution not found', details: [] } }]);
  const nf = await c2.wait('nope').catch((e) => e);
  assert.ok(nf instanceof IntegrationsError);
  assert.equal(nf.status, 404);
});

test('every call goes to its documented path and method', async () => {
  const ok = (body) => () => ({ body });
  const { c, calls } = client([
    ok({ entries: [] }), ok({ execution: exec('EXECUTION_STATUS_CANCELLED') }), ok({ event: { id: 'e' } }),
    ok({ event: { id: 'e' } }), ok({ count: '0' }), ok({ signing_secret: 'whsec_x' }), ok({ signing_secret: 'whsec_y' }),
  ]);
  await c.getTimeline('x1');
  await c.cancel('x1');
  await c.getEvent('e1');
  await c.redeliverEvent('e1');
  await c.redriveEvents({ validate_only: true });
  await c.setConsumer({ webhook: { url: 'https://example.com/h' } });
  await c.rotateSigningSecret();
  assert.deepEqual(calls.map((x) => `${x.method} ${x.path}`), [
    'GET /v1/executions/x1/timeline', 'POST /v1/executions/x1:cancel', 'GET /v1/events/e1',
    'POST /v1/events/e1:redeliver', 'POST /v1/events:redrive', 'PUT /v1/consumer', 'POST /v1/consumer:rotate-secret',
  ]);
  assert.deepEqual(calls[4].body, { validate_only: true });
});
