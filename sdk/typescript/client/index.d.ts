// Types of @integrations/client. The shapes are the generated ones (schema.d.ts, from the
// platform's OpenAPI document); this file only names them and declares the client over them.
import type { components, operations, paths, webhooks } from './schema.js';

export type { components, operations, paths, webhooks };

type S = components['schemas'];
export type Execution = S['Execution'];
export type Attempt = S['Attempt'];
export type Failure = S['Failure'];
export type ExecutionStatus = S['ExecutionStatus'];
export type Mode = S['Mode'];
export type InvokeCapabilityResponse = S['InvokeCapabilityResponse'];
export type ListExecutionsResponse = S['ListExecutionsResponse'];
export type GetExecutionTimelineResponse = S['GetExecutionTimelineResponse'];
export type TimelineEntry = S['TimelineEntry'];
export type Event = S['Event'];
export type EventStatus = S['EventStatus'];
export type DeliveryAttempt = S['DeliveryAttempt'];
export type ListEventsResponse = S['ListEventsResponse'];
export type RedriveEventsRequest = S['RedriveEventsRequest'];
export type RedriveEventsResponse = S['RedriveEventsResponse'];
export type SetConsumerRequest = S['SetConsumerRequest'];
export type SetConsumerResponse = S['SetConsumerResponse'];
export type RotateSigningSecretResponse = S['RotateSigningSecretResponse'];
export type Status = S['Status'];
/** A refusal's google.rpc.ErrorInfo detail. */
export type ErrorInfo = S['ErrorInfo'];
/**
 * Every reason an ErrorInfo carries, with when it is sent and whether to retry (the proto enum
 * integrations.errors.v1.ErrorReason, through the OpenAPI document).
 */
export type ErrorReason = S['ErrorReason'];
/** An execution.completed event's data (Event.execution_completed, a webhook body's data). */
export type ExecutionCompletedData = S['ExecutionCompletedData'];
/** An execution.progress event's data (Event.execution_progress, a webhook body's data). */
export type ExecutionProgressData = S['ExecutionProgressData'];
export type ExecutionCompletedEvent = S['ExecutionCompletedEvent'];
export type ExecutionProgressEvent = S['ExecutionProgressEvent'];
/** A webhook body: what verifyWebhook answers. Switch on `type`. */
export type WebhookEvent = ExecutionCompletedEvent | ExecutionProgressEvent;

/** The query of GET /v1/executions (page_token is handled by the iterators). */
export type ListExecutionsQuery = NonNullable<operations['listExecutions']['parameters']['query']>;
/** The query of GET /v1/events. */
export type ListEventsQuery = NonNullable<operations['listEvents']['parameters']['query']>;

