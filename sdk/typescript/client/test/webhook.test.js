// verifyWebhook against deliveries signed here with the standardwebhooks library itself.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { verifyWebhook, WebhookVerificationError } from '../src/index.js';

const newSecret = () => 'whsec_' + randomBytes(24).toString('base64');
const body = JSON.stringify({
  id: '0190c9e8-0000-7000-8000-000000000001', type: 'execution.completed', timestamp: '2026-01-01T00:00:00Z',
  data: { execution_id: '0190c9e8-0000-7000-8000-000000000002', capability: 'dummy.echo', mode: 'async', status: 'succeeded', attempt: 1, sequence: 1, result: { hello: 'world' } },
});

function signed(secrets, { at = new Date(), id = 'msg_1', payload = body } = {}) {
  const sigs = secrets.map((s) => new Webhook(s).sign(id, at, payload));
  return { 'webhook-id': id, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': sigs.join(' ') };
}

test('a delivery signed with the secret verifies and answers the typed event', () => {
  const secret = newSecret();
  const event = verifyWebhook(body, signed([secret]), secret);
  assert.equal(event.type, 'execution.completed');
  assert.equal(event.data.status, 'succeeded');
  assert.deepEqual(event.data.result, { hello: 'world' });
});

test('the headers may be a Headers, Node header object with any case, and the body a Buffer', () => {
  const secret = newSecret();
  const h = signed([secret]);
  assert.equal(verifyWebhook(Buffer.from(body), new Headers(h), secret).type, 'execution.completed');
  const node = Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toUpperCase(), v]));
  assert.equal(verifyWebhook(new TextEncoder().encode(body), node, secret).type, 'execution.completed');
});

test('during a rotation: two signatures in the header, or two secrets on the receiver', () => {
  const previous = newSecret();
  const next = newSecret();
  assert.ok(verifyWebhook(body, signed([next, previous]), previous));
  assert.ok(verifyWebhook(body, signed([next, previous]), next));
  assert.ok(verifyWebhook(body, signed([previous]), [next, previous]));
});

test('a wrong secret, a changed body, an old timestamp or a missing header is refused', () => {
  const secret = newSecret();
  assert.throws(() => verifyWebhook(body, signed([newSecret()]), secret), WebhookVerificationError);
  assert.throws(() => verifyWebhook(body.replace('succeeded', 'failed'), signed([secret]), secret), WebhookVerificationError);
  assert.throws(() => verifyWebhook(body, signed([secret], { at: new Date(Date.now() - 10 * 60_000) }), secret), WebhookVerificationError);
  const h = signed([secret]);
  delete h['webhook-signature'];
  assert.throws(() => verifyWebhook(body, h, secret), WebhookVerificationError);
  assert.throws(() => verifyWebhook(body, signed([secret]), []), TypeError);
});
