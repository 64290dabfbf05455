// Webhook verification per Standard Webhooks, with the standardwebhooks package.
import { Webhook, WebhookVerificationError } from 'standardwebhooks';

export { WebhookVerificationError };

const names = ['webhook-id', 'webhook-timestamp', 'webhook-signature'];

/** headerRecord reads the three Standard Webhooks headers from a Headers, a Node header object or a plain record. */
function headerRecord(headers) {
  const out = {};
  for (const name of names) {
    let v;
    if (typeof headers?.get === 'function') {
      v = headers.get(name);
    } else if (headers) {
      const key = Object.keys(headers).find((k) => k.toLowerCase() === name);
      v = key === undefined ? undefined : headers[key];
    }
    if (Array.isArray(v)) v = v.join(' ');
    if (typeof v === 'string') out[name] = v;
  }
  return out;
}

/**
 * verifyWebhook checks a delivery's signature, timestamp (within five minutes) and id, and answers
 * its body parsed: an execution.completed or execution.progress event. rawBody is the body exactly
 * as received (a string, Buffer or Uint8Array — never the JSON re-serialized); secrets is the
 * `whsec_…` signing secret, or several (the new and the previous one while you rotate): a
 * delivery verified by any of them is accepted. It throws WebhookVerificationError otherwise.
 */
export function verifyWebhook(rawBody, headers, secrets) {
  const list = (Array.isArray(secrets) ? secrets : [secrets]).filter(Boolean);
  if (list.length === 0) throw new TypeError('verifyWebhook: no signing secret given');
  const body = typeof rawBody === 'string' ? rawBody : Buffer.from(rawBody);
  const h = headerRecord(headers);
  let last;
  for (const secret of list) {
    try {
      return new Webhook(secret).verify(body, h);
    } catch (err) {
      last = err;
    }
  }
  throw last;
}