export interface ClientOptions {
  /** The gateway's REST address, e.g. http://127.0.0.1:8080. */
  baseUrl: string;
  /** The application's API key (sent as `Authorization: Bearer`). */
  apiKey: string;
  /** A fetch to use instead of the global one (tests, proxies). */
  fetch?: typeof fetch;
  /** Each call's own deadline; default 30 000 ms. */
  timeoutMs?: number;
  /** Headers sent with every call (e.g. a User-Agent). */
  headers?: Record<string, string>;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export interface InvokeOptions extends CallOptions {
  /** 'async' (default): answered at once, 202, pending; 'sync': one attempt inline, answered settled. */
  mode?: 'async' | 'sync' | 'MODE_ASYNC' | 'MODE_SYNC';
  /** Sent as the Idempotency-Key header: printable ASCII, no spaces, at most 255 bytes. */
  idempotencyKey?: string;
}

export interface WaitOptions extends CallOptions {
  /** Give up (WaitTimeoutError) after this long; default 60 000 ms. */
  timeoutMs?: number;
  /** The first pause between polls; default 100 ms, then ×1.5. */
  initialDelayMs?: number;
  /** The longest pause between polls; default 2 000 ms. A Retry-After is honoured instead. */
  maxDelayMs?: number;
}

/** Client calls the platform's REST API as one application. */
export declare class Client {
  constructor(options: ClientOptions);
  readonly baseUrl: string;
  /** Starts an execution; async answers it pending (with the url to read it at), sync settled. */
  invoke(capability: string, payload?: Record<string, unknown>, options?: InvokeOptions): Promise<InvokeCapabilityResponse>;
  /** Polls GET /v1/executions/{id} with backoff until the execution settles. */
  wait(id: string, options?: WaitOptions): Promise<Execution>;
  /** invoke (async) then wait. */
  invokeAndWait(capability: string, payload?: Record<string, unknown>, options?: WaitOptions & { idempotencyKey?: string }): Promise<Execution>;
  getExecution(id: string, options?: CallOptions): Promise<Execution>;
  /** One page, newest first, without payload, result or progress. */
  listExecutions(query?: ListExecutionsQuery, options?: CallOptions): Promise<ListExecutionsResponse>;
  /** Every page, until the one whose next_page_token is empty. */
  executionPages(query?: ListExecutionsQuery, options?: CallOptions): AsyncIterableIterator<ListExecutionsResponse>;
  /** Every execution the query matches, across pages. */
  allExecutions(query?: ListExecutionsQuery, options?: CallOptions): AsyncIterableIterator<Execution>;
  getTimeline(id: string, options?: CallOptions): Promise<GetExecutionTimelineResponse>;
  /** Settles a pending or running execution cancelled; a settled one is refused (400, reason ALREADY_SETTLED). */
  cancel(id: string, options?: CallOptions): Promise<Execution>;
  listEvents(query?: ListEventsQuery, options?: CallOptions): Promise<ListEventsResponse>;
  eventPages(query?: ListEventsQuery, options?: CallOptions): AsyncIterableIterator<ListEventsResponse>;
  allEvents(query?: ListEventsQuery, options?: CallOptions): AsyncIterableIterator<Event>;
  getEvent(id: string, options?: CallOptions): Promise<Event>;
  redeliverEvent(id: string, options?: CallOptions): Promise<Event>;
  redriveEvents(body?: RedriveEventsRequest, options?: CallOptions): Promise<RedriveEventsResponse>;
  /** Registers the application's webhook (or gRPC consumer); answers the signing secret. */
  setConsumer(consumer: SetConsumerRequest, options?: CallOptions): Promise<SetConsumerResponse>;
  rotateSigningSecret(options?: CallOptions): Promise<RotateSigningSecretResponse>;
  /** Any other call: answers the JSON body, throws IntegrationsError on a non-2xx answer. */
  request<T = unknown>(method: string, path: string, init?: { query?: Record<string, unknown>; body?: unknown; headers?: Record<string, string>; signal?: AbortSignal }): Promise<T>;
}

/** Whether the execution has reached its final status (succeeded, failed or cancelled). */
export declare function isSettled(execution: Pick<Execution, 'status'> | undefined): boolean;

/** A refusal of the API: its HTTP status and google.rpc.Status. */
export declare class IntegrationsError extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** The gRPC code (3 INVALID_ARGUMENT, 5 NOT_FOUND, 16 UNAUTHENTICATED, ...); 0 when the body was not a Status. */
  readonly code: number;
  readonly details: S['Any'][];
  /**
   * The ErrorInfo's reason (IDEMPOTENCY_KEY_REUSED, ALREADY_SETTLED, ...), one of ErrorReason (a
   * newer platform may send one this version does not list: then read the status and code).
   */
  readonly reason: ErrorReason | undefined;
  /** The fields a BadRequest names. */
  readonly fieldViolations: { field: string; description: string }[];
  /** How long the server asked to wait (Retry-After, or the RetryInfo), in ms. */
  readonly retryAfterMs: number | undefined;
  /** The execution the answer names (ErrorInfo metadata execution_id): with OUTCOME_PENDING, the sync call's. */
  readonly executionId: string | undefined;
  /**
   * 503, 429 and 408: send the same request again (same Idempotency-Key), after retryAfterMs.
   * Not OUTCOME_PENDING: the sync call's work ran; wait for executionId instead.
   */
  readonly retryable: boolean;
  /** The answer's text when it was not a Status. */
  readonly body?: string;
}

/** The wait's deadline came before the execution settled. */
export declare class WaitTimeoutError extends Error {
  readonly executionId: string;
  readonly execution: Execution | undefined;
}

/** The delivery's signature, timestamp or headers did not verify. */
export declare class WebhookVerificationError extends Error {}

/** Header containers verifyWebhook reads the Standard Webhooks headers from. */
export type WebhookHeaders =
  | { get(name: string): string | null }
  | Record<string, string | string[] | undefined>;

/**
 * Verifies a delivery (signature, timestamp within 5 minutes) with the standardwebhooks package
 * and answers its parsed body. rawBody must be the bytes as received. secrets: the `whsec_…`
 * secret, or several while rotating (any one verifying is enough).
 */
export declare function verifyWebhook(rawBody: string | Uint8Array, headers: WebhookHeaders, secrets: string | string[]): WebhookEvent;
