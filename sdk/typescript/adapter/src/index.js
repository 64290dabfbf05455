// @integrations/adapter: write an adapter for the integrations platform (docs/adapter-protocol.md).
export { serve, accepted, fail, FailureClass, SdkCode, WorkStopped, Callbacks, renewLoop, deliver, attemptGone,
  jsonLogger, RECEIVED_HEADER, EXECUTE_METHOD, CANCEL_METHOD, DEFAULT_LEASE_MS } from './server.js';
export { Verifier, TokenRefusedError, Check, keyId, parsePublicKeys, TOKEN_HEADER, ISSUER } from './token.js';
export { digest, digestInput, DIGEST_DOMAIN } from './digest.js';
export { refusalError, refusalStatusBytes, readRefusal, REFUSAL_DOMAIN, REFUSAL_REASON, STATUS_DETAILS_KEY } from './refusal.js';
export { report, classify, Verdict, DELIVER_FLOOR_MS } from './outcome.js';
export { decodeRequest } from './proto.js';
