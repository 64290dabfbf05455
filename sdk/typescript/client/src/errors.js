// The client's errors: one class for every refusal the API answers, one for a wait that ran out.

const retryableStatuses = new Set([408, 429, 503]);

/**
 * IntegrationsError is a refusal of the API: the HTTP status and the google.rpc.Status body
 * (`{code, message, details}`), with what a program needs from the details pulled out.
 */
export class IntegrationsError extends Error {
  constructor({ status, code, message, details = [], retryAfterMs, body }) {
    super(message || `HTTP ${status}`);
    this.name = 'IntegrationsError';
    /** The HTTP status. */
    this.status = status;
    /** The gRPC code (3 INVALID_ARGUMENT, 5 NOT_FOUND, ...); for an answer that is not a Status, 0. */
    this.code = code;
    /** The details as sent, each with its `@type`. */
    this.details = details;
    /** The ErrorInfo's reason (IDEMPOTENCY_KEY_REUSED, ALREADY_SETTLED, ...), or undefined. */
    this.reason = details.find((d) => d['@type']?.endsWith('google.rpc.ErrorInfo'))?.reason;
    /** The fields a BadRequest names, as `{field, description}`. */
    this.fieldViolations = details
      .filter((d) => d['@type']?.endsWith('google.rpc.BadRequest'))
      .flatMap((d) => d.field_violations ?? d.fieldViolations ?? []);
    /** Milliseconds the server asked to wait (Retry-After, else the RetryInfo), or undefined. */
    this.retryAfterMs = retryAfterMs;
    /**
     * The execution an answer names (ErrorInfo metadata `execution_id`): with OUTCOME_PENDING,
     * the sync call whose outcome is still being recorded.
     */
    this.executionId = details.find((d) => d['@type']?.endsWith('google.rpc.ErrorInfo'))?.metadata?.execution_id;
    /**
     * Whether the same request may be sent again (with the same Idempotency-Key): 503 (an
     * outage, nothing wrong with the request), 429 (over the rate limit) and 408 (the body did
     * not arrive in time) — after retryAfterMs when given. Not OUTCOME_PENDING (a 503 too): the
     * sync call's work ran and its outcome is being recorded; read or wait for executionId
     * instead, since sending the call again without its Idempotency-Key would run the work again.
     */
    this.retryable = retryableStatuses.has(status) && this.reason !== 'OUTCOME_PENDING';
    /** The answer's body when it was not a Status (text). */
    if (body !== undefined) this.body = body;
  }
}

/** WaitTimeoutError: the execution had not settled when the wait's deadline came. */
export class WaitTimeoutError extends Error {
  constructor(executionId, last) {
    super(`execution ${executionId} had not settled by the deadline (last status ${last?.status ?? 'unknown'})`);
    this.name = 'WaitTimeoutError';
    this.executionId = executionId;
    /** The execution as last read, if it was read at all. */
    this.execution = last;
  }
}

/** retryAfterMs reads Retry-After (seconds, or an HTTP date) and else a RetryInfo's delay. */
export function retryAfterMs(headers, details = [], now = Date.now()) {
  const header = headers.get('retry-after');
  if (header) {
    if (/^\d+$/.test(header.trim())) return Number(header.trim()) * 1000;
    const at = Date.parse(header);
    if (!Number.isNaN(at)) return Math.max(0, at - now);
  }
  const info = details.find((d) => d['@type']?.endsWith('google.rpc.RetryInfo'));
  const delay = info?.retry_delay ?? info?.retryDelay;
  if (typeof delay === 'string' && /^\d+(\.\d+)?s$/.test(delay)) return Math.round(parseFloat(delay) * 1000);
  return undefined;
}

/** errorFromResponse turns a non-2xx answer into an IntegrationsError. */
export async function errorFromResponse(res) {
  const text = await res.text();
  let status;
  try {
    status = JSON.parse(text);
  } catch {
    status = undefined;
  }
  if (status && typeof status === 'object' && typeof status.message === 'string') {
    const details = Array.isArray(status.details) ? status.details : [];
    return new IntegrationsError({
      status: res.status,
      code: typeof status.code === 'number' ? status.code : 0,
      message: status.message,
      details,
      retryAfterMs: retryAfterMs(res.headers, details),
    });
  }
  return new IntegrationsError({
    status: res.status, code: 0, message: text.trim() || `HTTP ${res.status}`, details: [],
    retryAfterMs: retryAfterMs(res.headers), body: text,
  });
}
