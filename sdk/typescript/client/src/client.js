// The REST client: one method per call of the API, each a few lines over fetch.
import { setTimeout as sleep } from 'node:timers/promises';
import { errorFromResponse, IntegrationsError, WaitTimeoutError } from './errors.js';

const settled = new Set(['EXECUTION_STATUS_SUCCEEDED', 'EXECUTION_STATUS_FAILED', 'EXECUTION_STATUS_CANCELLED']);

/** isSettled says whether an execution has reached its final status. */
export function isSettled(execution) {
  return settled.has(execution?.status);
}

const modes = { async: 'MODE_ASYNC', sync: 'MODE_SYNC', MODE_ASYNC: 'MODE_ASYNC', MODE_SYNC: 'MODE_SYNC' };

/** Client calls the platform's REST API as one application (its API key). */
export class Client {
  /**
   * @param {{baseUrl: string, apiKey: string, fetch?: typeof fetch, timeoutMs?: number, headers?: Record<string,string>}} options
   */
  constructor({ baseUrl, apiKey, fetch: fetchImpl = globalThis.fetch, timeoutMs = 30_000, headers = {} }) {
    if (!baseUrl) throw new TypeError('Client: baseUrl is required (e.g. http://127.0.0.1:8080)');
    if (!apiKey) throw new TypeError('Client: apiKey is required');
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.apiKey = apiKey;
    this.fetch = fetchImpl;
    this.timeoutMs = timeoutMs;
    this.headers = headers;
  }

  /** request sends one call and answers its JSON body; a non-2xx answer throws IntegrationsError. */
  async request(method, path, { query, body, headers = {}, signal } = {}) {
    let url = this.baseUrl + path;
    if (query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) {
        if (v !== undefined && v !== null && v !== '') q.set(k, v instanceof Date ? v.toISOString() : String(v));
      }
      const s = q.toString();
      if (s) url += '?' + s;
    }
    const timeout = AbortSignal.timeout(this.timeoutMs);
    const res = await this.fetch(url, {
      method,
      headers: {
        ...this.headers,
        ...headers,
        authorization: `Bearer ${this.apiKey}`,
        accept: 'application/json',
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
    });
    if (!res.ok) throw await errorFromResponse(res);
    const text = await res.text();
    try {
      return text ? JSON.parse(text) : {};
    } catch {
      throw new IntegrationsError({ status: res.status, code: 0, message: `${method} ${path}: the answer is not JSON`, body: text });
    }
  }

  /**
   * invoke starts an execution of a capability. mode 'async' (the default) answers at once (202)
   * with the execution pending; 'sync' runs one attempt and answers the settled execution.
   * idempotencyKey makes the call safe to repeat: the same key and request answer the same
   * execution.
   */
  invoke(capability, payload = {}, { mode = 'async', idempotencyKey, signal } = {}) {
    const m = modes[mode];
    if (!m) throw new TypeError(`invoke: mode must be 'async' or 'sync', not ${JSON.stringify(mode)}`);
    return this.request('POST', `/v1/capabilities/${encodeURIComponent(capability)}:invoke`, {
      body: { mode: m, payload },
      headers: idempotencyKey === undefined ? {} : { 'idempotency-key': idempotencyKey },
      signal,
    });
  }

