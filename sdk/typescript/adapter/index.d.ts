// Types of @integrations/adapter (the package is plain JavaScript; see README.md for why).
import type { Server } from '@grpc/grpc-js';

export type JSONValue = null | boolean | number | string | JSONValue[] | { [key: string]: JSONValue };
export type JSONObject = { [key: string]: JSONValue };

/** One attempt, as a handler sees it. */
export interface Context {
  executionId: string;
  /** From 1; (executionId, attempt) is stable across redeliveries: an idempotency key. */
  attempt: number;
  capability: string;
  mode: 'async' | 'sync';
  /** When the attempt must end, on this host's clock; null if the platform set none. */
  deadline: Date | null;
  /** Aborts at the deadline, on Cancel, on shutdown, or when a renewal is refused (reason: WorkStopped). */
  signal: AbortSignal;
  log: Logger;
  /** Stores progress on the execution (work of accepted() in an async execution; a no-op otherwise). */
  reportProgress(progress: JSONObject): Promise<void>;
  /** Changes the lease the automatic renewal asks for (ms; 0: the capability's). */
  renewLease(ms: number): Promise<void>;
}

export interface Failure { readonly class: string; readonly code: string; readonly message: string; readonly retryable: boolean; readonly retryAfterMs?: number }
export interface Accepted { readonly work: Work; readonly leaseMs: number }
export type Outcome = JSONObject | Failure | Accepted;
export type Handler = (ctx: Context, payload: JSONObject) => Outcome | Promise<Outcome>;
export type Work = (ctx: Context, payload: JSONObject) => JSONObject | Failure | Promise<JSONObject | Failure>;

export declare const FailureClass: { TRANSIENT: 'transient'; PERMANENT: 'permanent'; TIMEOUT: 'timeout'; UNAVAILABLE: 'unavailable'; PROTOCOL: 'protocol' };
export declare function fail(f: { class?: string; code?: string; message?: string; retryable?: boolean; retryAfterMs?: number }): Failure;
export declare function accepted(work: Work, opts?: { leaseMs?: number }): Accepted;

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

export interface ServeOptions {
  /** Capability name → handler. */
  capabilities: Record<string, Handler>;
  /** This adapter's id in the catalog: the audience of the platform's tokens. */
  adapterId: string;
  /** The platform's public keys: raw 32 bytes, or text (base64, comma/space separated, or PEM). */
  publicKeys: Array<Uint8Array | string>;
  /** host:port to listen on (default 127.0.0.1:0). */
  address?: string;
  /** The adapter-callback service, host:port: needed for accepted() work in async executions. */
  callbackAddr?: string;
  /** The adapter's credential from the catalog, sent as `authorization: Bearer` on callbacks. */
  credential?: string;
  /** A CA file (PEM) for a callback service serving TLS; callbackTls for the system roots. */
  callbackCaFile?: string;
  callbackTls?: boolean;
  logger?: Logger;
  logLevel?: 'debug' | 'info' | 'warn' | 'error';
  /** Serves calls without checking tokens: anyone who reaches the port runs handlers. Tests only. */
  insecureSkipPlatformAuth?: boolean;
}

export interface Adapter {
  port: number;
  address: string;
  server: Server;
  /** Stops taking calls; background work may finish for graceMs (default 10 s), then is aborted. */
  close(opts?: { graceMs?: number }): Promise<void>;
}
export declare function serve(options: ServeOptions): Promise<Adapter>;

export declare class WorkStopped extends Error { why: 'cancelled' | 'attempt_gone' | 'deadline' | 'shutdown' }

// The protocol's pieces, for tests and for adapters served otherwise.
export type CheckName = 'missing' | 'key' | 'invalid' | 'audience' | 'binding' | 'replayed';
export declare const Check: { MISSING: 'missing'; KEY: 'key'; INVALID: 'invalid'; AUDIENCE: 'audience'; BINDING: 'binding'; REPLAYED: 'replayed' };
export declare class TokenRefusedError extends Error { check: CheckName }
export declare class Verifier {
  constructor(audience: string, publicKeys: Array<Uint8Array | string>, opts?: { now?: () => number });
  verify(token: string, call: { method: string; type: 'ExecuteRequest' | 'CancelRequest'; request: object }): Record<string, unknown>;
}
export declare function keyId(rawPublicKey: Uint8Array): string;
export declare function parsePublicKeys(text: string): Buffer[];
export declare function digest(type: 'ExecuteRequest' | 'CancelRequest', request: object): string;
export declare function digestInput(type: 'ExecuteRequest' | 'CancelRequest', request: object): Buffer;
export declare function decodeRequest(type: 'ExecuteRequest' | 'CancelRequest', bytes: Uint8Array): object;
export declare function refusalStatusBytes(check: CheckName, message: string): Buffer;
export declare function refusalError(err: unknown): { code: number; details: string; metadata: import('@grpc/grpc-js').Metadata };
export declare function readRefusal(statusBytes: Uint8Array, received: boolean): { marked: boolean; check: string; problem: string; attemptSpent: boolean };
export declare const TOKEN_HEADER: 'integrations-platform-token';
export declare const RECEIVED_HEADER: 'integrations-received';
