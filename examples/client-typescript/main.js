// A client application: registers its webhook receiver, invokes a capability asynchronously,
// receives the completion event, verifies it (Standard Webhooks) and prints it.
//
//   INTEGRATIONS_URL      the gateway's REST address (default http://127.0.0.1:8080, make run's)
//   INTEGRATIONS_API_KEY  the application's API key (make run's: dev-api-key-change-me)
//   RECEIVER_ADDR         where this program listens for webhooks (default 127.0.0.1:8098)
//   CAPABILITY            the capability to invoke (default dummy.echo)
import { createServer } from 'node:http';
import { Client, verifyWebhook } from '@integrations/client';

const baseUrl = process.env.INTEGRATIONS_URL ?? 'http://127.0.0.1:8080';
const apiKey = process.env.INTEGRATIONS_API_KEY;
if (!apiKey) {
  console.error('INTEGRATIONS_API_KEY is not set (make run\'s dev application: dev-api-key-change-me)');
  process.exit(2);
}
const [host, port] = (process.env.RECEIVER_ADDR ?? '127.0.0.1:8098').split(':');
const capability = process.env.CAPABILITY ?? 'dummy.echo';
const client = new Client({ baseUrl, apiKey });

let secret = '';
let executionId = '';
let done;
const completed = new Promise((resolve) => { done = resolve; });

// The receiver: verify the raw body before anything else; answer 2xx only for what verified.
const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let event;
    try {
      event = verifyWebhook(Buffer.concat(chunks), req.headers, secret);
    } catch (err) {
      console.error(`refused a delivery: ${err.message}`);
      res.writeHead(401).end();
      return;
    }
    res.writeHead(204).end();
    // At least once: a real receiver deduplicates by event.id (the webhook-id header).
    if (event.type === 'execution.completed' && event.data.execution_id === executionId) done(event);
  });
});
await new Promise((resolve) => server.listen(Number(port), host, resolve));

const consumer = await client.setConsumer({ webhook: { url: `http://${host}:${port}/webhook` } });
secret = consumer.signing_secret;
console.log(`webhook registered: ${consumer.webhook?.url}`);

const { execution } = await client.invoke(capability, { hello: 'world' }, { idempotencyKey: `example-${Date.now()}` });
executionId = execution.id;
console.log(`invoked ${capability}: execution ${execution.id} ${execution.status}`);

const timer = setTimeout(() => { console.error('no webhook within 60 s'); process.exit(1); }, 60_000);
const event = await completed;
clearTimeout(timer);
console.log(`verified webhook ${event.id}: ${event.type} ${event.data.status}`, JSON.stringify(event.data.result ?? event.data.failure));
server.close();