  /**
   * wait polls the execution until it has settled and answers it. Polls back off from
   * initialDelayMs by ×1.5 to maxDelayMs; a 429/503/408 answer waits its Retry-After instead;
   * after timeoutMs it throws WaitTimeoutError (with the execution as last read).
   */
  async wait(id, { timeoutMs = 60_000, initialDelayMs = 100, maxDelayMs = 2_000, signal } = {}) {
    const deadline = Date.now() + timeoutMs;
    let delay = initialDelayMs;
    let last;
    for (;;) {
      let pause = delay;
      try {
        last = await this.getExecution(id, { signal });
        if (isSettled(last)) return last;
        delay = Math.min(maxDelayMs, delay * 1.5);
      } catch (err) {
        if (!(err instanceof IntegrationsError) || !err.retryable) throw err;
        pause = err.retryAfterMs ?? delay;
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new WaitTimeoutError(id, last);
      await sleep(Math.min(pause, left), undefined, { signal });
    }
  }

  /** invokeAndWait invokes asynchronously and waits for the execution to settle. */
  async invokeAndWait(capability, payload, { idempotencyKey, signal, ...waitOptions } = {}) {
    const { execution } = await this.invoke(capability, payload, { mode: 'async', idempotencyKey, signal });
    return this.wait(execution.id, { ...waitOptions, signal });
  }

  /** getExecution reads one execution with its attempts, payload, result and progress. */
  async getExecution(id, { signal } = {}) {
    return unwrap(await this.request('GET', `/v1/executions/${encodeURIComponent(id)}`, { signal }), 'execution');
  }

  /** listExecutions reads one page of executions, newest first. */
  listExecutions(query = {}, { signal } = {}) {
    return this.request('GET', '/v1/executions', { query, signal });
  }

  /** executionPages iterates over every page of executions (the last has an empty next_page_token). */
  executionPages(query = {}, options = {}) {
    return pages((q) => this.listExecutions(q, options), query);
  }

  /** allExecutions iterates over every execution the query matches, across pages. */
  async *allExecutions(query = {}, options = {}) {
    for await (const page of this.executionPages(query, options)) yield* page.executions;
  }

  /** getTimeline answers what happened to the execution, oldest first. */
  getTimeline(id, { signal } = {}) {
    return this.request('GET', `/v1/executions/${encodeURIComponent(id)}/timeline`, { signal });
  }

  /** cancel settles a pending or running execution cancelled and answers it; a settled one throws (400, ALREADY_SETTLED). */
  async cancel(id, { signal } = {}) {
    return unwrap(await this.request('POST', `/v1/executions/${encodeURIComponent(id)}:cancel`, { body: {}, signal }), 'execution');
  }

  /** listEvents reads one page of the application's events, newest first. */
  listEvents(query = {}, { signal } = {}) {
    return this.request('GET', '/v1/events', { query, signal });
  }

  /** eventPages iterates over every page of events. */
  eventPages(query = {}, options = {}) {
    return pages((q) => this.listEvents(q, options), query);
  }

  /** allEvents iterates over every event the query matches, across pages. */
  async *allEvents(query = {}, options = {}) {
    for await (const page of this.eventPages(query, options)) yield* page.events;
  }

  /** getEvent reads one event with its delivery attempts. */
  async getEvent(id, { signal } = {}) {
    return unwrap(await this.request('GET', `/v1/events/${encodeURIComponent(id)}`, { signal }), 'event');
  }

  /** redeliverEvent delivers an event again (same id; receivers deduplicate) and answers it. */
  async redeliverEvent(id, { signal } = {}) {
    return unwrap(await this.request('POST', `/v1/events/${encodeURIComponent(id)}:redeliver`, { body: {}, signal }), 'event');
  }

  /** redriveEvents redelivers every dead event (created since, when given); validate_only previews. */
  redriveEvents(body = {}, { signal } = {}) {
    return this.request('POST', '/v1/events:redrive', { body, signal });
  }

  /**
   * setConsumer registers where the application's events go — `{webhook: {url}}` or
   * `{grpc: {target}}` — and answers the registration with its signing_secret.
   */
  setConsumer(consumer, { signal } = {}) {
    return this.request('PUT', '/v1/consumer', { body: consumer, signal });
  }

  /** rotateSigningSecret answers a new signing_secret; the previous one signs too until previous_secret_expire_time. */
  rotateSigningSecret({ signal } = {}) {
    return this.request('POST', '/v1/consumer:rotate-secret', { body: {}, signal });
  }
}

function unwrap(answer, key) {
  if (!answer || typeof answer !== 'object' || !(key in answer)) {
    throw new IntegrationsError({ status: 200, code: 0, message: `the answer has no ${key}`, body: JSON.stringify(answer) });
  }
  return answer[key];
}

async function* pages(list, query) {
  let token = query.page_token;
  for (;;) {
    const page = await list({ ...query, page_token: token });
    yield page;
    token = page.next_page_token;
    if (!token) return;
  }
}
