// Compiled by test/typecheck.test.js with tsc --noEmit: what a TypeScript user writes against the
// package must type-check with the generated types (a field renamed in the document breaks here).
import {
  Client, IntegrationsError, isSettled, verifyWebhook, type ErrorReason, type Execution, type ExecutionCompletedData,
  type ExecutionProgressData, type WebhookEvent,
} from '../index.js';

export async function usage(baseUrl: string, apiKey: string, body: string, headers: Headers, secret: string) {
  const client = new Client({ baseUrl, apiKey });
  const { execution, url } = await client.invoke('dummy.echo', { hello: 'world' }, { idempotencyKey: 'order-42' });
  const id: string = execution.id;
  const attempt: number = execution.attempt;
  const location: string = url;
  const settled: Execution = await client.wait(id, { timeoutMs: 10_000 });
  if (isSettled(settled) && settled.status === 'EXECUTION_STATUS_SUCCEEDED') {
    const result: Record<string, unknown> | undefined = settled.result;
    void result;
  }
  const failureReason: string | undefined = settled.failure?.reason;
  for await (const e of client.allExecutions({ page_size: 10, status: 'EXECUTION_STATUS_FAILED' })) {
    const when: string = e.create_time;
    void when;
  }
  const page = await client.listExecutions({ page_size: 3 });
  const next: string = page.next_page_token;
  const timeline = await client.getTimeline(id);
  const kinds: string[] = timeline.entries.map((entry) => entry.kind);
  for await (const ev of client.allEvents({ execution_id: id })) {
    const delivered: string | undefined = ev.delivered_time;
    void delivered;
  }
  const ev = await client.getEvent('e');
  const codes: number[] = ev.deliveries.map((d) => d.status_code);
  const completed: ExecutionCompletedData | undefined = ev.execution_completed;
  const settledAs: 'succeeded' | 'failed' | 'cancelled' | undefined = completed?.status;
  const progressData: ExecutionProgressData | undefined = ev.execution_progress;
  void settledAs;
  void progressData;
  const { signing_secret } = await client.setConsumer({ webhook: { url: 'https://example.com/hook' } });
  const rotated = await client.rotateSigningSecret();
  const until: string | undefined = rotated.previous_secret_expire_time;
  const { count } = await client.redriveEvents({ validate_only: true });
  const n: string = count;
  try {
    await client.cancel(id);
  } catch (err) {
    if (err instanceof IntegrationsError && err.retryable) {
      const ms: number | undefined = err.retryAfterMs;
      void ms;
    }
    if (err instanceof IntegrationsError && err.reason === 'ALREADY_SETTLED') {
      const reason: ErrorReason = err.reason;
      void reason;
    }
  }
  const event: WebhookEvent = verifyWebhook(body, headers, [signing_secret, secret]);
  if (event.type === 'execution.completed') {
    const status: 'succeeded' | 'failed' | 'cancelled' = event.data.status;
    void status;
  } else {
    const progress: Record<string, unknown> = event.data.progress;
    void progress;
  }
  return [attempt, location, failureReason, next, kinds, codes, until, n];
}
