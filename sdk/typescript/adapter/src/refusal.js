// The refusal marker (docs/adapter-protocol.md §8): UNAUTHENTICATED with a google.rpc.ErrorInfo
// of domain integrations.platform, reason PLATFORM_TOKEN_REFUSED and metadata {check}, in the
// grpc-status-details-bin trailer, answered before integrations-received.
import grpc from '@grpc/grpc-js';
import { Check, TokenRefusedError } from './token.js';
import { ErrorInfo, Status, decodeStatus, errorReason, typeURL } from './proto.js';

export const REFUSAL_DOMAIN = 'integrations.platform';
export const REFUSAL_REASON = errorReason('PLATFORM_TOKEN_REFUSED');
export const REFUSAL_CHECK_KEY = 'check';
/** The trailer rich gRPC errors travel in. */
export const STATUS_DETAILS_KEY = 'grpc-status-details-bin';

/**
 * The serialized google.rpc.Status of the marker for a refused check: code 16, the message, and
 * the ErrorInfo packed in an Any. Its bytes equal the Go reference's (platformtoken.RefusalStatus).
 */
export function refusalStatusBytes(check, message) {
  const info = ErrorInfo.encode(ErrorInfo.create({
    reason: REFUSAL_REASON, domain: REFUSAL_DOMAIN, metadata: { [REFUSAL_CHECK_KEY]: check },
  })).finish();
  return Buffer.from(Status.encode(Status.create({
    code: grpc.status.UNAUTHENTICATED, message, details: [{ type_url: typeURL.ErrorInfo, value: info }],
  })).finish());
}

/**
 * The grpc-js error (a ServiceError-like object for a unary callback) that refuses a call whose
 * token was refused with err: the marker built by construction. An error that names no check is
 * reported as "invalid": whatever went wrong, the token was not accepted.
 */
export function refusalError(err) {
  const check = err instanceof TokenRefusedError ? err.check : Check.INVALID;
  const message = err instanceof TokenRefusedError ? err.message : 'platform token refused';
  const metadata = new grpc.Metadata();
  metadata.set(STATUS_DETAILS_KEY, refusalStatusBytes(check, message));
  return { code: grpc.status.UNAUTHENTICATED, details: message, metadata };
}

const checks = new Set(Object.values(Check));

/**
 * Reads the refusal marker in an adapter's error answer as the platform reads it
 * (platformtoken.ReadRefusal): statusBytes the grpc-status-details-bin value, received whether the
 * integrations-received header came first. Returns {marked, check, problem, attemptSpent}.
 */
export function readRefusal(statusBytes, received) {
  const st = decodeStatus(statusBytes);
  const info = st.errorInfos.find((i) => i.domain === REFUSAL_DOMAIN || i.reason.toUpperCase() === REFUSAL_REASON);
  const r = { marked: false, check: '', problem: '' };
  if (!info) {
    if (st.message.toUpperCase().includes(REFUSAL_REASON)) r.problem = 'no_error_info';
  } else {
    r.check = info.metadata?.[REFUSAL_CHECK_KEY] ?? '';
    if (info.domain !== REFUSAL_DOMAIN) r.problem = 'wrong_domain';
    else if (info.reason !== REFUSAL_REASON) r.problem = 'wrong_reason';
    else if (st.code !== grpc.status.UNAUTHENTICATED) r.problem = 'wrong_code';
    else if (received) r.problem = 'after_received';
    else {
      r.marked = true;
      if (r.check === '') r.problem = 'check_missing';
      else if (!checks.has(r.check)) r.problem = 'check_unknown';
    }
  }
  r.attemptSpent = !r.marked || r.check === Check.REPLAYED;
  return r;
}
